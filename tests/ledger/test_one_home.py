"""One home per fact of the protocol: what a frozen migration must write as a literal is held equal to the
ledger module's constant, and no file but the named queries (``queries.sql``) writes runs.

No database: these read the source.
"""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path
from types import ModuleType

from scrinalia.domains.archive import ledger

ROOT = Path(__file__).resolve().parents[2]


def _migration(name: str) -> ModuleType:
    path = ROOT / "migrations" / "versions" / name
    spec = importlib.util.spec_from_file_location(f"migration_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_fence_sqlstate_of_migration_0008_is_the_ledgers() -> None:
    fence = _migration("0008_batch_fence_at_commit.py")
    assert fence.FENCE_SQLSTATE == ledger.BATCH_FENCE_SQLSTATE
    assert f"ERRCODE = '{ledger.BATCH_FENCE_SQLSTATE}'" in fence.UPGRADE


def test_the_fence_lock_timeout_of_migration_0008_is_the_ledgers() -> None:
    fence = _migration("0008_batch_fence_at_commit.py")
    (literal,) = re.findall(r"SET lock_timeout = '(\d+)s'", fence.UPGRADE)
    assert float(literal) == ledger.BATCH_FENCE_LOCK_TIMEOUT_S


def test_the_fence_sqlstate_is_written_in_one_python_module() -> None:
    homes = sorted(
        str(path.relative_to(ROOT)) for tree in ("scrinalia", "runner") for path in (ROOT / tree).rglob("*.py")
        if re.search(r"""["']SF001["']""", path.read_text())
    )
    assert homes == ["scrinalia/domains/archive/ledger.py"]


def test_every_statement_that_writes_runs_lives_in_the_named_queries() -> None:
    writes = re.compile(r"(INSERT\s+INTO|UPDATE|DELETE\s+FROM)\s+archive_worker_runs\b", re.IGNORECASE)
    homes = sorted(
        str(path.relative_to(ROOT)) for tree in ("scrinalia", "runner") for pattern in ("*.py", "*.sql")
        for path in (ROOT / tree).rglob(pattern) if writes.search(path.read_text())
    )
    assert homes == ["scrinalia/domains/archive/queries.sql"]
