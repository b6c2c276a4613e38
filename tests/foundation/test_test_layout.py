"""The test package ``tests/runner`` must not shadow the product package ``runner``.

Without ``tests/__init__.py`` pytest's default import mode put ``tests/`` on ``sys.path`` and imported
``tests/runner`` as ``runner``; only the editable install's import hook hid it. These tests collect the
runner's tests with the repository on ``PYTHONPATH`` and no editable install (``python -S`` skips the
``.pth`` file that installs its hook; the site-packages directory is put on the path by hand).
"""
from __future__ import annotations

import os
import site
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _without_editable_install() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *site.getsitepackages()])
    return env


def test_the_environment_has_no_editable_install(tmp_path: Path) -> None:
    """Run from elsewhere, the same environment cannot import the product: the check below means something."""
    env = _without_editable_install()
    env["PYTHONPATH"] = os.pathsep.join(site.getsitepackages())
    proc = subprocess.run([sys.executable, "-S", "-c", "import runner.supervisor"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0, proc.stdout
    assert "ModuleNotFoundError" in proc.stderr


def test_runner_tests_collect_with_the_repository_on_pythonpath() -> None:
    proc = subprocess.run(
        [sys.executable, "-S", "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "tests/runner"],
        cwd=ROOT, env=_without_editable_install(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "tests/runner/test_units.py::" in proc.stdout
    assert " collected" in proc.stdout


def test_the_longest_first_files_exist() -> None:
    """tests/conftest.py schedules these files first: a renamed one would silently lose its place."""
    from tests.conftest import LONGEST_FIRST

    missing = [path for path in LONGEST_FIRST if not (ROOT / path).is_file()]
    assert not missing, missing
    assert len(set(LONGEST_FIRST)) == len(LONGEST_FIRST)
