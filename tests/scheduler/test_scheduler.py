"""The scheduler and the retry policy, on a real PostgreSQL."""
from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import text

from scrinalia.db.engine import create_engine_from_url
from scrinalia.domains.archive import ledger
from scrinalia.domains.archive.ledger import FinishParams
from scrinalia.domains.archive.workers.plugins import load_catalogue
from scrinalia.domains.archive.workers.sdk import WorkerSpec
from scrinalia.scheduler import schedules as schedules_module
from scrinalia.scheduler.retry import retry_failed_scheduled_runs
from scrinalia.scheduler.schedules import list_schedules
from scrinalia.scheduler.service import Scheduler as _Scheduler
from tests.ledger.helpers import register_runner


def _noop(ctx):
    return {}


# The installed catalogue, and three plain workers the retry tests schedule by name.
CATALOGUE = {**load_catalogue(), **{n: WorkerSpec(name=n, label=n, description=n, run=_noop) for n in ("a", "b", "x")}}


def create_schedule(engine, worker, every, request=None, **kw):
    return schedules_module.create_schedule(engine, worker, every, request, catalogue=CATALOGUE, **kw)


def Scheduler(engine):  # the class, with this module's catalogue
    return _Scheduler(engine, CATALOGUE)


def _fail(engine, runner, worker, status="FAILED"):
    run = ledger.claim_next(engine, runner, [worker], 60)
    assert run is not None
    return ledger.finish(engine, run.run_id, runner, FinishParams(status, error="RuntimeError: boom",
                         exit_reason="exception" if status == "FAILED" else "cancelled"))


def _db_now(engine):
    with engine.connect() as conn:
        return conn.execute(text("SELECT now()")).scalar_one()


def test_a_due_schedule_enqueues_a_schedule_run(engine):
    schedule = create_schedule(engine, "embedding", 3600, {"db_batch_size": 8})
    report = Scheduler(engine).tick()
    assert report.leader and [f.outcome for f in report.fired] == ["enqueued"]
    run = ledger.get_run(engine, report.fired[0].run_id)
    assert run.trigger == "SCHEDULE" and run.schedule_id == schedule.id and run.request == {"db_batch_size": 8}
    (after,) = list_schedules(engine)
    assert after.last_outcome == "enqueued" and after.next_run_at > _db_now(engine)
    assert Scheduler(engine).tick().fired == []  # not due again


def test_a_tick_while_the_slot_is_busy_is_skipped_not_queued(engine):
    busy = ledger.enqueue(engine, "quality-validator", {})
    create_schedule(engine, "quality-validator", 600)
    report = Scheduler(engine).tick()
    assert [f.outcome for f in report.fired] == ["skipped-busy"]
    assert ledger.active_run(engine, "quality-validator").run_id == busy.run_id
    (after,) = list_schedules(engine)
    assert after.last_outcome == "skipped-busy" and after.next_run_at > _db_now(engine)


def test_missed_ticks_are_one_catch_up_not_a_replay(engine):
    create_schedule(engine, "cleaning", 60)
    with engine.begin() as conn:  # the scheduler was down for ten intervals
        conn.execute(text("UPDATE archive_worker_schedules SET next_run_at = now() - interval '10 minutes 30 seconds'"))
    scheduler = Scheduler(engine)
    assert len(scheduler.tick().fired) == 1
    (after,) = list_schedules(engine)
    until_next = after.next_run_at - _db_now(engine)
    assert timedelta(0) < until_next <= timedelta(seconds=60)
    assert scheduler.tick().fired == []
    with engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM archive_worker_runs")).scalar_one() == 1


def test_only_one_scheduler_leads(database_url, engine):
    other_engine = create_engine_from_url(database_url)
    first, second = Scheduler(engine), Scheduler(other_engine)
    try:
        assert first.tick().leader
        assert not second.tick().leader
        first.release()  # the leader's session ends: the lock goes with it
        assert second.tick().leader
    finally:
        first.release()
        second.release()
        other_engine.dispose()


def test_a_failed_scheduled_run_is_retried_with_backoff(engine):
    runner = register_runner(engine, ["typology"])
    create_schedule(engine, "typology", 3600, {"preset": "cpu"})
    Scheduler(engine).tick()
    first = _fail(engine, runner, "typology")

    (retry,) = retry_failed_scheduled_runs(engine)
    row = ledger.get_run(engine, retry.run_id)
    assert row.attempt == 2 and row.retry_of == first.run_id and row.request == {"preset": "cpu"}
    assert row.trigger == "SCHEDULE" and row.schedule_id == first.schedule_id
    delay = (row.not_before - row.queued_at).total_seconds()
    assert 60 * 0.8 <= delay <= 60 * 1.2
    assert retry_failed_scheduled_runs(engine) == []  # the slot is taken by the retry itself
    assert ledger.claim_next(engine, runner, ["typology"], 60) is None  # backing off

    with engine.begin() as conn:
        conn.execute(text("UPDATE archive_worker_runs SET not_before = now() WHERE run_id = :r"), {"r": retry.run_id})
    _fail(engine, runner, "typology")
    (third,) = retry_failed_scheduled_runs(engine)
    row3 = ledger.get_run(engine, third.run_id)
    assert row3.attempt == 3 and 120 * 0.8 <= (row3.not_before - row3.queued_at).total_seconds() <= 120 * 1.2
    with engine.begin() as conn:
        conn.execute(text("UPDATE archive_worker_runs SET not_before = now() WHERE run_id = :r"), {"r": third.run_id})
    _fail(engine, runner, "typology")
    assert retry_failed_scheduled_runs(engine) == []  # three attempts is the limit


