"""Every time quantity of the runner in ONE derivation: one value made from the flags (decision 0131).

The guarantees of the runner (a child is dead before another runner may expire its row; no step of the
loop outlives the self-fence point; a failed heartbeat is retried before it; a stopped fork server does
not hold the loop) rest on these quantities and on the relations between them. They used to be
scattered over properties of ``RunnerOptions``, module constants and a migration; here each one has a
name, a formula, a default and the guarantee it serves, and ``Timings.rows`` is the table that
docs/architecture.md shows ("Timings") and ``scrinalia-runner status`` prints (``timings``).

The constants live next to the code that uses them (``runner.CONTROL_CLIENT_TIMEOUT``, ...); this module
reads them, so a change there shows here, in ``status`` and in the docs' table test.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Protocol

MIN_FENCE_MARGIN = 0.1       # seconds the self-fence needs between abandoning a statement and the lease end
MIN_STATEMENT_SECONDS = 0.1  # the shortest statement bound worth sending (one round trip on a loaded host)
STATEMENT_FLOOR = 2.0        # the bound is at least this much where the lease leaves room for it
STATEMENT_MAX = 5.0          # and at most this much: the loop (status, the fence) waits on no step longer
SERVER_SHARE = 0.8           # the server's statement and lock timeouts, as a share of the client's bound
CONNECT_MAX = 2.0            # a new connection (DNS, TCP, TLS, auth) takes at most this much (libpq's minimum)
SPAWN_ANSWER_SECONDS = 5.0   # the longest the loop waits for the fork server to answer a spawn
SPAWN_ANSWER_FLOOR = 0.5     # ... and at least this much where the fence margin allows (a fork on a loaded host)
SPAWN_WAIT_MIN = 0.02        # the least a spawn is given even right at the fence point
SPAWN_WAIT_DEFAULT = 30.0    # a spawn asked with no bound (the one-shot's, which has no fence point to meet)
CONTROL_CLIENT_MIN = 0.05    # a control-socket client always gets this much, even at the fence point

# The constants of the loop and its parts. Their users import them from here, so the table, `status`, the
# docs and the simulator read the one value, and this module imports no other part of the runner.
MAX_SELECT_WAIT = 1.0        # the loop looks at everything at least this often
PROGRESS_INTERVAL = 0.5      # seconds between two progress statements: the panel sees progress within ~1 s
NO_PIDFD_POLL = 0.1          # the loop's longest wait while children live and the kernel has no pidfd
CHILD_PROGRESS_INTERVAL = 0.1  # a child sends progress at most this often
EOF_GRACE = 2.0              # seconds the finisher waits for a child's channel to close after its exit was reported
CONTROL_CLIENT_TIMEOUT = 0.5  # seconds one control client may take, its whole request and answer
CONTROL_SERVE_BUDGET = 0.5   # seconds of clients one serve_pending call serves
STALL_DUMP_GRACE = 1.0       # seconds between the stack dump (SIGUSR1) and SIGTERM: time to write the stack
STALL_PROBE_MAX = 30.0       # the longest probe window of a silent child
FORK_SERVER_READY_TIMEOUT = 120.0  # seconds a fork server may take to preload before it counts as failed


def stall_probe_seconds(timeout: float) -> float:
    """The window in which a silent child may still show CPU work: a quarter of the timeout, at most 30 s."""
    return min(timeout / 4, STALL_PROBE_MAX)


@dataclass(frozen=True, slots=True)
class ChildSessionBounds:
    """The server-side bounds of a child's sessions, derived from the lease (decision 0101).

    * ``statement_timeout`` = lease / 2: far longer than a normal batch write (milliseconds to a few
      seconds), shorter than the lease, so a statement stuck behind anything ends before the run could
      be expired and re-claimed elsewhere;
    * ``lock_timeout`` = lease / 4: a lock wait is the usual way a statement gets stuck; it gives up
      first, and the SDK tries the batch again (bounded by the lease);
    * ``idle_in_transaction_session_timeout`` = lease / 2: a child frozen (SIGSTOP, a dead host) in the
      middle of a batch loses its session, its transaction and its row locks before its lease ends, so
      whoever re-claims the run never waits on them (the batch fence refuses the late COMMIT anyway).

    The trade-off: a worker must not compute inside ``RunContext.commit`` (between its writes) for
    lease / 2 or more; workers compute first and commit the results, which takes milliseconds."""

    statement_timeout_ms: int
    lock_timeout_ms: int
    idle_in_transaction_timeout_ms: int

    @classmethod
    def for_lease(cls, lease_seconds: float) -> ChildSessionBounds:
        lease_ms = max(1000, int(lease_seconds * 1000))
        return cls(lease_ms // 2, lease_ms // 4, lease_ms // 2)

    def options(self) -> str:
        return (f"-c statement_timeout={self.statement_timeout_ms} -c lock_timeout={self.lock_timeout_ms}"
                f" -c idle_in_transaction_session_timeout={self.idle_in_transaction_timeout_ms}")
HEARTBEAT_RETRY_MAX = 1.0    # a failed heartbeat is retried after min(this, --heartbeat)
FENCE_LOCK_TIMEOUT = 2.0     # migration 0008: the batch fence's lock wait at COMMIT (SET lock_timeout = '2s')


@dataclass(frozen=True, slots=True)
class Quantity:
    """One row of the table: its name, its effective value (seconds), its formula, its default, and
    the guarantee it serves."""

    name: str
    seconds: float | None
    formula: str
    default: str
    guarantee: str

    def to_json(self) -> dict[str, Any]:
        return {"seconds": self.seconds, "formula": self.formula}


class TimingFlags(Protocol):
    """The flags the quantities derive from (``RunnerOptions`` has them; this module needs no more of it)."""

    @property
    def heartbeat_seconds(self) -> float: ...
    @property
    def lease_seconds(self) -> float: ...
    @property
    def poll_seconds(self) -> float: ...
    @property
    def listen_poll_seconds(self) -> float: ...
    @property
    def drain_timeout(self) -> float: ...
    @property
    def max_runtime(self) -> float | None: ...
    @property
    def cancel_grace(self) -> float: ...
    @property
    def kill_grace(self) -> float: ...
    @property
    def stall_timeout(self) -> float: ...


@dataclass(frozen=True, slots=True)
class Timings:
    """The effective time quantities of one runner, derived from its flags (``Timings.derive``)."""

    heartbeat: float
    lease: float
    poll: float
    listen_poll: float
    drain_timeout: float
    max_runtime: float | None
    cancel_grace: float
    kill_grace: float
    stall_timeout: float

    @classmethod
    def derive(cls, options: TimingFlags) -> Timings:
        return cls(options.heartbeat_seconds, options.lease_seconds, options.poll_seconds,
                   options.listen_poll_seconds, options.drain_timeout, options.max_runtime,
                   options.cancel_grace, options.kill_grace, options.stall_timeout)

    # --- the derived bounds ---------------------------------------------------------------------

    @property
    def fence_margin(self) -> float:
        """Half of the smaller of the heartbeat and the slack (lease - heartbeat): a missed heartbeat is
        retried before the fence, and the children are dead before another runner may expire their rows."""
        return min(self.heartbeat, self.lease - self.heartbeat) / 2

    @property
    def statement_seconds(self) -> float:
        """The client-side bound of one database step of the loop (decision 0110): a heartbeat that fails
        at its bound leaves time for one retry before the fence point; at least ``STATEMENT_FLOOR`` where
        that allows; at most ``STATEMENT_MAX``. Every step is also clipped to the fence point."""
        room = (self.lease - self.fence_margin - self.heartbeat) / 2
        bound = max(STATEMENT_FLOOR, min(self.heartbeat, self.lease / 4))
        return min(bound, room, STATEMENT_MAX)

    @property
    def server_statement_seconds(self) -> float:
        """The server's statement_timeout and lock_timeout of the parent's sessions: it fires first while
        the server answers (the truthful "blocked")."""
        return self.statement_seconds * SERVER_SHARE

    @property
    def connect_seconds(self) -> float:
        return min(self.statement_seconds, CONNECT_MAX)

    @property
    def libpq_connect_timeout(self) -> int:
        """libpq's own connect_timeout (whole seconds, at least 2): only ends an abandoned attempt's thread."""
        return max(2, math.ceil(self.connect_seconds))

    @property
    def spawn_seconds(self) -> float:
        """How long the loop waits for the fork server's answer to a spawn (decision 0112)."""
        return min(SPAWN_ANSWER_SECONDS, max(self.fence_margin, SPAWN_ANSWER_FLOOR))

    @property
    def expiry_seconds(self) -> float:
        """How often a daemon runs ``expire_leases`` (decision 0072)."""
        return self.lease / 4

    @property
    def heartbeat_retry(self) -> float:
        return min(HEARTBEAT_RETRY_MAX, self.heartbeat)

    def child_bounds(self) -> ChildSessionBounds:
        """The server-side bounds of a child's sessions."""
        return ChildSessionBounds.for_lease(self.lease)

    def listening_poll(self) -> float:
        """The poll while the LISTEN is up: the safety net, at most a quarter of the lease."""
        return max(self.poll, min(self.listen_poll, self.lease / 4))

    # --- the table ----------------------------------------------------------------------------------

    def rows(self) -> list[Quantity]:
        """Every quantity, in the order of the table in docs/architecture.md."""
        bounds = self.child_bounds()
        q = Quantity
        return [
            q("heartbeat", self.heartbeat, "--heartbeat", "15", "the lease is renewed this often"),
            q("lease", self.lease, "--lease (> heartbeat)", "60", "a dead runner's rows expire after this"),
            q("poll", self.poll, "--poll", "2", "a free runner claims a QUEUED run within this (no LISTEN)"),
            q("listen_poll", self.listening_poll(), "max(poll, min(--listen-poll, lease/4))", "10 -> 10",
              "the safety net while the LISTEN is up; other runners' leases are expired on it"),
            q("drain_timeout", self.drain_timeout, "--drain-timeout", "120", "a drain ends by then"),
            q("max_runtime", self.max_runtime, "--max-runtime", "none", "a run is SIGKILLed after this"),
            q("cancel_grace", self.cancel_grace, "--cancel-grace", "60", "a cancelled run is SIGTERMed after this"),
            q("kill_grace", self.kill_grace, "--kill-grace", "5", "SIGTERM -> SIGKILL"),
            q("stall_timeout", self.stall_timeout, "--stall-timeout (a worker's own wins)", "600",
              "a silent idle child is stopped (decision 0111)"),
            q("fence_margin", self.fence_margin, "min(heartbeat, lease - heartbeat) / 2", "7.5",
              "the children are dead before another runner may expire their rows"),
            q("statement", self.statement_seconds,
              "min(max(2, min(heartbeat, lease/4)), (lease - fence_margin - heartbeat)/2, 5)", "5",
              "a heartbeat that fails at its bound is retried before the fence point"),
            q("server_statement", self.server_statement_seconds, "0.8 * statement", "4",
              "a server that answers says blocked before the client abandons the step"),
            q("connect", self.connect_seconds, "min(statement, 2)", "2",
              "a partition holds the loop at most this long per attempt"),
            q("libpq_connect_timeout", float(self.libpq_connect_timeout), "max(2, ceil(connect))", "2",
              "an abandoned connection attempt's thread ends"),
            q("spawn", self.spawn_seconds, "min(5, max(fence_margin, 0.5)), clipped to the fence point", "5",
              "a stopped fork server does not hold the loop (decision 0112)"),
            q("expiry", self.expiry_seconds, "lease / 4", "15", "a dead runner's rows close within lease * 1.25"),
            q("heartbeat_retry", self.heartbeat_retry, "min(1, heartbeat)", "1",
              "a failed heartbeat is retried well before the fence point"),
            q("child_statement_timeout", bounds.statement_timeout_ms / 1000, "lease / 2", "30",
              "a child's stuck statement ends before its run may be re-claimed (decision 0101)"),
            q("child_lock_timeout", bounds.lock_timeout_ms / 1000, "lease / 4", "15",
              "a child's lock wait gives up first; the SDK retries the batch"),
            q("child_idle_in_transaction", bounds.idle_in_transaction_timeout_ms / 1000, "lease / 2", "30",
              "a frozen child loses its row locks before its lease ends"),
            q("fence_lock_timeout", FENCE_LOCK_TIMEOUT, "migration 0008: SET lock_timeout = '2s'", "2",
              "a batch COMMIT waits on its run's row at most this long"),
            q("select_max", MAX_SELECT_WAIT, "constant", "1", "the loop looks at everything at least this often"),
            q("no_pidfd_poll", NO_PIDFD_POLL, "constant", "0.1", "exits are seen without a pidfd"),
            q("progress_interval", PROGRESS_INTERVAL, "constant", "0.5", "the panel sees progress within ~1 s"),
            q("child_progress_interval", CHILD_PROGRESS_INTERVAL, "constant", "0.1",
              "a child sends progress at most this often"),
            q("eof_grace", EOF_GRACE, "constant", "2", "a channel a grandchild inherited does not hold a run"),
            q("control_client", CONTROL_CLIENT_TIMEOUT, "constant", "0.5", "one control client's whole exchange"),
            q("control_budget", CONTROL_SERVE_BUDGET, "constant (clipped to the fence point)", "0.5",
              "control clients hold one tick at most this long"),
            q("stall_dump_grace", STALL_DUMP_GRACE, "constant", "1", "time to write the stack before SIGTERM"),
            q("stall_probe", stall_probe_seconds(self.stall_timeout), "min(stall_timeout / 4, 30)", "30",
              "a child in one long C call shows CPU work within it"),
            q("fork_server_ready", FORK_SERVER_READY_TIMEOUT, "constant", "120",
              "a fork server that cannot preload stops the runner"),
            q("spawn_wait_min", SPAWN_WAIT_MIN, "constant", "0.02", "a spawn at the fence point is still tried"),
        ]

    def to_json(self) -> dict[str, dict[str, Any]]:
        return {row.name: row.to_json() for row in self.rows()}
