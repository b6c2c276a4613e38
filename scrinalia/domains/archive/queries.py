"""The ledger protocol's named queries: ``queries.sql`` read once, each statement under its one name.

``queries.sql`` is a list of blocks, each ``-- name: <name>``, ``-- fence: <what makes it safe>``, optional
comment lines, then one SQL statement (Procrastinate's ``sql/queries.sql`` is the model). The functions of
``ledger``, ``registry``, ``worker_settings`` and the SDK's resolver send them (``QUERIES[name].text(...)``);
the in-memory ledger (``runner.memory_ledger``) has one method per name; ``docs/protocol.md`` lists them;
``tests/ledger/test_named_queries.py`` holds the four together.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import TextClause, text

QUERIES_FILE = Path(__file__).with_name("queries.sql")

_NAME = re.compile(r"^-- name: ([a-z_]+)\s*$")
_FENCE = re.compile(r"^-- fence: (.+?)\s*$")
_PLACEHOLDER = re.compile(r"\{([a-z_]+)\}")


@dataclass(frozen=True, slots=True)
class Query:
    """One named statement: its SQL (placeholders ``{run_columns}``... not filled yet) and its fence."""

    name: str
    fence: str
    sql: str

    def text(self, **fill: str) -> TextClause:
        """The statement, its placeholders filled by the module that owns those shapes (every one named)."""
        wanted = set(_PLACEHOLDER.findall(self.sql))
        if wanted != set(fill):
            raise ValueError(f"query {self.name!r} needs {sorted(wanted)}, was given {sorted(fill)}")
        return text(_PLACEHOLDER.sub(lambda m: fill[m.group(1)], self.sql))


def parse(source: str) -> dict[str, Query]:
    """The blocks of ``source`` by name, in the file's order; a block without a fence, a name given
    twice or a block without SQL is a ``ValueError``."""
    queries: dict[str, Query] = {}
    for name, lines in _blocks(source):
        if name in queries:
            raise ValueError(f"query {name!r}: a name once")
        queries[name] = _query(name, lines)
    return queries


def _blocks(source: str) -> list[tuple[str, list[str]]]:
    """Each ``-- name:`` line with the lines after it, up to the next one (what comes first is the
    file's header)."""
    blocks: list[tuple[str, list[str]]] = []
    for line in source.splitlines():
        named = _NAME.match(line)
        if named:
            blocks.append((named.group(1), []))
        elif blocks:
            blocks[-1][1].append(line)
    return blocks


def _query(name: str, lines: list[str]) -> Query:
    fences = [m.group(1) for m in map(_FENCE.match, lines) if m]
    sql = "\n".join(line for line in lines if not line.startswith("--")).strip()
    if len(fences) != 1 or not sql:
        raise ValueError(f"query {name!r}: one '-- fence:' line and one statement")
    return Query(name, fences[0], sql)


QUERIES: dict[str, Query] = parse(QUERIES_FILE.read_text(encoding="utf-8"))
