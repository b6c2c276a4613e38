"""The simulated database path: the in-memory ledger (``runner.memory_ledger``) on the world's clock,
and the faults between a session and it (``StatementFaults``).

Each statement of a session takes a round trip of virtual time. Faults change what a statement meets:

* ``refused``: no connection (one host, or every one): it fails at once, ``unreachable``;
* ``partition`` (one host) / ``partition_all``: the network is silent: a supervisor's statement hangs
  until its client-side bound (the statement bound, clipped to the fence point: ``runner.bounded``'s
  guard) and fails ``unreachable``; a child's (no guard) waits for the network to come back and is then
  sent, late;
* ``hang``: one statement of one host gets no answer (as a partition, for that statement);
* ``slow``: the server takes longer: past the server's statement_timeout it fails ``blocked``, past the
  client's bound ``unreachable``;
* ``answer_lost``: the statement took effect, its answer never came back;
* ``db_restart`` / ``db_failover``: the server is down (shutting down, then refusing connections); a
  child's open batch is lost with its connection;
* a row lock held by a frozen session (``MemoryDatabase.lock_row``): a statement that needs the row waits
  its lock_timeout (the ledger charges the wait to the world: ``elapse``), clipped by the client's bound.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from runner.memory_ledger import (
    InMemoryLedger,
    shutdown_error,
    statement_timeout_error,
    unreachable_error,
)
from runner.simulation.world import World
from scrinalia.domains.archive.ledger import FinishParams, StartParams

if TYPE_CHECKING:
    from runner.simulation.processes import Host

ROUND_TRIP = 0.002  # seconds: one statement on a healthy network


@dataclass
class Window:
    start: float
    end: float
    host: str | None = None     # None: every host
    rate: float = 1.0           # the share of statements it touches (hang, slow, answer_lost)
    seconds: float = 0.0        # slow: how much longer

    def covers(self, now: float, host: str | None) -> bool:
        return self.start <= now < self.end and (self.host is None or self.host == host)


@dataclass
class Network:
    """What is wrong between the sessions and the database, and when."""

    windows: dict[str, list[Window]] = field(default_factory=dict)

    def add(self, kind: str, window: Window) -> None:
        self.windows.setdefault(kind, []).append(window)

    def active(self, kind: str, now: float, host: str | None) -> Window | None:
        for window in self.windows.get(kind, ()):
            if window.covers(now, host):
                return window
        return None

    def heals_at(self, kinds: tuple[str, ...], now: float, host: str | None) -> float | None:
        ends = [w.end for kind in kinds for w in self.windows.get(kind, ()) if w.covers(now, host)]
        return max(ends) if ends else None

    def touched(self, host: str | None, since: float, until: float) -> bool:
        """Whether any window touched ``host``'s database path in [since, until] (the invariants' excuse)."""
        for windows in self.windows.values():
            for w in windows:
                if (w.host is None or w.host == host) and w.start <= until and w.end >= since:
                    return True
        return False


class SessionFaults:
    """The ``StatementFaults`` hook of one session (``kind``: supervisor or child)."""

    def __init__(self, world: World, network: Network, host: Host, kind: str, bound_seconds: float,
                 server_seconds: float) -> None:
        self.world = world
        self.network = network
        self.host = host
        self.kind = kind
        self.bound_seconds = bound_seconds    # the client's bound (the supervisor's guard; a child has none)
        self.server_seconds = server_seconds  # the server's statement_timeout for this session
        self.rng = world.rng

    def _deadline(self, session: InMemoryLedger) -> float | None:
        if self.kind != "supervisor":
            return None
        at = self.world.now + self.bound_seconds
        return at if session.deadline is None else min(at, session.deadline)

    def _abandon(self, what: str, deadline: float | None, until: float | None) -> None:
        """No answer: wait for ``until`` (the network back) or the client's bound, whichever first."""
        world = self.world
        if deadline is not None and (until is None or deadline <= until):
            world.sleep(deadline - world.now)
            raise unreachable_error(what, "the client's guard shut the socket (no answer within the bound)")
        world.sleep((until if until is not None else world.now) - world.now)

    def before(self, session: InMemoryLedger, what: str) -> None:
        world, net, host = self.world, self.network, self.host.name
        actor = world.current
        if actor is None:
            return  # the world's own writes (the API): no network in between
        now = world.now
        deadline = self._deadline(session)
        actor.deadline = deadline
        if net.active("db_restart", now, None) or net.active("db_failover", now, None):
            world.sleep(ROUND_TRIP)
            raise shutdown_error(what)
        if net.active("refused", now, host):
            world.sleep(ROUND_TRIP / 2)
            raise unreachable_error(what, "connection refused")
        silent = net.heals_at(("partition", "partition_all"), now, host)
        hang = net.active("hang", now, host)
        if silent is None and hang is not None and self.rng.random() < hang.rate:
            silent = hang.end
        if silent is not None:
            self._abandon(what, deadline, silent)
            if net.active("db_restart", world.now, None) or net.active("db_failover", world.now, None):
                raise shutdown_error(what)
        slow = net.active("slow", world.now, host)
        delay = ROUND_TRIP / 2
        if slow is not None and self.rng.random() < slow.rate:
            delay += self.rng.uniform(0.0, slow.seconds)
        limit = min(self.server_seconds, float("inf") if deadline is None else deadline - world.now)
        if delay > limit:
            if deadline is not None and deadline - world.now <= self.server_seconds:
                self._abandon(what, deadline, None)
            world.sleep(self.server_seconds)
            raise statement_timeout_error(what, self.server_seconds)
        world.sleep(delay)

    def after(self, session: InMemoryLedger, what: str) -> None:
        world = self.world
        actor = world.current
        if actor is None:
            return
        deadline, actor.deadline = actor.deadline, None
        lost = self.network.active("answer_lost", world.now, self.host.name)
        if lost is not None and self.rng.random() < lost.rate:
            self._abandon(what, deadline, self.network.heals_at(("answer_lost",), world.now, self.host.name))
            raise unreachable_error(what, "the connection broke before the answer")
        if deadline is not None and world.now + ROUND_TRIP / 2 > deadline:
            world.sleep(max(0.0, deadline - world.now))
            raise unreachable_error(what, "the client's guard shut the socket (no answer within the bound)")
        world.sleep(ROUND_TRIP / 2)


