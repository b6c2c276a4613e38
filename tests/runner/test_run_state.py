"""The per-run state machine, the finisher's vocabulary and the one place where an error is cut
(issue 12): pure parts, no processes."""
from __future__ import annotations

import re
import signal
from pathlib import Path

from runner import outcome
from runner.launchers import ChildExit
from runner.run_state import Action, RunPhase, RunState, Timing
from runner.timings import EOF_GRACE
from scrinalia.db.tables import EXIT_REASONS, SQL_DECIDED_EXIT_REASONS, ExitReason
from scrinalia.domains.archive import ledger

RUNNER = Path(__file__).resolve().parents[2] / "runner"
EXIT = ChildExit(123, 0, None, None, None)
TIMING = Timing(max_runtime=None, cancel_grace=5, kill_grace=5)


def test_a_run_ends_only_once_its_exit_and_its_channel_s_end_are_both_observed():
    state = RunState(claimed_at=0.0)
    state.started(0.1)
    state.reported({"status": "SUCCESS"}, 0.2)
    assert state.exited(EXIT, 1.0) == [] and state.phase is RunPhase.FINISHING  # the channel may hold more
    assert [e.action for e in state.closed()] == [Action.FINISH] and state.phase is RunPhase.ENDED
    assert state.closed() == [] and state.exited(EXIT, 2.0) == []  # once

    other = RunState(claimed_at=0.0)
    assert other.closed() == []  # EOF first: the exit report is awaited
    assert [e.action for e in other.exited(EXIT, 1.0)] == [Action.FINISH]


def test_a_channel_that_stays_open_after_the_exit_ends_after_the_grace():
    state = RunState(claimed_at=0.0)
    state.exited(EXIT, 10.0)
    ((at, due),) = state.deadlines(TIMING)
    assert at == 10.0 + EOF_GRACE and due.sig is None  # then: closed(), and the finisher decides


def test_lost_and_fenced_runs_are_forgotten_and_abandoned_not_finished():
    lost = RunState(claimed_at=0.0)
    assert [(e.action, e.signal) for e in lost.lose(1.0)] == [(Action.SIGNAL, signal.SIGKILL)]
    lost.exited(EXIT, 2.0)
    assert [e.action for e in lost.closed()] == [Action.FORGET]
    fenced = RunState(claimed_at=0.0)
    fenced.fence(1.0)
    assert fenced.request_cancel(1.5) == []  # killed already: nothing more is sent to it
    fenced.closed()
    assert [e.action for e in fenced.exited(EXIT, 2.0)] == [Action.ABANDON]


def test_the_first_reason_to_stop_a_child_is_its_outcome():
    state = RunState(claimed_at=0.0)
    assert [e.signal for e in state.stop(signal.SIGTERM, outcome.RUNNER_STOPPED, 1.0)] == [signal.SIGTERM]
    state.stop(signal.SIGKILL, outcome.TIMEOUT, 2.0)
    assert state.stop(signal.SIGKILL, None, 3.0) == []  # SIGKILL once
    assert state.kill_reason == outcome.RUNNER_STOPPED and state.phase is RunPhase.STOPPING


def test_the_fork_server_s_death_is_decided_by_decide():
    state = RunState(claimed_at=0.0)
    state.fork_server_died(123, 1.0)
    assert state.exit is not None and state.kill_reason == outcome.FORK_SERVER_DIED
    out = outcome.decide(worker="w", exit=state.exit, result=None, kill_reason=state.kill_reason,
                         signals_sent=state.signals_sent, stderr_tail="", oom_kills_before=None,
                         oom_kills_after=None, max_runtime=None, cancel_grace=1, drain_timeout=1)
    assert (out.status, out.exit_reason, out.exit_signal) == ("FAILED", "signal", signal.SIGKILL)
    assert out.error.startswith("ForkServerDied:")


def test_lease_lost_is_a_signal_of_the_child_not_a_status():
    sources = "\n".join(p.read_text() for p in RUNNER.glob("*.py"))
    assert '"LEASE_LOST"' not in sources and "'LEASE_LOST'" not in sources  # no such status string
    out = outcome.decide(worker="w", exit=EXIT, result={"status": None, "lease_lost": True, "error": "LeaseLost: x"},
                         kill_reason=None, signals_sent=set(), stderr_tail="", oom_kills_before=None,
                         oom_kills_after=None, max_runtime=None, cancel_grace=1, drain_timeout=1)
    assert out.write is False and out.exit_reason == ExitReason.LEASE_LOST


def test_the_ends_that_sql_decides_are_named_in_the_same_vocabulary():
    assert EXIT_REASONS == tuple(r.value for r in ExitReason)
    statements = {"expire_leases": ledger._EXPIRE_LEASES, "request_cancel": ledger._REQUEST_CANCEL}
    for name, reason in SQL_DECIDED_EXIT_REASONS.items():
        sql = str(statements[name])
        assert re.findall(r"exit_reason = [^\n]*'([a-z-]+)'", sql) == [reason.value], (name, sql)


def test_an_error_is_cut_to_the_ledger_s_length_in_one_place():
    # memory_ledger.py is the in-memory copy of the ledger's SQL: its cut is finish's `left(:error, ERROR_MAX)`,
    # the database's, not a second cut of the runner's.
    using = sorted(p.name for p in RUNNER.glob("*.py") if "ERROR_MAX" in p.read_text() and p.name != "memory_ledger.py")
    assert using == ["outcome.py"], using
    text = outcome.format_error(ValueError("x" * 5000))
    assert len(text) <= outcome.ERROR_MAX and text.startswith("ValueError: xxx")
