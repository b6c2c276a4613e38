"""The supervisor's own state, in small groups: what each phase of its loop reads and writes.

``SupervisorBase`` declares the attributes that the phases (``runner.claims``, ``runner.lease``,
``runner.tending`` and ``runner.supervisor``) share; the ``Supervisor`` sets them in ``__init__``.
"""
from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from runner.launchers import Launcher
from runner.ledger_link import LedgerLink
from runner.options import RunnerOptions
from scrinalia.domains.archive import registry
from scrinalia.domains.archive.ledger import WorkerRun

if TYPE_CHECKING:
    from runner.children import Child
    from runner.devices import DevicePlanner
    from runner.finisher import Finisher
    from runner.run_state import Effect
    from runner.signals import SignalPipe

MAX_SELECT_WAIT = 1.0
PROGRESS_INTERVAL = 0.5  # seconds between two progress statements: the panel sees progress within ~1 s


@dataclass(slots=True)
class Timers:
    """When each periodic phase is next due (CLOCK_MONOTONIC)."""

    heartbeat: float = 0.0
    poll: float = 0.0
    expiry: float = 0.0
    watchdog: float = 0.0
    progress: float = 0.0

    def now_for(self, name: str) -> None:
        """Bring ``name`` forward to now (a slot freed, a run abandoned, a notification arrived)."""
        setattr(self, name, min(getattr(self, name), time.monotonic()))


@dataclass(slots=True)
class LeaseState:
    """What the last heartbeat said about this runner's lease."""

    deadline: float | None = None            # CLOCK_MONOTONIC: the lease ends (conservative by the round trip)
    last_ok: float | None = None
    fenced: bool = False                     # the lease could not be renewed in time: no claims
    last_children: list[dict[str, Any]] | None = None  # the registry's snapshot, as last written

    def margin(self) -> float:
        return float("inf") if self.deadline is None else self.deadline - time.monotonic()


@dataclass(slots=True)
class DrainState:
    draining: bool = False
    reason: str | None = None
    deadline: float | None = None
    interrupts: int = 0                      # the one-shot CLI's Ctrl-C count


@dataclass(slots=True)
class Services:
    """What the daemon has and the one-shot CLI may not (each one None: absent)."""

    notifier: Any = None                     # runner.sdnotify.Notifier
    gpu: Any = None                          # runner.devices.GpuProbe
    devices: DevicePlanner | None = None     # None (the one-shot CLI): the child sees what the shell sees
    control: Any = None                      # runner.control.ControlServer
    wakeup: Any = None                       # runner.wakeup.Wakeup (None: poll only)
    on_progress: Callable[[Child], None] | None = None


@dataclass(slots=True)
class ChildSetup:
    """What every child's assignment carries, and the catalogue the supervisor resolves with."""

    database_url: str
    connect_args: dict[str, Any]
    catalogue: Mapping[str, Any] | None = None  # None: loaded when first needed


@dataclass(slots=True)
class Uptime:
    wall: float = field(default_factory=time.time)
    mono: float = field(default_factory=time.monotonic)


class SupervisorBase:
    """The attributes every phase of the loop shares (set by ``Supervisor.__init__``)."""

    options: RunnerOptions
    mode: str                                # daemon | oneshot
    launcher: Launcher
    registration: registry.RunnerRegistration
    db: LedgerLink
    finisher: Finisher
    services: Services
    setup: ChildSetup
    children: dict[int, Child]
    unstarted: dict[uuid.UUID, tuple[WorkerRun, float]]  # claimed; resolve/record_start wait for the database
    timers: Timers
    lease: LeaseState
    drain: DrainState
    signals: SignalPipe
    uptime: Uptime
    exit_code: int

    @property
    def runner_id(self) -> uuid.UUID:
        return self.registration.runner_id

    @property
    def capabilities(self) -> list[str]:
        return list(self.registration.capabilities)

    # What one phase module calls of another's (the Supervisor inherits them all).

    def _fence_point(self) -> float | None:
        """When the children must be dead if the lease is not renewed (None: no live child to fence).
        Every wait of the loop ends by then (decision 0110)."""
        if self.lease.deadline is None or not any(c.state.alive for c in self.children.values()):
            return None
        return self.lease.deadline - self.options.fence_margin

    def _bounded_wait(self, seconds: float) -> float:
        """``seconds``, clipped to the fence point: how long the loop may wait on anything now."""
        point = self._fence_point()
        return seconds if point is None else max(0.0, min(seconds, point - time.monotonic()))

    def begin_drain(self, why: str) -> None:
        raise NotImplementedError

    def _stop_now(self, why: str) -> None:
        raise NotImplementedError

    def _sample_resources(self) -> None:
        raise NotImplementedError

    def _apply(self, child: Child, effects: list[Effect]) -> None:
        raise NotImplementedError

    def _lose(self, child: Child, why: str) -> None:
        raise NotImplementedError

    def _request_cancel(self, child: Child, why: str) -> None:
        raise NotImplementedError

    def _signal(self, child: Child, sig: int, reason: str | None = None) -> None:
        raise NotImplementedError

    def _may_claim(self) -> bool:
        raise NotImplementedError

    def _poll_interval(self) -> float:
        raise NotImplementedError

    def _expire_leases(self) -> None:
        raise NotImplementedError

    def _heartbeat(self) -> None:
        raise NotImplementedError

    def _begin(self, run: WorkerRun, claimed_at: float) -> Child | None:
        raise NotImplementedError

    def _progress_to_write(self) -> dict[uuid.UUID, dict[str, Any]]:
        raise NotImplementedError

    def _child_deadlines(self, child: Child) -> list[tuple[float, Callable[[], None]]]:
        raise NotImplementedError
