"""Each batch's write is a function of that batch (ruff B023).

The document workers used to build their per-batch write as a closure over the loop's variables
(``rows``, ``params``, ``updates``...): correct only as long as ``ctx.commit`` calls it before the loop
moves on. These tests keep every write a worker hands to ``commit`` and call them once the run is over
(again, in a transaction that is rolled back, or for the first time): each must write its own batch, not
the last one.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from sqlalchemy import Connection, Engine, text

from scrinalia.domains.archive import ledger
from scrinalia.domains.archive.workers import cleaning, quality
from scrinalia.domains.archive.workers.sdk import LocalChannel, RunContext, WorkerSpec
from tests.workers.helpers import insert_docs, register_runner

BATCHES = (2, 2, 1)  # five documents, db_batch_size 2: the last batch differs from the others


class KeepsWrites(RunContext):
    """A RunContext that remembers every write it committed."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.kept: list[Callable[[Connection], Any]] = []

    def commit(self, write):
        self.kept.append(write)
        return super().commit(write)


class DefersWrites(KeepsWrites):
    """A RunContext that commits nothing during the run: the test runs the kept writes afterwards."""

    def commit(self, write):
        self.kept.append(write)
        return 0, 0  # cleaning's (written, changed)


def _run(engine: Engine, spec: WorkerSpec, context: type[KeepsWrites] = KeepsWrites) -> KeepsWrites:
    request = {"db_batch_size": max(BATCHES)}
    runner_id = register_runner(engine, [spec.name])
    run = ledger.create_running(engine, spec.name, request, runner_id=runner_id, lease_seconds=60)
    ctx = context(run, spec.resolve(engine, request), engine, LocalChannel(), spec=spec)
    spec.run(ctx)
    assert len(ctx.kept) == len(BATCHES), ctx.kept
    return ctx


def _again(engine: Engine, ctx: KeepsWrites) -> list[Any]:
    with engine.connect() as conn:
        out = [write(conn) for write in ctx.kept]
        conn.rollback()
    return out


def _documents(engine: Engine) -> None:
    # All-capitals titles with two spaces: every document is flagged by quality and rewritten by cleaning.
    insert_docs(engine, [{"reference_code": f"B{i}", "title": f"LETTERS  OF THE COUNCIL {i}"}
                         for i in range(sum(BATCHES))])


def test_each_quality_write_flags_its_own_batch(engine):
    _documents(engine)
    ctx = _run(engine, quality.SPEC)
    assert [w["anomalies"] for w in _again(engine, ctx)] == list(BATCHES)


def test_each_cleaning_write_rewrites_its_own_batch(engine):
    _documents(engine)
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO archive_cleaning_rules (name, kind, field, pattern, replacement) "
                          "VALUES ('spaces', 'REWRITE', 'title', '\\s{2,}', ' ')"))
    ctx = _run(engine, cleaning.SPEC, DefersWrites)
    with engine.begin() as conn:
        written = [write(conn)[0] for write in ctx.kept]
    assert written == list(BATCHES)
    with engine.connect() as conn:
        titles = set(conn.execute(text("SELECT title FROM archive_documents")).scalars())
    assert titles == {f"LETTERS OF THE COUNCIL {i}" for i in range(sum(BATCHES))}
