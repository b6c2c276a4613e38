"""The packages of the distribution, the one thing pyproject.toml cannot declare: ``packages.find`` cannot
be combined with folders mapped into another package's namespace. The repository keeps ``migrations/``,
``ui/`` and ``systemd/`` at its top; the wheel installs them as ``scrinalia._migrations``, ``scrinalia._ui``
and ``scrinalia._systemd``, so site-packages gains only ``scrinalia`` and ``runner`` (decision 0150), with
every file of those folders (the panel's vendored libraries and their licences included). The metadata is
in pyproject.toml."""
from setuptools import find_namespace_packages, setup
from setuptools.command.build_py import build_py


BUNDLED = {"scrinalia._migrations": "migrations", "scrinalia._ui": "ui", "scrinalia._systemd": "systemd"}

NOT_CODE = ["*.__pycache__", "*.__pycache__.*", "__pycache__", "__pycache__.*"]

# The scale model of the runner: the deterministic simulator and the in-memory ledger it (and the phase tests)
# run against. A development install has them (`python -m runner.simulation`); a production host does not
# need them, nor their dependency greenlet, so the wheel leaves them out (decision 0310).
SCALE_MODEL_PACKAGES = ["runner.simulation", "runner.simulation.*", "runner.memory_ledger", "runner.memory_ledger.*"]
SCALE_MODEL_MODULES: set[tuple[str, str]] = set()  # none left outside those packages


class BuildWithoutScaleModel(build_py):
    """``build_py`` that leaves out the scale model's modules: setuptools can exclude a package, not a module."""

    def find_package_modules(self, package: str, package_dir: str) -> list[tuple[str, str, str]]:
        modules = super().find_package_modules(package, package_dir)
        return [m for m in modules if (m[0], m[1]) not in SCALE_MODEL_MODULES]


def bundled_packages() -> list[str]:
    """Each mapped folder and its sub-folders (``scrinalia._ui.js.views``): setuptools ships a folder's
    files only for a package it is told of."""
    packages = []
    for package, folder in BUNDLED.items():
        packages.append(package)
        packages.extend(f"{package}.{sub}" for sub in find_namespace_packages(where=folder, exclude=NOT_CODE))
    return packages


# The code's own data files: SQL, the demo collection, JSON schemas.
CODE_DATA = ["*.sql", "*.json", "*.jsonl", "*.csv"]

setup(
    packages=[
        *find_namespace_packages(include=["scrinalia", "scrinalia.*", "runner", "runner.*"],
                                 exclude=NOT_CODE + SCALE_MODEL_PACKAGES),
        *bundled_packages(),
    ],
    package_dir=BUNDLED,
    package_data={"": CODE_DATA, **{package: ["*"] for package in bundled_packages()}},
    exclude_package_data={"": ["*.pyc"]},
    cmdclass={"build_py": BuildWithoutScaleModel},
)
