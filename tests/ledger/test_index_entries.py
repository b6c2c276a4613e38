"""Which indexes a run's writes enter: each entry is WAL of every cycle, and most of what a cycle writes
(issue 29: 17 B-tree entries of ~2,030 B at 2,000 runs of history). Read from the WAL itself
(pg_walinspect): the B-tree leaf insertions of this database's run indexes between two positions."""
from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Callable

from sqlalchemy import Engine, text

from scrinalia.domains.archive import ledger
from scrinalia.domains.archive.ledger import FinishParams
from tests.ledger.helpers import register_runner

#: A leaf gets its tuple in one of these records (a split carries the new tuple with it).
LEAF_INSERTS = ("INSERT_LEAF", "INSERT_POST", "SPLIT_L", "SPLIT_R")

ENTRIES = text(
    r"""
    SELECT c.relname, count(*) AS n
      FROM pg_get_wal_records_info(CAST(:start AS pg_lsn), CAST(:end AS pg_lsn)) r
     CROSS JOIN LATERAL regexp_match(r.block_ref, 'rel \d+/(\d+)/(\d+)') AS ref(parts)
      JOIN pg_class c ON c.relfilenode = ref.parts[2]::oid
     WHERE r.resource_manager = 'Btree' AND r.record_type = ANY(:types)
       AND ref.parts[1]::oid = (SELECT oid FROM pg_database WHERE datname = current_database())
       AND c.oid IN (SELECT indexrelid FROM pg_index WHERE indrelid = 'archive_worker_runs'::regclass)
     GROUP BY c.relname
    """
)


def _entries(engine: Engine, cycles: int, step: Callable[[], None]) -> dict[str, float]:
    """The index entries per cycle of ``cycles`` calls of ``step``."""
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("CREATE EXTENSION IF NOT EXISTS pg_walinspect"))
        start = conn.execute(text("SELECT pg_current_wal_insert_lsn()")).scalar_one()
    for _ in range(cycles):
        step()
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        end = conn.execute(text("SELECT pg_current_wal_insert_lsn()")).scalar_one()
        # pg_walinspect reads only flushed WAL, and the test clusters run with fsync off, which leaves the
        # flush position at the last segment's end: a switch puts it past ``end``.
        conn.execute(text("SELECT pg_switch_wal()"))
    with engine.connect() as conn:
        found = conn.execute(ENTRIES, {"start": start, "end": end, "types": list(LEAF_INSERTS)})
        counts = Counter({row.relname: row.n for row in found})
    return {name: n / cycles for name, n in sorted(counts.items())}


def _cycle(engine: Engine, runner_id: uuid.UUID, worker: str, ending: FinishParams) -> None:
    ledger.enqueue(engine, worker, {})
    run = ledger.claim_next(engine, runner_id, [worker], 60)
    assert run is not None
    ledger.finish(engine, run.run_id, runner_id, ending)


def test_a_successful_run_enters_no_status_index_but_the_slot(engine):
    worker = f"entries-{uuid.uuid4().hex[:6]}"
    runner_id = register_runner(engine, [worker])
    per_cycle = _entries(engine, 20, lambda: _cycle(engine, runner_id, worker, FinishParams("SUCCESS")))
    assert per_cycle == {
        "archive_worker_runs_pkey": 3,  # the insert, the claim, the finish: none is a HOT update
        "archive_worker_runs_run_id_key": 3,
        "ix_worker_runs_worker_id": 3,
        "uq_worker_run_active": 2,  # QUEUED, RUNNING: the slot, which the claim and a status list read
        "ix_worker_runs_runner": 1,  # RUNNING
        "ix_worker_runs_worker_finished": 1,  # the finish
        "ix_worker_runs_runner_finished": 1,
    }, per_cycle


def test_a_rare_ending_enters_the_endings_index_once(engine):
    worker = f"entries-{uuid.uuid4().hex[:6]}"
    runner_id = register_runner(engine, [worker])
    cancelled = FinishParams("CANCELLED", exit_reason="cancelled")
    per_cycle = _entries(engine, 10, lambda: _cycle(engine, runner_id, worker, cancelled))
    assert per_cycle.get("ix_worker_runs_ending_id") == 1, per_cycle
