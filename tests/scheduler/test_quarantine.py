"""Crash-loop quarantine (decision 0165), on a real PostgreSQL: the scheduler's tick, the retry policy and
the ledger's own claim and finish, with the backoff and the interval fast-forwarded in the database."""
from __future__ import annotations

import pytest
from sqlalchemy import text

from scrinalia.domains.archive import ledger
from scrinalia.domains.archive.ledger import FinishParams
from scrinalia.domains.archive.workers.sdk import WorkerSpec
from scrinalia.scheduler import quarantine
from scrinalia.scheduler import schedules as schedules_module
from scrinalia.scheduler.schedules import get_schedule, set_enabled
from scrinalia.scheduler.service import Scheduler
from tests.ledger.helpers import register_runner


def _noop(ctx):
    return {}


CATALOGUE = {n: WorkerSpec(name=n, label=n, description=n, run=_noop) for n in ("loop", "other")}


def _schedule(engine, worker="loop"):
    return schedules_module.create_schedule(engine, worker, 3600, {}, catalogue=CATALOGUE)


def _fast_forward(engine, *, tick_due: bool = True) -> None:
    """The backoff of a waiting retry and (``tick_due``) the schedule's next tick are now (the policy is
    unchanged)."""
    with engine.begin() as conn:
        conn.execute(text("UPDATE archive_worker_runs SET not_before = now() WHERE status = 'QUEUED'"))
        if tick_due:
            conn.execute(text("UPDATE archive_worker_schedules SET next_run_at = now()"))


def _chain(engine, scheduler, runner, worker, errors, *, status="FAILED", reason="exception", fire_next=True):
    """One retry chain of ``worker``: a tick fires it (unless the previous chain's last tick did), and every
    attempt ends with the next of ``errors`` (as many attempts as the policy makes: 3). Returns the
    reports of the ticks. ``fire_next`` False: the schedule is not due again meanwhile."""
    _fast_forward(engine)
    reports = [scheduler.tick()]
    for attempt, error in enumerate(errors, start=1):
        run = ledger.claim_next(engine, runner, [worker], 60)
        assert run is not None and run.attempt == attempt, (attempt, run)
        ledger.finish(engine, run.run_id, runner, FinishParams(status, error=error if status == "FAILED" else None,
                      exit_reason=reason if status == "FAILED" else None))
        reports.append(scheduler.tick())  # the retry (backing off), or the chain's end
        # The retry is claimable, the schedule due (it fires once the slot is free).
        _fast_forward(engine, tick_due=fire_next)
    return reports


def _quarantined(reports) -> list[quarantine.Quarantine]:
    return [q for r in reports for q in r.quarantined]


def _schedule_runs(engine, schedule_id) -> int:
    with engine.connect() as conn:
        return conn.execute(text("SELECT count(*) FROM archive_worker_runs WHERE schedule_id = :s"),
                            {"s": schedule_id}).scalar_one()


SAME = ["RuntimeError: CUDA error: device-side assert triggered at batch 7",
        "RuntimeError: CUDA error: device-side assert triggered at batch 12",
        "RuntimeError: CUDA error: device-side assert triggered at batch 3"]


def test_three_chains_failing_the_same_way_quarantine_the_schedule(engine):
    runner = register_runner(engine, ["loop"])
    schedule = _schedule(engine)
    scheduler = Scheduler(engine, CATALOGUE)
    try:
        assert not _quarantined(_chain(engine, scheduler, runner, "loop", SAME))
        assert not _quarantined(_chain(engine, scheduler, runner, "loop", SAME))
        reports = _chain(engine, scheduler, runner, "loop", SAME)
        (q,) = _quarantined(reports)
        # Quarantined by the tick after the third chain's last attempt, before that tick could fire.
        assert reports[-1].quarantined == [q] and reports[-1].fired == []
        assert q.schedule_id == schedule.id and q.worker_name == "loop"
        assert q.fingerprint == "runtimeerror: cuda error: device-side assert triggered at batch <n>"
        after = get_schedule(engine, schedule.id)
        assert after.quarantined and not after.enabled and after.quarantined_at is not None
        assert after.quarantine_fingerprint == q.fingerprint and after.quarantine_run_id == q.run_id
        assert "the last 3 retry chains ended FAILED" in (after.quarantine_reason or "")
        last = ledger.get_run(engine, q.run_id)
        assert last.attempt == 3 and last.status == "FAILED"
        # Paused: ticks fire nothing more and retry nothing.
        runs = _schedule_runs(engine, schedule.id)
        assert runs == 9
        for _ in range(2):
            _fast_forward(engine)
            report = scheduler.tick()
            assert report.fired == [] and report.retries == [] and report.quarantined == []
        assert _schedule_runs(engine, schedule.id) == runs
    finally:
        scheduler.release()


