"""The distribution as ``make dist`` builds it, once per test session (the packaging tests share it)."""
from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class BuiltDist:
    wheel: Path
    sdist: Path


@pytest.fixture(scope="session")
def built_dist(tmp_path_factory: pytest.TempPathFactory) -> BuiltDist:
    """``python -m build`` as ``make dist`` runs it (without isolation: the dev venv has setuptools): the
    sdist first, then the wheel built from the unpacked sdist, so a file the sdist forgets is missing here."""
    out = tmp_path_factory.mktemp("dist")
    proc = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(ROOT)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (wheel,) = out.glob("scrinalia_runner-*.whl")
    (sdist,) = out.glob("scrinalia_runner-*.tar.gz")
    return BuiltDist(wheel=wheel, sdist=sdist)
