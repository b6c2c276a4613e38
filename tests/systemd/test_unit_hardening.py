"""The units as ``scrinalia install-units`` writes them, scored by ``systemd-analyze security --offline=true``:
the command an institution's security review runs. API and scheduler at <= 2.0, the runner at <= 3.5 (it
keeps the GPU's device nodes and writable-executable memory); docs/install.md records the same scores.
Whether each option still lets the service work is proven under a real systemd (tests/systemd/test_deployed.py).
"""
from __future__ import annotations

import grp
import pwd
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: The exposure each unit must not exceed (the issue's bar: a network service hardened as systemd advises).
CEILING = {"api": 2.0, "scheduler": 2.0, "runner": 3.5}
OVERALL = re.compile(r"Overall exposure level for scrinalia-(\w+)\.service: (\d+\.\d)")
DOC_SCORE = re.compile(r"^\| `scrinalia-(\w+)\.service` \| (\d+\.\d) ", re.MULTILINE)


def _written_units(root: Path) -> Path:
    """The three units written by the installed command into ``root``, for a system user that is not root
    (as docs/install.md makes one; ``daemon`` stands in for it: the score asks only that it is neither root
    nor nobody)."""
    service_user = pwd.getpwnam("daemon")
    group = grp.getgrgid(service_user.pw_gid).gr_name
    proc = subprocess.run([str(Path(sys.prefix) / "bin" / "scrinalia"), "install-units", "api", "scheduler",
                           "runner", "--user", service_user.pw_name, "--group", group, "--root", str(root)],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return root / "etc" / "systemd" / "system"


def exposure_scores(unit_dir: Path) -> dict[str, float]:
    """Each unit's overall exposure as ``systemd-analyze security --offline=true`` prints it."""
    analyze = shutil.which("systemd-analyze")
    assert analyze, "systemd-analyze is missing (Debian package systemd)"
    scores: dict[str, float] = {}
    for unit in CEILING:
        proc = subprocess.run([analyze, "security", "--offline=true", "--no-pager",
                               str(unit_dir / f"scrinalia-{unit}.service")],
                              capture_output=True, text=True, timeout=60)
        found = OVERALL.search(proc.stdout + proc.stderr)
        assert found, proc.stdout[-2000:] + proc.stderr[-2000:]
        scores[found.group(1)] = float(found.group(2))
    return scores


@pytest.fixture(scope="module")
def scores(tmp_path_factory: pytest.TempPathFactory) -> dict[str, float]:
    return exposure_scores(_written_units(tmp_path_factory.mktemp("units")))


@pytest.mark.parametrize("unit", sorted(CEILING))
def test_written_unit_is_hardened(scores: dict[str, float], unit: str) -> None:
    assert scores[unit] <= CEILING[unit], f"scrinalia-{unit}.service exposure {scores[unit]} > {CEILING[unit]}"


def test_install_guide_records_the_scores_measured(scores: dict[str, float]) -> None:
    """docs/install.md's table is what the command prints today, not what it printed once."""
    recorded = {unit: float(score) for unit, score in DOC_SCORE.findall((ROOT / "docs" / "install.md").read_text())}
    assert recorded == scores
