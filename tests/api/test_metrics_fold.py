"""The finished-run totals folded in at the scrape (migration 0018, decision 0370) and the oldest xmin holder
(decision 0371), against a real PostgreSQL: the counters stay the ledger's own count before, during and after
a fold; a fold never passes a writer still in progress; a REPEATABLE READ session shows in /metrics."""
from __future__ import annotations

import uuid
from typing import Any

from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import text

from scrinalia.domains.archive import ledger
from tests.api.conftest import make_app
from tests.ledger.helpers import register_runner

TOKEN = "metrics-token-for-the-test-0123456789"
BOUNDS_SQL = "SELECT archive_run_duration_bounds()"


def _scrape(engine) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with TestClient(make_app(engine, metrics_token=TOKEN)) as client:
        r = client.get("/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 200, r.text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(r.text) for s in f.samples}


def _counted(engine) -> dict[Any, Any]:
    """What the counters must say, counted from the ledger itself (the trigger of 0016's definition: every
    run in a final status; timed when it started; cumulative buckets of its duration)."""
    with engine.connect() as conn:
        bounds = list(conn.execute(text(BOUNDS_SQL)).scalar_one())
        rows = conn.execute(text("SELECT worker_name, status::text AS status, started_at IS NOT NULL AS started, "
                                 "duration_ms FROM archive_worker_runs WHERE status NOT IN ('QUEUED', 'RUNNING')"))
        out: dict[Any, Any] = {}
        for r in rows:
            key = ("scrinalia_runs_finished_total", (("status", r.status), ("worker", r.worker_name)))
            out[key] = out.get(key, 0) + 1
            if r.started:
                seconds = r.duration_ms / 1000.0
                for name, labels, add in (
                        ("scrinalia_run_duration_seconds_count", (("worker", r.worker_name),), 1),
                        ("scrinalia_run_duration_seconds_sum", (("worker", r.worker_name),), seconds)):
                    out[(name, labels)] = out.get((name, labels), 0) + add
                for b in bounds:
                    key = ("scrinalia_run_duration_seconds_bucket", (("le", f"{float(b)}"), ("worker", r.worker_name)))
                    out[key] = out.get(key, 0) + (1 if seconds <= b else 0)
    return out


def _assert_counters_are_the_ledgers(engine, samples) -> None:
    for key, value in _counted(engine).items():
        assert abs(samples.get(key, -1) - value) < 1e-6, (key, samples.get(key), value)


def _end_runs(engine, runner, worker: str) -> None:
    """One run of each way to end: finish (two outcomes), a QUEUED cancel, a lease expiry."""
    for status in ("SUCCESS", "FAILED"):
        ledger.enqueue(engine, worker, {})
        run = ledger.claim_next(engine, runner, [worker], 60)
        assert run is not None
        failed = status == "FAILED"
        ledger.finish(engine, run.run_id, runner, ledger.FinishParams(
            status, error="RuntimeError: x" if failed else None, exit_reason="exception" if failed else None))
    ledger.enqueue(engine, worker, {})
    ledger.request_cancel(engine, ledger.active_run(engine, worker).run_id)
    ledger.enqueue(engine, worker, {})
    expiring = ledger.claim_next(engine, runner, [worker], 60)
    with engine.begin() as conn:
        conn.execute(text("UPDATE archive_worker_runs SET lease_expires_at = now() - interval '1 second' "
                          "WHERE run_id = :r"), {"r": expiring.run_id})
    assert len(ledger.expire_leases(engine)) == 1


#: A runner's registration and ``_end_runs``' four endings as the code of 0017's time wrote them: head's
#: statements use the tables of migrations 0022 and 0023, which a schema at 0017 does not have.
_AT_0017 = {
    "register": "INSERT INTO archive_worker_runners (runner_id, name, kind, hostname, pid, package_version, "
                "capabilities, concurrency, heartbeat_seconds, lease_seconds, started_at, last_heartbeat_at) "
                "VALUES (:runner, 'test-runner', 'daemon', 'test', 1, 'test', ARRAY['alpha', 'beta'], 1, 15, 60, "
                "now(), now())",
    "enqueue": "INSERT INTO archive_worker_runs (worker_name, trigger, request) VALUES (:w, 'API', '{}') "
               "RETURNING run_id",
    "claim": "UPDATE archive_worker_runs SET status = 'RUNNING', runner_id = :runner, started_at = now(), "
             "heartbeat_at = now(), lease_expires_at = now() + interval '60 seconds' WHERE run_id = :r",
    "finish": "UPDATE archive_worker_runs SET status = CAST(:status AS worker_run_status), finished_at = now(), "
              "duration_ms = 0, exit_reason = :reason WHERE run_id = :r",
}


def _end_runs_at_0017(engine, runner, worker: str) -> None:
    """SUCCESS and FAILED by a finish, a QUEUED run CANCELLED, a RUNNING one INTERRUPTED by its lease."""
    for status, reason, claimed in (("SUCCESS", None, True), ("FAILED", "exception", True),
                                    ("CANCELLED", "cancelled", False), ("INTERRUPTED", "lease-lost", True)):
        with engine.begin() as conn:
            run_id = conn.execute(text(_AT_0017["enqueue"]), {"w": worker}).scalar_one()
            if claimed:
                conn.execute(text(_AT_0017["claim"]), {"runner": runner, "r": run_id})
            conn.execute(text(_AT_0017["finish"]), {"status": status, "reason": reason, "r": run_id})


def _backdate(engine, minutes: int) -> None:
    """Runs that ended ``minutes`` ago, as if the test had waited (and the watermark further back still)."""
    with engine.begin() as conn:
        conn.execute(text("UPDATE archive_worker_runs SET finished_at = finished_at - make_interval(mins => :m), "
                          "started_at = started_at - make_interval(mins => :m), "
                          "queued_at = queued_at - make_interval(mins => :m) WHERE finished_at IS NOT NULL"),
                     {"m": minutes})
        conn.execute(text("UPDATE archive_run_totals_watermark "
                          "SET folded_before = LEAST(folded_before, now() - make_interval(mins => :m + 60))"),
                     {"m": minutes})


def _totals_table(engine) -> dict[tuple[str, str], int]:
    with engine.connect() as conn:
        return {(r.worker_name, r.status): r.runs for r in conn.execute(text(
            "SELECT worker_name, status::text AS status, runs FROM archive_run_totals WHERE runs > 0"))}


def test_a_finish_writes_no_totals_and_the_scrape_folds_them_with_the_same_counters(engine):
    runner = register_runner(engine, ["alpha", "beta"], lease=60)
    _end_runs(engine, runner, "alpha")
    _end_runs(engine, runner, "beta")
    assert _totals_table(engine) == {}, "a run's end writes nothing to the totals"
    _assert_counters_are_the_ledgers(engine, _scrape(engine))  # the delta since the watermark
    assert _totals_table(engine) == {}, "runs ended within the fold's margin stay in the delta"

    _backdate(engine, 30)  # now older than the horizon (now() - 10 min): the next scrape folds them
    _end_runs(engine, runner, "alpha")  # and these stay in the delta
    samples = _scrape(engine)
    _assert_counters_are_the_ledgers(engine, samples)
    folded = _totals_table(engine)
    assert folded == {("alpha", "SUCCESS"): 1, ("alpha", "FAILED"): 1, ("alpha", "CANCELLED"): 1,
                      ("alpha", "INTERRUPTED"): 1, ("beta", "SUCCESS"): 1, ("beta", "FAILED"): 1,
                      ("beta", "CANCELLED"): 1, ("beta", "INTERRUPTED"): 1}
    assert samples[("scrinalia_runs_finished_total", (("status", "SUCCESS"), ("worker", "alpha")))] == 2
    # A second scrape folds nothing more and says the same.
    _assert_counters_are_the_ledgers(engine, _scrape(engine))
    assert _totals_table(engine) == folded


def test_a_fold_is_bounded_per_worker_and_the_next_one_goes_on(engine):
    runner = register_runner(engine, ["alpha"], lease=60)
    for _ in range(3):
        _end_runs(engine, runner, "alpha")
    _backdate(engine, 30)
    with engine.connect() as conn:
        conn.execute(text("SELECT archive_run_totals_fold(5)"))
        conn.commit()
        assert conn.execute(text("SELECT sum(runs) FROM archive_run_totals")).scalar_one() == 5
        conn.execute(text("SELECT archive_run_totals_fold(5)"))
        conn.commit()
        assert conn.execute(text("SELECT sum(runs) FROM archive_run_totals")).scalar_one() == 10
        conn.execute(text("SELECT archive_run_totals_fold(5)"))
        conn.commit()
        assert conn.execute(text("SELECT sum(runs) FROM archive_run_totals")).scalar_one() == 12
    _assert_counters_are_the_ledgers(engine, _scrape(engine))


def test_a_fold_never_passes_a_writer_still_in_progress(engine):
    """A run's end is dated from its transaction's start (``finished_at = now()``). A transaction that ends a
    run and commits after a fold must still be counted: the fold's horizon stops at the start of every
    transaction holding an id. Folded here with no margin, so the writer is the only guard."""
    runner = register_runner(engine, ["alpha", "beta"], lease=60)
    ledger.enqueue(engine, "alpha", {})
    slow = ledger.claim_next(engine, runner, ["alpha"], 60)
    with engine.connect() as writer:  # ends alpha's run in a transaction it keeps open
        writer.execute(text("UPDATE archive_worker_runs SET status = 'SUCCESS', finished_at = now(), "
                            "duration_ms = 5 WHERE run_id = :r"), {"r": slow.run_id})
        started = writer.execute(text("SELECT now()")).scalar_one()
        _end_runs(engine, runner, "beta")  # ended after the writer's start, committed before it
        with engine.connect() as conn:
            upto = conn.execute(text("SELECT archive_run_totals_fold(10000, 0)")).scalar_one()
            conn.commit()
        assert upto <= started, "the fold passed a transaction that can still commit an end dated before it"
        writer.commit()
    with engine.connect() as conn:
        conn.execute(text("SELECT archive_run_totals_fold(10000, 0)"))  # everything, now nobody writes
        conn.commit()
        folded = {(r.worker_name, r.status): r.runs for r in conn.execute(text(
            "SELECT worker_name, status::text AS status, runs FROM archive_run_totals WHERE runs > 0"))}
    assert folded[("alpha", "SUCCESS")] == 1 and sum(folded.values()) == 5
    _assert_counters_are_the_ledgers(engine, _scrape(engine))


def test_a_repeatable_read_session_shows_as_the_oldest_xmin_holder(engine, client, viewer_headers):
    before = _scrape(engine)
    assert ("scrinalia_oldest_xmin_age_seconds", ()) in before  # present from the first scrape
    assert ("scrinalia_oldest_xmin_age_transactions", ()) in before
    with engine.connect() as holder:
        holder.execution_options(isolation_level="REPEATABLE READ")
        holder.execute(text("SET application_name = 'analyst-session'"))
        holder.execute(text("SELECT count(*) FROM archive_worker_runs"))  # takes its snapshot: holds the xmin
        pid = holder.execute(text("SELECT pg_backend_pid()")).scalar_one()
        with engine.connect() as other:  # transactions after its snapshot: its xmin is the oldest
            for _ in range(3):
                other.execute(text("SELECT pg_current_xact_id()"))
                other.commit()
            held = other.execute(text("SELECT extract(epoch FROM now() - xact_start)::float FROM pg_stat_activity "
                                      "WHERE pid = :p"), {"p": pid}).scalar_one()
        samples = _scrape(engine)
        assert samples[("scrinalia_oldest_xmin_age_seconds", ())] >= held > 0
        assert samples[("scrinalia_oldest_xmin_age_transactions", ())] >= 3
        horizon = client.get("/api/v1/system/runners", headers=viewer_headers).json()["xmin_horizon"]
        assert horizon is not None and horizon["pid"] == pid and horizon["kind"] == "session"
        assert horizon["age_seconds"] >= held and horizon["age_xids"] >= 3
        assert "analyst-session" in horizon["text"] and "idle in transaction" in horizon["text"]
        holder.rollback()


def test_a_scrape_whose_fold_cannot_write_still_counts_from_the_watermark(engine, database_url):
    """A session that may not write (default_transaction_read_only, a statement timeout) loses the fold,
    not the scrape: the counters are read from the watermark all the same."""
    from scrinalia.db.engine import create_engine_from_url

    runner = register_runner(engine, ["alpha"], lease=60)
    _end_runs(engine, runner, "alpha")
    _backdate(engine, 30)
    read_only = create_engine_from_url(database_url, connect_args={"options": "-c default_transaction_read_only=on"})
    try:
        _assert_counters_are_the_ledgers(engine, _scrape(read_only))
    finally:
        read_only.dispose()
    assert _totals_table(engine) == {}, "nothing was folded"


def test_the_upgrade_to_0018_and_back_keeps_every_total(empty_database_url):
    """Runs ended under 0017's trigger, some within the fold's margin: after the upgrade the totals now
    (folded + since the watermark) are the trigger's; runs ended after it are counted; the downgrade
    puts the trigger back with the totals complete."""
    from scrinalia.db import migrate
    from scrinalia.db.engine import create_engine_from_url

    migrate.upgrade(empty_database_url, "0017")
    engine = create_engine_from_url(empty_database_url)
    try:
        runner = uuid.uuid4()
        with engine.begin() as conn:
            conn.execute(text(_AT_0017["register"]), {"runner": runner})
        _end_runs_at_0017(engine, runner, "alpha")
        with engine.begin() as conn:  # two of them ended long ago: behind the first watermark
            conn.execute(text("UPDATE archive_worker_runs SET finished_at = finished_at - interval '1 hour' "
                              "WHERE status IN ('SUCCESS', 'FAILED')"))
        _end_runs_at_0017(engine, runner, "beta")

        def totals(source: str) -> dict[tuple[str, str], tuple[int, int, list[int]]]:
            with engine.connect() as conn:
                return {(r.worker_name, r.status): (r.runs, r.timed, list(r.duration_buckets)) for r in conn.execute(
                    text(f"SELECT worker_name, status::text AS status, runs, timed, duration_buckets FROM {source}"))}

        before = totals("archive_run_totals")
        assert sum(v[0] for v in before.values()) == 8
        engine.dispose()
        migrate.upgrade(empty_database_url)
        assert totals("archive_run_totals_now()") == before
        _end_runs(engine, runner, "alpha")
        _assert_counters_are_the_ledgers(engine, _scrape(engine))
        after = totals("archive_run_totals_now()")
        assert sum(v[0] for v in after.values()) == 12
        engine.dispose()
        migrate.downgrade(empty_database_url, "0017")
        assert totals("archive_run_totals") == after  # the trigger's table, complete again
        _end_runs_at_0017(engine, runner, "beta")  # and the trigger counts again
        assert sum(v[0] for v in totals("archive_run_totals").values()) == 16
    finally:
        engine.dispose()
