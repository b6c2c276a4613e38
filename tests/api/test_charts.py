"""The charts' data: a run's samples (filled by the triggers of migration 0015), a worker's runs per hour
and durations, a runner's busy slots, and the retention that the scheduler's tick applies."""
from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import text

from scrinalia.domains.archive import charts, ledger
from scrinalia.domains.archive.ledger import FinishParams
from scrinalia.scheduler.service import Scheduler
from tests.ledger.helpers import register_runner

C = "/api/v1/system/charts"


def _running(engine, worker="alpha"):
    runner = register_runner(engine, [worker])
    ledger.enqueue(engine, worker, {})
    run = ledger.claim_next(engine, runner, [worker], 60)
    assert run is not None
    return runner, run


def _samples(engine, run_id):
    with engine.connect() as conn:
        return conn.execute(text("SELECT done, total, rss_bytes, gpu_bytes FROM archive_worker_run_samples "
                                 "WHERE run_id = :r ORDER BY at, done NULLS FIRST"), {"r": run_id}).all()


def _age_samples(engine, run_id, seconds):
    with engine.begin() as conn:
        conn.execute(text("UPDATE archive_worker_run_samples SET at = at - make_interval(secs => :s) "
                          "WHERE run_id = :r"), {"s": seconds, "r": run_id})


def test_progress_and_heartbeat_leave_samples_and_the_series_has_rate_and_memory(engine, client, viewer_headers):
    runner, run = _running(engine)
    assert ledger.record_progress(engine, runner, {run.run_id: {"done": 10, "total": 100, "unit": "document"}}) == 1
    # Within the spacing: the row changes, no second sample (the progress statement comes every 0.5 s).
    assert ledger.record_progress(engine, runner, {run.run_id: {"done": 20, "total": 100, "unit": "document"}}) == 1
    assert [s.done for s in _samples(engine, run.run_id)] == [10]
    _age_samples(engine, run.run_id, 10)
    ledger.record_progress(engine, runner, {run.run_id: {"done": 30, "total": 100, "unit": "document"}})
    # The heartbeat's children snapshot carries the memory the supervisor sampled.
    child = {"pid": 7, "run_id": str(run.run_id), "worker": "alpha", "progress": {"done": 30, "total": 100},
             "rss_bytes": 123_456_789, "gpu_memory_bytes": 2_000_000_000}
    ledger.heartbeat(engine, runner, 60, children=[child])
    rows = _samples(engine, run.run_id)
    assert [r.done for r in rows] == [10, 30, 30]
    assert rows[-1].rss_bytes == 123_456_789 and rows[-1].gpu_bytes == 2_000_000_000
    r = client.get(f"{C}/runs/{run.run_id}", headers=viewer_headers)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["status"] == "RUNNING" and body["unit"] == "document"
    points = body["points"]
    assert [p["done"] for p in points] == [10, 30]  # the samples of one 2-s bucket fold into one point
    assert points[-1]["rss_bytes"] == 123_456_789 and points[-1]["gpu_bytes"] == 2_000_000_000
    # 10 -> 30 over the ~10 s the first sample was aged by: about 2 units/s.
    assert points[0]["rate"] is None and 1.5 < points[-1]["rate"] < 2.5, points
    assert points[0]["t"] < points[-1]["t"]

    # The last progress is always kept when the run ends, whatever the spacing: here one that the
    # spacing had thinned out, and a finish that sends no progress of its own.
    ledger.record_progress(engine, runner, {run.run_id: {"done": 100, "total": 100, "unit": "document"}})
    assert _samples(engine, run.run_id)[-1].done == 30
    ledger.finish(engine, run.run_id, runner, FinishParams("SUCCESS"))
    assert _samples(engine, run.run_id)[-1].done == 100
    body = client.get(f"{C}/runs/{run.run_id}", headers=viewer_headers).json()
    assert body["status"] == "SUCCESS" and body["points"][-1]["done"] == 100


