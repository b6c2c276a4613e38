"""Where the files that ship beside the code are: the migrations, the panel, the systemd templates.

The repository keeps them in top-level folders (``migrations/``, ``ui/``, ``systemd/``); the wheel installs
them under this package (``scrinalia/_migrations``, ``scrinalia/_ui``, ``scrinalia/_systemd``: setup.py
maps the folders there), so an installed distribution adds no generic top-level name such as
``migrations`` to site-packages (decision 0150). Each lookup takes the installed folder when it exists,
else the checkout's folder beside this package (an editable install, or the repository on PYTHONPATH).
"""
from __future__ import annotations

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
CHECKOUT_DIR = PACKAGE_DIR.parent


class BundledFilesMissing(RuntimeError):
    """Neither the installed folder nor the checkout's exists: a broken installation."""


def _bundled(installed: str, checkout: str) -> Path:
    for candidate in (PACKAGE_DIR / installed, CHECKOUT_DIR / checkout):
        if candidate.is_dir():
            return candidate
    raise BundledFilesMissing(
        f"neither {PACKAGE_DIR / installed} (installed) nor {CHECKOUT_DIR / checkout} (a checkout) exists; "
        "reinstall the scrinalia-runner wheel"
    )


def migrations_dir() -> Path:
    """The alembic script directory (env.py, script.py.mako, versions/)."""
    return _bundled("_migrations", "migrations")


def ui_dir() -> Path:
    """The panel's static files (index.html, css/, js/)."""
    return _bundled("_ui", "ui")


def systemd_dir() -> Path:
    """The unit files and env-file templates that ``scrinalia install-units`` fills in."""
    return _bundled("_systemd", "systemd")
