"""The built wheel carries what an installed API and runner need beside the code, under scrinalia's name."""
from __future__ import annotations

import tarfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _names(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as zf:
        return set(zf.namelist())


def test_the_wheel_ships_migrations_panel_units_demo_and_entry_points(built_dist):
    names = _names(built_dist.wheel)
    with zipfile.ZipFile(built_dist.wheel) as zf:
        entry_points = next(zf.read(n).decode() for n in names if n.endswith("entry_points.txt"))
    for required in ("scrinalia/_migrations/env.py", "scrinalia/_migrations/script.py.mako",
                     "scrinalia/_migrations/versions/0001_initial.py",
                     "scrinalia/_ui/index.html", "scrinalia/_ui/css/panel.css", "scrinalia/_ui/js/app.js",
                     "scrinalia/_ui/js/views/runs.js",
                     "scrinalia/_systemd/scrinalia-api.service", "scrinalia/_systemd/scrinalia-runner.service",
                     "scrinalia/_systemd/scrinalia-scheduler.service", "scrinalia/_systemd/scrinalia.env",
                     "scrinalia/_systemd/runner.env",
                     "scrinalia/domains/archive/demo/collection.jsonl"):
        assert required in names, required
    assert "scrinalia-runner = runner.cli:main" in entry_points
    assert "[scrinalia.workers]" in entry_points and "embedding" in entry_points


def test_the_wheel_adds_only_scrinalia_and_runner_to_site_packages(built_dist):
    """No generic ``migrations`` or ``ui`` beside them (it would collide with another project's)."""
    tops = {name.split("/")[0] for name in _names(built_dist.wheel)}
    assert tops == {"scrinalia", "runner", built_dist.wheel.name.split("-py3")[0] + ".dist-info"}, tops
    assert not any(n.startswith("tests/") for n in _names(built_dist.wheel))


def test_every_file_of_the_repository_folders_is_in_the_wheel(built_dist):
    """Each migration, panel file and template of the checkout ships: a new file type or sub-folder that
    the package-data globs miss fails here, not on an operator's host."""
    names = _names(built_dist.wheel)
    for folder, package in (("migrations", "scrinalia/_migrations"), ("ui", "scrinalia/_ui"),
                            ("systemd", "scrinalia/_systemd")):
        for path in (ROOT / folder).rglob("*"):
            if path.is_file() and "__pycache__" not in path.parts:
                assert f"{package}/{path.relative_to(ROOT / folder)}" in names, path


def test_the_sdist_rebuilds_the_wheel(built_dist):
    """The sdist holds setup.py and the mapped folders (the wheel above was built from it)."""
    with tarfile.open(built_dist.sdist) as tf:
        names = {name.split("/", 1)[1] for name in tf.getnames() if "/" in name}
    for required in ("setup.py", "pyproject.toml", "MANIFEST.in", "migrations/env.py", "ui/index.html",
                     "systemd/scrinalia-runner.service", "docs/install.md", "docs/configuration.md"):
        assert required in names, required


def test_the_wheel_carries_no_scale_model_and_no_greenlet(built_dist):
    """The simulator and its in-memory ledger are development tools (decision 0310): a production host installs
    neither them nor greenlet, which only the simulator needs."""
    names = _names(built_dist.wheel)
    assert not any(n.startswith("runner/simulation/") for n in names), sorted(n for n in names if "simulation" in n)
    assert not any(n.startswith("runner/memory_ledger") for n in names)
    assert "runner/supervisor.py" in names
    assert "scrinalia/domains/archive/queries.sql" in names  # the statements' one home (decision 0350)
    with zipfile.ZipFile(built_dist.wheel) as zf:
        metadata = next(zf.read(n).decode() for n in names if n.endswith(".dist-info/METADATA"))
    requires = [line for line in metadata.splitlines() if line.startswith("Requires-Dist:")]
    runtime = [line for line in requires if "extra ==" not in line]
    assert runtime and not any("greenlet" in line for line in runtime), runtime