def test_the_spacing_of_the_samples_grows_with_the_runs_age(engine):
    runner, run = _running(engine)
    with engine.begin() as conn:  # a run of 40 min: one progress sample per 8 s at most
        conn.execute(text("UPDATE archive_worker_runs SET started_at = now() - interval '40 minutes' "
                          "WHERE run_id = :r"), {"r": run.run_id})
    ledger.record_progress(engine, runner, {run.run_id: {"done": 1}})
    _age_samples(engine, run.run_id, 5)
    ledger.record_progress(engine, runner, {run.run_id: {"done": 2}})
    assert [r.done for r in _samples(engine, run.run_id)] == [1]
    _age_samples(engine, run.run_id, 4)
    ledger.record_progress(engine, runner, {run.run_id: {"done": 3}})
    assert [r.done for r in _samples(engine, run.run_id)] == [1, 3]
    # The heartbeat's memory samples: elapsed 18,000 s -> at most one per 60 s.
    child = {"run_id": str(run.run_id), "elapsed_seconds": 18_000.5, "rss_bytes": 10, "progress": {"done": 3}}
    ledger.heartbeat(engine, runner, 60, children=[child])
    ledger.heartbeat(engine, runner, 60, children=[{**child, "rss_bytes": 11}])
    assert [r.rss_bytes for r in _samples(engine, run.run_id) if r.rss_bytes] == [10]
    _age_samples(engine, run.run_id, 61)
    ledger.heartbeat(engine, runner, 60, children=[{**child, "rss_bytes": 12}])
    assert [r.rss_bytes for r in _samples(engine, run.run_id) if r.rss_bytes] == [10, 12]


def test_a_malformed_children_snapshot_never_fails_the_heartbeat(engine):
    runner, run = _running(engine)
    bad: list[Any] = [{"run_id": "not-a-uuid", "rss_bytes": 5}, {"run_id": str(run.run_id), "rss_bytes": "lots"},
           {"run_id": str(run.run_id), "rss_bytes": 1e30, "progress": {"done": "x"}}, "a string", 7]
    beat = ledger.heartbeat(engine, runner, 60, children=bad)
    assert run.run_id in beat.held
    rows = _samples(engine, run.run_id)
    assert [(r.done, r.rss_bytes) for r in rows] == [(None, None)]  # the 1e30 one: kept, its values dropped


def test_runs_per_hour_sum_to_the_ledgers_runs_in_the_window(engine, client, viewer_headers):
    runner = register_runner(engine, ["alpha"])
    # Ages in hours; the three "4h+" runs finish 10, 20 and 30 min into the hourly bucket that began 4 h
    # before the current one, so they share one bucket whatever the minute the test runs at.
    ages_h: list[float | str] = [0.1, 0.2, "4h+10", "4h+20", "4h+30", 23.0, 30.0, 100.0, 200.0]
    statuses = ["SUCCESS", "FAILED", "SUCCESS", "SUCCESS", "CANCELLED", "INTERRUPTED", "SUCCESS", "FAILED", "SUCCESS"]
    durations = [1000, 2000, 3000, 5000, 0, 100, 7000, 100, 100]
    with engine.connect() as conn:
        now_s = float(conn.execute(text("SELECT extract(epoch FROM now())")).scalar_one())
    hour0 = now_s // 3600 * 3600
    for age, status, ms in zip(ages_h, statuses, durations, strict=True):
        ledger.enqueue(engine, "alpha", {})
        run = ledger.claim_next(engine, runner, ["alpha"], 60)
        assert run is not None
        ledger.finish(engine, run.run_id, runner, FinishParams(status))
        at = hour0 - 4 * 3600 + int(age[3:]) * 60 if isinstance(age, str) else now_s - age * 3600
        with engine.begin() as conn:
            conn.execute(text("UPDATE archive_worker_runs SET finished_at = to_timestamp(:at), "
                              "duration_ms = :ms WHERE run_id = :r"), {"at": at, "ms": ms, "r": run.run_id})

    for window, hours in (("24h", 24), ("7d", 168)):
        r = client.get(f"{C}/workers/alpha", params={"window": window}, headers=viewer_headers)
        assert r.status_code == 200, r.text
        body = r.json()
        assert len(body["buckets"]) == hours and body["step_seconds"] == 3600
        with engine.connect() as conn:
            counted = conn.execute(text("SELECT count(*) FROM archive_worker_runs WHERE worker_name = 'alpha' "
                                        "AND finished_at >= CAST(:since AS timestamptz)"),
                                   {"since": body["since"]}).scalar_one()
        bars = sum(b[o] for b in body["buckets"] for o in ("success", "failed", "interrupted", "cancelled"))
        assert bars == counted
        assert counted == (6 if window == "24h" else 8)  # 200 h ago is past 7 d

    body = client.get(f"{C}/workers/alpha", headers=viewer_headers).json()
    # The bucket 4 h before the current one: two successes (3000, 5000 ms) and a cancelled run; p50 of the successes.
    both = [b for b in body["buckets"] if b["success"] == 2]
    assert both and both[0]["p50_ms"] == 4000 and both[0]["cancelled"] == 1
    assert all(b["p50_ms"] is None for b in body["buckets"] if b["success"] == 0)


