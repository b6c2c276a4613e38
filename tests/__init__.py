"""The test suite as a package, so its modules import as ``tests.runner.*`` and never shadow the product
package ``runner`` (pytest puts the repository root, not tests/, on sys.path)."""