def test_different_fingerprints_are_not_a_crash_loop(engine):
    runner = register_runner(engine, ["loop"])
    schedule = _schedule(engine)
    scheduler = Scheduler(engine, CATALOGUE)
    try:
        reports = []
        for words in ("disk full", "model file missing", "tokenizer refused the input", "disk full"):
            reports += _chain(engine, scheduler, runner, "loop", [f"RuntimeError: {words}"] * 3)
        assert _quarantined(reports) == []
        assert get_schedule(engine, schedule.id).enabled
        assert _schedule_runs(engine, schedule.id) == 13  # 4 chains of 3, and the 5th fired by the last tick
    finally:
        scheduler.release()


def test_a_success_or_an_interruption_breaks_the_streak(engine):
    runner = register_runner(engine, ["loop"])
    _schedule(engine)
    scheduler = Scheduler(engine, CATALOGUE)
    try:
        reports = _chain(engine, scheduler, runner, "loop", SAME)
        reports += _chain(engine, scheduler, runner, "loop", SAME)
        reports += _chain(engine, scheduler, runner, "loop", ["-"], status="SUCCESS")
        reports += _chain(engine, scheduler, runner, "loop", SAME)
        reports += _chain(engine, scheduler, runner, "loop", SAME)
        assert _quarantined(reports) == []
        assert _quarantined(_chain(engine, scheduler, runner, "loop", SAME))
    finally:
        scheduler.release()


def test_a_configuration_failure_ends_its_chain_at_once_and_counts(engine):
    """A configuration failure is never retried: each tick's single run is a whole chain."""
    runner = register_runner(engine, ["loop"])
    _schedule(engine)
    scheduler = Scheduler(engine, CATALOGUE)
    try:
        error = ["MissingOption: engine_options.model must name a local model directory"]
        reports = []
        for _ in range(3):
            reports += _chain(engine, scheduler, runner, "loop", error, reason="configuration")
        assert len(_quarantined(reports)) == 1
    finally:
        scheduler.release()


@pytest.mark.parametrize("trigger", ["API", "CLI"])
def test_manual_and_cli_runs_never_count_and_are_never_quarantined(engine, trigger):
    runner = register_runner(engine, ["loop", "other"])
    schedule = _schedule(engine)
    scheduler = Scheduler(engine, CATALOGUE)
    try:
        def manual_failure(worker):
            if trigger == "API":
                ledger.enqueue(engine, worker, {})
                run = ledger.claim_next(engine, runner, [worker], 60)
            else:
                run = ledger.create_running(engine, worker, {}, runner_id=runner, lease_seconds=60)
            assert run is not None and run.trigger == trigger
            ledger.finish(engine, run.run_id, runner, FinishParams("FAILED", error=SAME[0], exit_reason="exception"))

        # Two scheduled chains fail, and many manual runs fail the same way, of both workers (the
        # schedule is not due meanwhile): no quarantine, and no retry of a manual run.
        reports = _chain(engine, scheduler, runner, "loop", SAME)
        reports += _chain(engine, scheduler, runner, "loop", SAME, fire_next=False)
        for _ in range(4):
            manual_failure("loop")
            manual_failure("other")
            _fast_forward(engine, tick_due=False)
            report = scheduler.tick()
            assert report.fired == [] and report.retries == []
            reports.append(report)
        assert _quarantined(reports) == []
        assert get_schedule(engine, schedule.id).enabled
        # Nor did they break the streak: the third scheduled chain that fails the same way is the loop.
        (q,) = _quarantined(_chain(engine, scheduler, runner, "loop", SAME))
        assert q.schedule_id == schedule.id
        assert ledger.get_run(engine, q.run_id).trigger == "SCHEDULE"
    finally:
        scheduler.release()


