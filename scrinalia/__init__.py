"""Scrinalia: an archive of described documents enriched by AI workers.

The ledger table ``archive_worker_runs`` is the queue; see ``scrinalia.domains.archive.ledger``.
"""
from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("scrinalia-runner")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0+unknown"
