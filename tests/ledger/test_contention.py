"""No double claim: many claimers on separate connections race for the same queue."""
from __future__ import annotations

import threading
from collections import Counter

from sqlalchemy import text

from scrinalia.db.engine import create_engine_from_url
from scrinalia.domains.archive import ledger
from tests.ledger.helpers import register_runner

CLAIMERS = 8
WORKERS = 520


def test_every_row_is_claimed_exactly_once_under_contention(database_url, engine):
    names = [f"w{i:03d}" for i in range(WORKERS)]
    with engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO archive_worker_runs (worker_name, trigger, request) "
                "SELECT name, 'API', '{}'::jsonb FROM unnest(CAST(:names AS text[])) AS name"
            ),
            {"names": names + ["nobody-runs-me"]},
        )
    # Each claimer advertises a different, overlapping half of the workers, so capabilities matter.
    capabilities = [[n for i, n in enumerate(names) if (i + c) % 4 < 2] for c in range(CLAIMERS)]
    runners = [register_runner(engine, caps, name=f"claimer-{c}") for c, caps in enumerate(capabilities)]
    claimed: list[list[tuple[str, str]]] = [[] for _ in range(CLAIMERS)]
    barrier = threading.Barrier(CLAIMERS)
    errors: list[BaseException] = []

    def claimer(index: int) -> None:
        own = create_engine_from_url(database_url, pool_size=1, max_overflow=0)
        try:
            barrier.wait()
            while (run := ledger.claim_next(own, runners[index], capabilities[index], 60)) is not None:
                claimed[index].append((str(run.run_id), run.worker_name))
        except BaseException as exc:  # surfaced below: a thread must not swallow a failure
            errors.append(exc)
        finally:
            own.dispose()

    threads = [threading.Thread(target=claimer, args=(i,)) for i in range(CLAIMERS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors

    all_claims = [run_id for per in claimed for run_id, _ in per]
    assert len(all_claims) == WORKERS
    assert max(Counter(all_claims).values()) == 1
    for index, per in enumerate(claimed):
        assert all(worker in capabilities[index] for _, worker in per)
    assert sum(1 for per in claimed if per) > 1, "the race never happened: one claimer took everything"

    with engine.connect() as conn:
        rows = conn.execute(text("SELECT run_id::text, runner_id, status FROM archive_worker_runs")).all()
    by_run = {r.run_id: r for r in rows}
    for index, per in enumerate(claimed):
        for run_id, _ in per:
            assert by_run[run_id].status == "RUNNING" and by_run[run_id].runner_id == runners[index]
    leftovers = [r for r in rows if r.status == "QUEUED"]
    assert len(leftovers) == 1
