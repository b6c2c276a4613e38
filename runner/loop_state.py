"""What the phases of the supervisor's loop share: the phase interface, and the small state groups.

Each phase (``runner.supervisor.Supervisor.phases``) is an object that owns its own state and receives
its collaborators explicitly; the loop calls ``run`` on each, in the order of one explicit list, and
sleeps until the earliest moment any of them says it is ``due`` (decision 0130).
"""
from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from sqlalchemy import Engine

    from runner.children import Child
    from runner.devices import DevicePlanner



class Phase(Protocol):
    """One step of the loop (gunicorn's arbiter; River's maintenance services' ``runOnce``)."""

    name: str

    def run(self) -> None:
        """Do what is due now (nothing, most ticks)."""
        ...

    def due(self) -> Iterable[float]:
        """The CLOCK_MONOTONIC moments at which ``run`` has something to do (empty: only on an event)."""
        ...


@dataclass(frozen=True, slots=True)
class Position:
    """A phase's place in the loop: the phases it must follow in one tick, and why."""

    name: str
    after: tuple[str, ...]
    why: str


# The daemon's loop, written once (``Supervisor`` builds its phase list from it; docs/architecture.md
# shows it; tests/runner/test_phases.py checks that each phase follows what it names in ``after``).
PHASE_ORDER: tuple[Position, ...] = (
    Position("signals", (), "a TERM or INT begins the drain before anything is claimed or started this tick"),
    Position("wakeup", (), "a notification becomes a claim or beat request before the phases that answer it"),
    Position("fence", (), "past the fence point the children die before any phase sends a statement this tick"),
    Position("children", ("fence",), "what a child said is read before its exit counts"),
    Position("exits", ("children",), "an exit counts only after everything the child sent before it"),
    Position("control", ("children", "exits"), "status answers with this tick's children and exits"),
    Position("heartbeat", ("fence", "exits"), "its snapshot holds the live children only; its answer (lost rows, "
             "cancels, a drain) is acted on before anything starts"),
    Position("unstarted", ("heartbeat",), "a claimed run whose row the heartbeat did not renew is not started"),
    Position("finishes", ("heartbeat", "exits"), "the heartbeat's answer settles the abandoned runs first"),
    Position("progress", ("finishes",), "no progress is written for a run this tick finished"),
    Position("deadlines", ("children",), "a message that postpones a deadline (a sign of life) is read first"),
    Position("poll", ("signals", "heartbeat", "finishes", "unstarted"), "claims only into the slots this tick "
             "freed, on a lease just renewed, never after a drain began this tick"),
    Position("watchdog", ("poll",), "WATCHDOG=1 only from a loop that went through its phases"),
    Position("title", ("poll",), "the title shows the state this tick left"),
)

# The one-shot CLI's loop (``scrinalia-runner run``): one run it created itself, in the foreground. No
# claims (no ``poll``), no LISTEN (``wakeup``), no control socket, no systemd (``watchdog``); a Ctrl-C is
# the operator's cancel, not a drain (``interrupts`` instead of ``signals``). What it shares with the
# daemon keeps the daemon's reasons.
ONESHOT_ORDER: tuple[Position, ...] = (
    Position("interrupts", (), "Ctrl-C asks the run to cancel (again: kills it) before anything is sent this "
             "tick"),
    Position("fence", (), "past the fence point the child dies before any phase sends a statement this tick"),
    Position("children", ("fence",), "what the child said is read before its exit counts"),
    Position("exits", ("children",), "its exit counts only after everything it sent before it"),
    Position("heartbeat", ("fence", "exits"), "its snapshot holds the live child only; a lost row or a cancel "
             "in its answer is acted on before the run starts"),
    Position("unstarted", ("heartbeat",), "a run whose row the heartbeat did not renew is not started"),
    Position("finishes", ("heartbeat", "exits"), "the heartbeat's answer settles an abandoned run first"),
    Position("progress", ("finishes",), "no progress is written for a run this tick finished"),
    Position("deadlines", ("children",), "a message that postpones a deadline (a sign of life) is read first"),
    Position("title", ("finishes", "deadlines"), "the title shows the state this tick left"),
)


@dataclass(frozen=True, slots=True)
class Loop:
    """Which loop a supervisor runs: its phase order, and when it ends."""

    name: str
    order: tuple[Position, ...]
    until_drained: bool  # the daemon serves until a drain; the one-shot until its one run ended


DAEMON = Loop("daemon", PHASE_ORDER, until_drained=True)
ONESHOT = Loop("oneshot", ONESHOT_ORDER, until_drained=False)


@dataclass(slots=True)
class Requests:
    """What one phase wants of another. A phase never calls another phase: it writes its wish here, and the
    loop reads the wishes after each phase and hands them to the phase they are for (River's maintenance
    services talk only to their driver). So each phase can be built and tested alone, and nothing runs
    inside another phase's step."""

    fence: bool = False   # a statement met the fence point: the fence phase runs before the next phase
    claim: bool = False   # a slot became free, or a QUEUED run was announced: the poll claims at its turn
    beat: bool = False    # a run was abandoned, or a cancel was announced: the heartbeat beats at its turn
    held: Mapping[Any, Any] | None = None  # the rows the last heartbeat renewed: the unstarted claims and the
    #                                         finisher's abandoned runs check them

    def pending(self) -> bool:
        return self.fence or self.claim or self.beat or self.held is not None


@dataclass(slots=True)
class Services:
    """What the daemon has and the one-shot CLI may not (each one None: absent)."""

    notifier: Any = None                     # runner.sdnotify.Notifier
    gpu: Any = None                          # runner.devices.GpuProbe
    devices: DevicePlanner | None = None     # None (the one-shot CLI): the child sees what the shell sees
    control: Any = None                      # runner.ports.ControlPort (runner.control.ControlServer)
    wakeup: Any = None                       # runner.wakeup.Wakeup (None: poll only)
    on_progress: Callable[[Child], None] | None = None


@dataclass(slots=True)
class ChildSetup:
    """What every child's assignment carries, the catalogue the supervisor resolves with, and its engine."""

    database_url: str
    connect_args: dict[str, Any]
    catalogue: Mapping[str, Any] | None = None  # None: loaded when first needed
    engine: Engine | None = None  # the PostgreSQL ledger's engine (None: a supervisor given its ledger)


@dataclass(slots=True)
class Uptime:
    wall: float
    mono: float
