"""The ledger port's two adapters side by side: statements per second of one runner's protocol cycle.

One cycle is what a runner sends for one short run: enqueue (the API's), claim_next, record_start, three
heartbeats with progress, record_progress, one batch (register_fence + COMMIT), expire_leases, finish:
11 statements. The same cycles run through ``PostgresLedger`` (a fresh database on a PostgreSQL with its
default durability, bench/_pg.py; the clock is the server's) and through ``InMemoryLedger`` (a virtual
clock moved 1 s per heartbeat), interleaved in rounds (ABAB...) so both see the same load. The in-memory
figure is what bounds the deterministic simulator's speed on the ledger's side.

Run:  .venv/bin/python bench/bench_ledger_adapters.py [--cycles 400] [--rounds 4]
"""
from __future__ import annotations

import argparse
import json
import socket
import sys
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

from scrinalia.domains.archive.ledger import FinishParams, StartParams

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._pg import bench_database
from runner.ledger_port import LedgerPort
from runner.memory_ledger import MemoryDatabase
from runner.pg_ledger import PostgresLedger
from scrinalia.db.engine import create_engine_from_url
from scrinalia.domains.archive.registry import RunnerRegistration

WORKERS = [f"w{i}" for i in range(8)]
STATEMENTS_PER_CYCLE = 11


def _register(port: LedgerPort) -> uuid.UUID:
    runner_id = uuid.uuid4()
    port.register(RunnerRegistration(
        runner_id=runner_id, name="bench", hostname=socket.gethostname(), pid=1, package_version="bench",
        schema_revision=None, capabilities=WORKERS, concurrency=1, heartbeat_seconds=5, lease_seconds=30))
    return runner_id


def _cycles(port: LedgerPort, runner_id: uuid.UUID, n: int, tick: Callable[[], None]) -> float:
    """Seconds for ``n`` cycles."""
    started = time.perf_counter()
    for i in range(n):
        port.enqueue(WORKERS[i % len(WORKERS)], {})
        run = port.claim_next(runner_id, WORKERS, 30)
        assert run is not None
        port.record_start(run.run_id, runner_id, StartParams(engine_name=None, preset=None, config={"db_batch_size": 8},
                          options={}))
        for beat in range(3):
            tick()
            port.heartbeat(runner_id, 30, progress={run.run_id: {"done": beat, "total": 3}})
        port.record_progress(runner_id, {run.run_id: {"done": 3, "total": 3}})
        batch = port.begin_batch(run.run_id, runner_id)
        assert batch.register_fence()
        batch.commit()
        port.expire_leases()
        assert port.finish(run.run_id, runner_id, FinishParams("SUCCESS")) is not None
    return time.perf_counter() - started


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cycles", type=int, default=400, help="cycles per adapter per round")
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()

    virtual = [datetime(2026, 12, 1, tzinfo=UTC)]

    def advance() -> None:
        virtual[0] += timedelta(seconds=1)

    memory = MemoryDatabase(lambda: virtual[0], elapse=lambda s: None).session(lock_timeout_s=4.0)
    memory_runner = _register(memory)
    with bench_database("adapters") as url:
        engine = create_engine_from_url(url, pool_size=2, max_overflow=2)
        postgres = PostgresLedger(engine)
        postgres_runner = _register(postgres)
        seconds = {"postgres": 0.0, "memory": 0.0}
        for _ in range(args.rounds):
            seconds["postgres"] += _cycles(postgres, postgres_runner, args.cycles, lambda: None)
            seconds["memory"] += _cycles(memory, memory_runner, args.cycles, advance)
        engine.dispose()
    statements = args.rounds * args.cycles * STATEMENTS_PER_CYCLE
    rate = {k: statements / v for k, v in seconds.items()}
    print(json.dumps({
        "cycles": args.rounds * args.cycles, "statements": statements,
        "statements_per_second": {k: round(v) for k, v in rate.items()},
        "memory_over_postgres": round(rate["memory"] / rate["postgres"], 1),
    }, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
