"""docs/configuration.md is the one reference of every setting: it cannot drift from the code.

Every field of the settings classes (as its environment variable), every flag of ``scrinalia-runner daemon``
and of ``scrinalia install-units``, and every ``SCRINALIA_*`` variable named in the code has a row there;
each row of a settings field states the field's default.
"""
from __future__ import annotations

import re
from pathlib import Path

import click
import pytest
from pydantic_settings import BaseSettings

from runner.cli import daemon_command
from scrinalia.api.settings import ApiSettings
from scrinalia.cli.install_units import command as install_units_command
from scrinalia.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "configuration.md").read_text()


def _rows() -> dict[str, str]:
    """The first cell's first backquoted name -> the whole row."""
    rows: dict[str, str] = {}
    for line in DOC.splitlines():
        match = re.match(r"\|\s*`([^`]+)`", line)
        if match:
            rows.setdefault(match.group(1).split()[0].split("=")[0], line)
    return rows


def _variables(settings: type[BaseSettings]) -> dict[str, object]:
    prefix = settings.model_config.get("env_prefix", "") or ""
    return {(prefix + name).upper(): field.default for name, field in settings.model_fields.items()}


def _shown(default: object) -> str | None:
    """How the doc writes a default: `true`, `60`, `strict`; None where the row says it in words."""
    if default is None or default == "":
        return None
    if isinstance(default, bool):
        return str(default).lower()
    if isinstance(default, float):
        return f"{default:g}"
    return str(default)


@pytest.mark.parametrize("settings", [Settings, ApiSettings], ids=lambda s: s.__name__)
def test_every_settings_field_has_a_row_with_its_default(settings: type[BaseSettings]) -> None:
    rows = _rows()
    for variable, default in _variables(settings).items():
        assert variable in rows, f"{variable} has no row in docs/configuration.md"
        shown = _shown(default)
        if shown is not None:
            assert f"`{shown}`" in rows[variable], f"the row of {variable} does not show its default {shown!r}"


@pytest.mark.parametrize("command", [daemon_command, install_units_command], ids=lambda c: c.name)
def test_every_flag_has_a_row(command: click.Command) -> None:
    rows = _rows()
    for param in command.params:
        if isinstance(param, click.Option):
            for flag in param.opts:
                assert flag in rows, f"{command.name} {flag} has no row in docs/configuration.md"
        else:
            assert (param.name or "").upper() in rows, f"{command.name} {param.name} has no row"


def test_every_scrinalia_variable_of_the_code_has_a_row() -> None:
    named = set()
    for path in [*(ROOT / "scrinalia").rglob("*.py"), *(ROOT / "runner").rglob("*.py")]:
        named |= set(re.findall(r"\bSCRINALIA_[A-Z_]+[A-Z]\b", path.read_text()))
    assert len(named) >= 5  # the search finds what it looks for
    rows = _rows()
    missing = sorted(v for v in named if v not in rows)
    assert not missing, f"named in the code, without a row in docs/configuration.md: {missing}"
