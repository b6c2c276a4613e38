"""The built wheel carries what an installed API and runner need beside the code."""
from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_wheel_ships_migrations_panel_demo_and_entry_points(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(tmp_path), str(ROOT)], check=True, capture_output=True, timeout=300)
    (wheel,) = tmp_path.glob("scrinalia_runner-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        entry_points = next(zf.read(n).decode() for n in names if n.endswith("entry_points.txt"))
    for required in ("migrations/env.py", "migrations/script.py.mako", "migrations/versions/0001_initial.py",
                     "ui/index.html", "ui/css/panel.css", "ui/js/app.js",
                     "scrinalia/domains/archive/demo/collection.jsonl"):
        assert required in names, required
    assert "scrinalia-runner = runner.cli:main" in entry_points
    assert "[scrinalia.workers]" in entry_points and "embedding" in entry_points
    assert not any(n.startswith("tests/") for n in names)