def elapse_for(world: World):
    """A lock wait in the database, charged to the waiting actor, clipped by its client's bound."""

    def elapse(seconds: float) -> None:
        actor = world.current
        if actor is None:
            return
        if actor.deadline is not None and world.now + seconds > actor.deadline:
            world.sleep(max(0.0, actor.deadline - world.now))
            raise unreachable_error("lock wait", "the client's guard shut the socket during a lock wait")
        world.sleep(seconds)

    return elapse


class WriteCheck:
    """Invariant "no ledger write by a runner that does not hold the row": every fenced statement of a
    supervisor's session is checked against the rows as they were just before it ran."""

    def __init__(self, inner: InMemoryLedger, runner_id: Any, report: Any) -> None:
        self.inner = inner
        self.runner_id = runner_id
        self.report = report  # (invariant, detail) -> None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def _held(self, run_id: Any) -> bool:
        row = self.inner.db.by_run_id.get(run_id)
        return row is not None and row["status"] == "RUNNING" and row["runner_id"] == self.runner_id

    def _own(self, runner_id: Any, what: str) -> None:
        if runner_id != self.runner_id:
            self.report("write_only_held_rows", f"{what} sent with another runner's id {runner_id}")

    def record_start(self, run_id: Any, runner_id: Any, params: StartParams) -> bool:
        self._own(runner_id, "record_start")
        held = self._held(run_id)
        result = self.inner.record_start(run_id, runner_id, params)
        if result and not held:
            self.report("write_only_held_rows", f"record_start wrote run {run_id} not held by {runner_id}")
        return result

    def finish(self, run_id: Any, runner_id: Any, params: FinishParams) -> Any:
        self._own(runner_id, "finish")
        held = self._held(run_id)
        result = self.inner.finish(run_id, runner_id, params)
        if result is not None and not held:
            self.report("write_only_held_rows", f"finish wrote run {run_id} not held by {runner_id}")
        return result

    def heartbeat(self, runner_id: Any, lease_seconds: float, **fields: Any) -> Any:
        self._own(runner_id, "heartbeat")
        result = self.inner.heartbeat(runner_id, lease_seconds, **fields)
        for run_id in result.held:
            row = self.inner.db.by_run_id.get(run_id)
            if row is None or row["runner_id"] != runner_id:
                self.report("write_only_held_rows", f"heartbeat renewed run {run_id} not held by {runner_id}")
        return result

    def record_progress(self, runner_id: Any, progress: Any) -> int:
        self._own(runner_id, "record_progress")
        not_held = [run_id for run_id in progress if not self._held(run_id)]
        before = {run_id: self.inner.db.by_run_id[run_id]["progress"] for run_id in not_held
                  if run_id in self.inner.db.by_run_id}
        result = self.inner.record_progress(runner_id, progress)
        for run_id, old in before.items():
            if self.inner.db.by_run_id[run_id]["progress"] is not old:
                self.report("write_only_held_rows", f"record_progress wrote run {run_id} not held by {runner_id}")
        return result