def test_a_runners_busy_slots(engine, client, viewer_headers):
    runner = register_runner(engine, ["alpha", "beta"])
    for worker, (start_h, end_h) in (("alpha", (5.0, 4.0)), ("beta", (4.5, 4.0))):
        ledger.enqueue(engine, worker, {})
        run = ledger.claim_next(engine, runner, [worker], 60)
        assert run is not None
        ledger.finish(engine, run.run_id, runner, FinishParams("SUCCESS"))
        with engine.begin() as conn:
            conn.execute(text("UPDATE archive_worker_runs SET started_at = now() - make_interval(secs => :s), "
                              "finished_at = now() - make_interval(secs => :f) WHERE run_id = :r"),
                         {"s": start_h * 3600, "f": end_h * 3600, "r": run.run_id})
    r = client.get(f"{C}/runners/{runner}", headers=viewer_headers)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["concurrency"] == 1 and body["step_seconds"] == 600
    busy_seconds = sum(b["busy"] for b in body["buckets"]) * body["step_seconds"]
    assert abs(busy_seconds - 1.5 * 3600) < 5
    assert max(b["busy"] for b in body["buckets"]) == 2.0  # both ran over the same half hour
    week = client.get(f"{C}/runners/{runner}", params={"window": "7d"}, headers=viewer_headers).json()
    assert abs(sum(b["busy"] for b in week["buckets"]) * 3600 - 1.5 * 3600) < 5


def _expected_busy(spans, since: float, until: float, step: float) -> list[float]:
    """The average busy slots of each bucket from ``since`` to ``until``, from the runs' (start, finish)
    epochs (finish None: still running, busy until ``until``), by plain overlap arithmetic."""
    buckets = []
    b = since
    while b <= until:
        end = min(b + step, until)
        buckets.append(sum(max(0.0, min(f if f is not None else until, end) - max(s, b)) for s, f in spans) / step)
        b += step
    return buckets


