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
    """What every child's assignment carries, and the catalogue the supervisor resolves with."""

    database_url: str
    connect_args: dict[str, Any]
    catalogue: Mapping[str, Any] | None = None  # None: loaded when first needed


@dataclass(slots=True)
class Uptime:
    wall: float
    mono: float