def test_resume_counts_afresh_and_enable_is_a_resume(engine):
    runner = register_runner(engine, ["loop"])
    schedule = _schedule(engine)
    scheduler = Scheduler(engine, CATALOGUE)
    try:
        for _ in range(3):
            reports = _chain(engine, scheduler, runner, "loop", SAME)
        assert _quarantined(reports)
        assert quarantine.resume(engine, schedule.id, by="admin@example.org")
        resumed = get_schedule(engine, schedule.id)
        assert resumed.enabled and not resumed.quarantined and resumed.quarantine_fingerprint is None
        assert resumed.quarantine_resumed_by == "admin@example.org" and resumed.quarantine_resumed_at is not None
        with pytest.raises(quarantine.NotQuarantined):
            quarantine.resume(engine, schedule.id)
        assert quarantine.resume(engine, 999_999) is False

        # The chains before the resume do not count again: two more are not a loop, the third is.
        assert not _quarantined(_chain(engine, scheduler, runner, "loop", SAME))
        assert not _quarantined(_chain(engine, scheduler, runner, "loop", SAME))
        assert _quarantined(_chain(engine, scheduler, runner, "loop", SAME))

        # Disable keeps the quarantine; enable (PATCH enabled=true) lifts it like a resume.
        set_enabled(engine, schedule.id, False, by="ops")
        assert get_schedule(engine, schedule.id).quarantined
        set_enabled(engine, schedule.id, True, by="ops")
        after = get_schedule(engine, schedule.id)
        assert after.enabled and not after.quarantined and after.quarantine_resumed_by == "ops"
    finally:
        scheduler.release()


def test_quarantine_after_zero_never_quarantines(engine):
    runner = register_runner(engine, ["loop"])
    _schedule(engine)
    scheduler = Scheduler(engine, CATALOGUE, quarantine_after=0)
    try:
        reports = []
        for _ in range(4):
            reports += _chain(engine, scheduler, runner, "loop", SAME)
        assert _quarantined(reports) == []
    finally:
        scheduler.release()


def test_an_enable_by_the_previous_release_is_honoured(engine):
    """A release that knows no quarantine enables the schedule by ``enabled`` alone: the schedule runs,
    and the chains before its quarantine are not counted again."""
    runner = register_runner(engine, ["loop"])
    schedule = _schedule(engine)
    scheduler = Scheduler(engine, CATALOGUE)
    try:
        for _ in range(3):
            reports = _chain(engine, scheduler, runner, "loop", SAME)
        assert _quarantined(reports)
        with engine.begin() as conn:  # the previous release's PATCH enabled=true
            conn.execute(text("UPDATE archive_worker_schedules SET enabled = true, updated_at = now() WHERE id = :i"),
                         {"i": schedule.id})
        assert not get_schedule(engine, schedule.id).quarantined
        assert not _quarantined(_chain(engine, scheduler, runner, "loop", SAME))
    finally:
        scheduler.release()


def test_the_scheduler_cli_lists_a_quarantine_and_resumes_it(database_url, engine, monkeypatch):
    from click.testing import CliRunner

    from scrinalia.cli.main import cli
    from scrinalia.settings import get_settings

    runner = register_runner(engine, ["loop"])
    schedule = _schedule(engine)
    scheduler = Scheduler(engine, CATALOGUE)
    try:
        for _ in range(3):
            reports = _chain(engine, scheduler, runner, "loop", SAME)
        assert _quarantined(reports)
    finally:
        scheduler.release()
    monkeypatch.setenv("DATABASE_URL", database_url)
    get_settings.cache_clear()
    cli_runner = CliRunner()
    try:
        listed = cli_runner.invoke(cli, ["scheduler", "list"])
        assert listed.exit_code == 0 and "\tquarantined\t" in listed.output
        assert "the last 3 retry chains ended FAILED" in listed.output
        assert f"scrinalia scheduler resume {schedule.id}" in listed.output
        resumed = cli_runner.invoke(cli, ["scheduler", "resume", str(schedule.id), "--by", "ops@example.org"])
        assert resumed.exit_code == 0 and "resumed" in resumed.output
        assert get_schedule(engine, schedule.id).quarantine_resumed_by == "ops@example.org"
        again = cli_runner.invoke(cli, ["scheduler", "resume", str(schedule.id)])
        assert again.exit_code == 2 and "not quarantined" in again.output
        assert cli_runner.invoke(cli, ["scheduler", "resume", "999999"]).exit_code == 2
    finally:
        get_settings.cache_clear()