@pytest.mark.parametrize("trigger", ["API", "CLI"])
def test_manual_runs_are_never_retried(engine, trigger):
    runner = register_runner(engine, ["embedding"])
    create_schedule(engine, "embedding", 3600, first_delay_s=3600)
    if trigger == "API":
        ledger.enqueue(engine, "embedding", {})
        _fail(engine, runner, "embedding")
    else:
        run = ledger.create_running(engine, "embedding", {}, runner_id=runner, lease_seconds=60)
        ledger.finish(engine, run.run_id, runner, FinishParams("FAILED", error="RuntimeError: x",
                                                                exit_reason="exception"))
    assert retry_failed_scheduled_runs(engine) == []


def test_cancelled_is_never_retried_and_interrupted_is(engine):
    runner = register_runner(engine, ["a", "b"])
    create_schedule(engine, "a", 3600)
    create_schedule(engine, "b", 3600)
    Scheduler(engine).tick()
    _fail(engine, runner, "a", status="CANCELLED")
    _fail(engine, runner, "b", status="INTERRUPTED")
    assert [r.worker_name for r in retry_failed_scheduled_runs(engine)] == ["b"]


def test_backoff_is_capped_at_thirty_minutes(engine, monkeypatch):
    runner = register_runner(engine, ["x"])
    create_schedule(engine, "x", 3600, first_delay_s=3600)
    run = ledger.enqueue(engine, "x", {}, trigger="SCHEDULE", attempt=2)
    with engine.begin() as conn:  # pretend this is attempt 7 of a longer policy; the cap must hold
        conn.execute(text("UPDATE archive_worker_runs SET attempt = 7 WHERE run_id = :r"), {"r": run.run_id})
    _fail(engine, runner, "x")
    from scrinalia.scheduler import retry as policy

    monkeypatch.setattr(policy, "MAX_ATTEMPTS", 10)
    (r,) = retry_failed_scheduled_runs(engine)
    row = ledger.get_run(engine, r.run_id)
    assert (row.not_before - row.queued_at).total_seconds() == pytest.approx(1800, abs=1)


def test_the_scheduler_cli_adds_lists_and_disables(database_url, monkeypatch):
    from click.testing import CliRunner

    from scrinalia.cli.main import cli
    from scrinalia.settings import get_settings

    monkeypatch.setenv("DATABASE_URL", database_url)
    get_settings.cache_clear()
    runner = CliRunner()
    try:
        added = runner.invoke(cli, ["scheduler", "add", "embedding", "--every", "3600",
                                    "--request", '{"db_batch_size": 4}'])
        assert added.exit_code == 0, added.output
        listed = runner.invoke(cli, ["scheduler", "list"])
        assert "embedding" in listed.output and "every 3600s" in listed.output and "enabled" in listed.output
        schedule_id = listed.output.split("\t", 1)[0]
        assert runner.invoke(cli, ["scheduler", "disable", schedule_id]).exit_code == 0
        assert "disabled" in runner.invoke(cli, ["scheduler", "list"]).output
        bad = runner.invoke(cli, ["scheduler", "add", "embedding", "--every", "10"])
        assert bad.exit_code == 2 and "at least 60" in bad.output
        assert runner.invoke(cli, ["scheduler", "disable", "999999"]).exit_code == 2
    finally:
        get_settings.cache_clear()


def test_the_scheduler_cli_enables_removes_and_refuses_a_second_schedule(database_url, engine, monkeypatch):
    from click.testing import CliRunner

    from scrinalia.cli.main import cli
    from scrinalia.settings import get_settings

    monkeypatch.setenv("DATABASE_URL", database_url)
    monkeypatch.delenv("SCRINALIA_WORKER_PLUGINS", raising=False)
    get_settings.cache_clear()
    runner = CliRunner()
    try:
        added = runner.invoke(cli, ["scheduler", "add", "cleaning", "--every", "3600"])
        assert added.exit_code == 0, added.output
        (schedule,) = list_schedules(engine)
        second = runner.invoke(cli, ["scheduler", "add", "cleaning", "--every", "600"])
        assert second.exit_code == 2 and f"already has schedule {schedule.id}" in second.output
        assert len(list_schedules(engine)) == 1
        assert runner.invoke(cli, ["scheduler", "disable", str(schedule.id)]).exit_code == 0
        enabled = runner.invoke(cli, ["scheduler", "enable", str(schedule.id)])
        assert enabled.exit_code == 0 and "enabled" in enabled.output
        assert list_schedules(engine)[0].enabled
        removed = runner.invoke(cli, ["scheduler", "remove", str(schedule.id)])
        assert removed.exit_code == 0 and list_schedules(engine) == []
        assert runner.invoke(cli, ["scheduler", "remove", str(schedule.id)]).exit_code == 2
        unknown = runner.invoke(cli, ["scheduler", "add", "nosuch", "--every", "60"])
        assert unknown.exit_code == 2 and "no worker named 'nosuch'" in unknown.output
        assert list_schedules(engine) == []
    finally:
        get_settings.cache_clear()
