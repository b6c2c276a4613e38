"""Every time quantity in one derivation (decision 0131): the table in docs/architecture.md is the
code's (``Timings.rows``), and ``status`` shows the effective values."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from runner.options import RunnerOptions

DOC = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"


def _doc_rows() -> dict[str, tuple[str, str]]:
    rows = {}
    for line in DOC.read_text().splitlines():
        m = re.match(r"^\| `([a-z_]+)` \| (.+?) \| (.+?) \| .+ \|$", line)
        if m:
            rows[m.group(1)] = (m.group(2), m.group(3))
    return rows


def test_the_architecture_table_lists_every_quantity_with_its_formula_and_default():
    documented = _doc_rows()
    timings = RunnerOptions(name="x").validate().timings
    for row in timings.rows():
        assert row.name in documented, f"{row.name} is not in docs/architecture.md's timing table"
        formula, default = documented[row.name]
        assert formula == row.formula, (row.name, formula, row.formula)
        assert default == ("-" if row.seconds is None else f"{row.seconds:g}"), (row.name, default, row.seconds)


@pytest.mark.parametrize("heartbeat, lease", [(15, 60), (1, 4), (0.5, 2.5), (5, 12)])
def test_the_derived_bounds_keep_their_relations(heartbeat, lease):
    t = RunnerOptions(name="x", heartbeat_seconds=heartbeat, lease_seconds=lease).validate().timings
    assert t.heartbeat + 2 * t.statement_seconds <= t.lease - t.fence_margin + 1e-9  # a retry before the fence
    assert t.server_statement_seconds < t.statement_seconds  # the server says blocked first
    assert t.connect_seconds <= t.statement_seconds and t.expiry_seconds < t.lease
    values = t.to_json()
    assert values["fence_margin"]["seconds"] == t.fence_margin and values["lease"]["seconds"] == lease


def test_the_architecture_table_has_no_quantity_the_code_lacks():
    names = [row.name for row in RunnerOptions(name="x").validate().timings.rows()]
    assert list(_doc_rows()) == names  # the same quantities, in the order ``status`` shows them


def test_the_architecture_names_every_runner_module():
    """docs/architecture.md, "Where to look", names each module of runner/ and of runner/simulation/."""
    text = DOC.read_text()
    where = text[text.index("## Where to look"):]
    runner = DOC.parents[1] / "runner"
    for module in sorted(runner.glob("*.py")):
        if module.name != "__init__.py":
            assert f"`runner/{module.name}`" in where, f"runner/{module.name} is not in docs/architecture.md"
    (simulation,) = [line for line in where.splitlines() if line.startswith("| `runner/simulation/` |")]
    for module in sorted((runner / "simulation").glob("*.py")):
        if module.name != "__init__.py":
            assert f"`{module.stem}`" in simulation, f"runner/simulation/{module.name} is not in docs/architecture.md"