def test_a_runners_busy_slots_per_bucket_at_the_edges(engine, client, viewer_headers):
    """Each bucket's busy slots against the overlap arithmetic, for the runs at the edges of the buckets
    and of the window: spanning several buckets, still RUNNING, begun before the window (finished in it or
    still running), ending exactly on a bucket's edge, and a run whose finish precedes its start (none)."""
    # age of the start, age of the finish (None: RUNNING), in seconds
    shapes = {
        "several": (100 * 60 + 7, 61 * 60 - 13),          # over several 10-min buckets and 1-h buckets
        "running": (25 * 60 + 3, None),                  # still RUNNING: busy until the statement's now()
        "early": (26 * 3600 + 11, 23 * 3600 + 1_805),    # begun before the 24-h window, finished in it
        "older": (8 * 86_400, 6 * 86_400 + 17),          # begun before the 7-d window, finished in it
        "forever": (9 * 86_400, None),                   # begun before both windows, still RUNNING
        "inverted": (3_000, 3_600),                      # finished "before" it started: no busy time
        "short": (5.5, 2.25),                             # within the current bucket
    }
    runner = register_runner(engine, list(shapes))
    for worker, (start_age, finish_age) in shapes.items():
        ledger.enqueue(engine, worker, {})
        run = ledger.claim_next(engine, runner, [worker], 60)
        assert run is not None
        if finish_age is not None:
            ledger.finish(engine, run.run_id, runner, FinishParams("SUCCESS"))
        with engine.begin() as conn:
            conn.execute(text("UPDATE archive_worker_runs SET started_at = now() - make_interval(secs => :s), "
                              "finished_at = CASE WHEN finished_at IS NOT NULL "
                              "THEN now() - make_interval(secs => :f) END WHERE run_id = :r"),
                         {"s": start_age, "f": finish_age or 0, "r": run.run_id})
    with engine.begin() as conn:  # one run that ends exactly on a 10-min (and so a 1-h) edge, 50 min long
        edge = conn.execute(text("SELECT date_bin(interval '1 hour', now(), TIMESTAMPTZ '2000-01-01 00:00:00+00') "
                                 "- interval '2 hours'")).scalar_one()
    ledger.enqueue(engine, "several", {})
    aligned = ledger.claim_next(engine, runner, ["several"], 60)
    assert aligned is not None
    ledger.finish(engine, aligned.run_id, runner, FinishParams("FAILED"))
    with engine.begin() as conn:
        conn.execute(text("UPDATE archive_worker_runs SET started_at = :e - interval '50 minutes', finished_at = :e "
                          "WHERE run_id = :r"), {"e": edge, "r": aligned.run_id})
        spans = [(r.s, r.f) for r in conn.execute(text(
            "SELECT date_part('epoch', started_at)::float8 AS s, date_part('epoch', finished_at)::float8 AS f "
            "FROM archive_worker_runs WHERE runner_id = :r AND (finished_at IS NULL OR finished_at > started_at)"),
            {"r": runner})]
    assert len(spans) == len(shapes)  # the inverted one left out, the aligned one in

    for window, step, n in (("24h", 600, 144), ("7d", 3600, 168)):
        body = client.get(f"{C}/runners/{runner}", params={"window": window}, headers=viewer_headers).json()
        since, until = (datetime.fromisoformat(body[k]).timestamp() for k in ("since", "until"))
        assert body["step_seconds"] == step and len(body["buckets"]) == n
        assert [b["t"] for b in body["buckets"]] == [since + k * step for k in range(n)]
        expected = _expected_busy(spans, since, until, step)
        got = [b["busy"] for b in body["buckets"]]
        assert max(abs(g - e) for g, e in zip(got, expected, strict=True)) < 0.001, (window, got, expected)
        assert got[-1] > 0  # the running runs count up to now, in the current bucket
        assert min(got[:-1]) >= 1.0  # "forever" keeps one slot busy in every whole bucket


def test_unknown_things_are_404_bad_windows_422_and_no_session_401(client, viewer_headers):
    assert client.get(f"{C}/runs/{uuid.uuid4()}", headers=viewer_headers).status_code == 404
    assert client.get(f"{C}/workers/nope", headers=viewer_headers).status_code == 404
    assert client.get(f"{C}/runners/{uuid.uuid4()}", headers=viewer_headers).status_code == 404
    assert client.get(f"{C}/workers/alpha", params={"window": "1y"}, headers=viewer_headers).status_code == 422
    assert client.get(f"{C}/workers/alpha").status_code == 401


def _old_run_id(engine, days):
    """A run id as the database made it ``days`` ago (UUIDv7: its first 48 bits are the enqueue's ms)."""
    with engine.connect() as conn:
        return conn.execute(text(
            "SELECT encode(substring(int8send((extract(epoch FROM now() - make_interval(days => :d)) * 1000)::bigint)"
            " FROM 3) || substring(uuid_send(gen_random_uuid()) FROM 7), 'hex')::uuid"), {"d": days}).scalar_one()


def test_the_schedulers_tick_prunes_the_samples_of_old_runs_in_bounded_batches(engine):
    old, recent = _old_run_id(engine, 20), _old_run_id(engine, 3)
    with engine.begin() as conn:
        for run_id, n in ((old, 25), (recent, 5)):
            conn.execute(text("INSERT INTO archive_worker_run_samples (run_id, at, done) "
                              "SELECT :r, now() - make_interval(secs => g), g FROM generate_series(1, :n) AS g"),
                         {"r": run_id, "n": n})
    assert charts.prune_samples(engine, 14, batch=10) == 10  # bounded: a backlog takes several statements
    scheduler = Scheduler(engine, {}, samples_retention_days=14)
    try:
        report = scheduler.tick()
        assert report.leader and report.pruned_samples == 15
        assert _samples(engine, old) == [] and len(_samples(engine, recent)) == 5
        assert scheduler.tick().pruned_samples == 0
        # A shorter retention reaches the recent run too.
        scheduler.samples_retention_days = 2
        assert scheduler.tick().pruned_samples == 5
    finally:
        scheduler.release()
