"""The runner's options (the daemon's flags) and the process exit codes."""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

from runner.timings import MIN_FENCE_MARGIN, MIN_STATEMENT_SECONDS, Timings

# Exit codes of `scrinalia-runner daemon` and `scrinalia-runner run` (docs/operations.md, "Runner").
EXIT_OK = 0
EXIT_FAILED = 1            # run: the run ended FAILED (or INTERRUPTED by a lost lease); daemon: crashed
EXIT_USAGE = 2             # a bad flag or option, an unknown worker
EXIT_SLOT_BUSY = 3         # run: the worker already has an active run (uq_worker_run_active)
EXIT_SCHEMA_BEHIND = 4     # the database's alembic_version is an older revision (or none): migrate first
EXIT_DATABASE = 5          # the database did not answer at start
EXIT_ALREADY_RUNNING = 6   # daemon: a live supervisor already answers on this control socket
EXIT_SCHEMA_AHEAD = 7      # the database's alembic_version is a revision this runner does not know: upgrade it
EXIT_CANCELLED = 130       # run: the run ended CANCELLED (or was interrupted by a second Ctrl-C)


def exit_with(code: int, message: str) -> NoReturn:
    """End a command with one of the codes above and one line on stderr saying why (what systemd's journal
    and an operator's terminal show)."""
    print(f"scrinalia-runner: {message}", file=sys.stderr, flush=True)
    sys.exit(code)

DEFAULT_PRELOAD = ("torch", "transformers")
DEFAULT_STALL_TIMEOUT = 600.0  # a child silent (no message, no CPU) this long is stalled: fits a slow GPU batch
START_METHODS = ("forkserver", "spawn")
DEFAULT_WARM_LIMIT_MB = 4096
WARM_DTYPES = ("float32", "float16", "bfloat16")


class OptionsError(ValueError):
    """A flag value that cannot work; the message says which and why."""


@dataclass(frozen=True, slots=True)
class RunnerOptions:
    name: str
    capabilities: tuple[str, ...] | None = None  # None: every worker of the catalogue
    concurrency: int = 1
    heartbeat_seconds: float = 15.0
    lease_seconds: float = 60.0
    poll_seconds: float = 2.0
    listen: bool = True               # claim on the ledger's notification (decision 0080)
    listen_poll_seconds: float = 10.0  # the poll while the LISTEN is up: only the safety net
    drain_timeout: float = 120.0
    max_runtime: float | None = None
    cancel_grace: float = 60.0
    kill_grace: float = 5.0  # between SIGTERM and SIGKILL when the supervisor stops a child
    preload: tuple[str, ...] = DEFAULT_PRELOAD
    start_method: str = "forkserver"
    socket_path: Path | None = None
    devices: str = "auto"   # auto | none | a comma-separated list of indexes or UUIDs (runner.devices)
    per_device: int = 1     # children sharing one device
    stall_timeout: float = DEFAULT_STALL_TIMEOUT  # 0: never (a worker's WorkerSpec.stall_timeout wins)
    warm_models: str = "auto"  # auto | none | DIR[:DTYPE],... (runner.warm_models, decision 0340)
    warm_limit_mb: int = DEFAULT_WARM_LIMIT_MB  # what the fork server may hold of warm models
    standby: bool = True  # the fork server keeps a child forked ahead (decision 0341)

    def validate(self) -> RunnerOptions:
        """This runner's options if every flag can work; else ``OptionsError`` for the first that cannot,
        checked in the order below (the flag an operator reads first is named first)."""
        self._check_name_and_slots()
        self._check_lease()
        self._check_cadences()
        self._check_fence_timings()
        self._check_devices()
        self._check_warm_models()
        if self.start_method not in START_METHODS:
            raise OptionsError(f"--start-method must be one of {', '.join(START_METHODS)}")
        return self

    def _check_name_and_slots(self) -> None:
        if not self.name or not self.name.strip():
            raise OptionsError("--name must not be empty")
        if self.concurrency < 1:
            raise OptionsError(f"--concurrency must be at least 1, got {self.concurrency}")

    def _check_lease(self) -> None:
        """The heartbeat renews the lease: it must come more often than the lease lasts."""
        if self.heartbeat_seconds <= 0:
            raise OptionsError(f"--heartbeat must be positive, got {self.heartbeat_seconds}")
        if self.lease_seconds <= self.heartbeat_seconds:
            raise OptionsError(
                f"--lease ({self.lease_seconds:g} s) must exceed --heartbeat ({self.heartbeat_seconds:g} s): "
                "a lease that is not longer than the interval that renews it expires between two heartbeats "
                "(the default is --heartbeat 15 --lease 60)"
            )

    def _check_devices(self) -> None:
        """``--per-device`` and ``--devices`` as ``runner.devices`` reads them (no device is looked at)."""
        if self.per_device < 1:
            raise OptionsError(f"--per-device must be at least 1, got {self.per_device}")
        from runner.devices import DeviceError, parse_devices

        try:
            parse_devices(self.devices)
        except DeviceError as exc:
            raise OptionsError(str(exc)) from None

    def _check_warm_models(self) -> None:
        """``--warm-limit-mb`` never negative; each ``DIR:DTYPE`` of a listed ``--warm-models`` a known dtype."""
        if self.warm_limit_mb < 0:
            raise OptionsError(f"--warm-limit-mb must not be negative (0: no model warm), got {self.warm_limit_mb}")
        if self.warm_models.strip() in ("auto", "none"):
            return
        for item in self.warm_models.split(","):
            dtype = item.strip().partition(":")[2]
            if dtype and dtype not in WARM_DTYPES:
                raise OptionsError(f"--warm-models: {item.strip()!r}: the dtype must be one of "
                                   f"{', '.join(WARM_DTYPES)}")

    def _check_cadences(self) -> None:
        """The polls, the graces and the limits: positive where they are intervals, never negative."""
        if self.poll_seconds <= 0:
            raise OptionsError(f"--poll must be positive, got {self.poll_seconds}")
        if self.listen_poll_seconds <= 0:
            raise OptionsError(f"--listen-poll must be positive, got {self.listen_poll_seconds}")
        if self.drain_timeout < 0:
            raise OptionsError("--drain-timeout must not be negative")
        if self.max_runtime is not None and self.max_runtime <= 0:
            raise OptionsError("--max-runtime must be positive")
        if self.cancel_grace < 0 or self.kill_grace < 0:
            raise OptionsError("--cancel-grace and --kill-grace must not be negative")
        if self.stall_timeout < 0:
            raise OptionsError(f"--stall-timeout must not be negative (0 turns it off), got {self.stall_timeout:g}")

    @property
    def timings(self) -> Timings:
        """Every time quantity of this runner, derived from its flags in one place (``runner.timings``)."""
        return Timings.derive(self)

    # The derived bounds, by their historical names (``runner.database`` reads them): ``runner.timings``.

    @property
    def fence_margin(self) -> float:
        return self.timings.fence_margin

    @property
    def statement_seconds(self) -> float:
        return self.timings.statement_seconds

    @property
    def server_statement_seconds(self) -> float:
        return self.timings.server_statement_seconds

    @property
    def connect_seconds(self) -> float:
        return self.timings.connect_seconds

    @property
    def spawn_seconds(self) -> float:
        return self.timings.spawn_seconds

    def _check_fence_timings(self) -> None:
        """Refuse heartbeat/lease pairs under which the self-fence could not keep its promise: the children
        dead before the lease ends, a statement bound that leaves a retry before the fence point."""
        hint = "raise --lease (or lower --heartbeat); the default is --heartbeat 15 --lease 60"
        if self.fence_margin < MIN_FENCE_MARGIN:
            raise OptionsError(
                f"--heartbeat {self.heartbeat_seconds:g} --lease {self.lease_seconds:g} leave a fence margin of "
                f"{self.fence_margin:g} s (min(heartbeat, lease - heartbeat) / 2): the supervisor needs at least "
                f"{MIN_FENCE_MARGIN:g} s between abandoning a database statement and the lease end to kill its "
                f"children; {hint}"
            )
        if self.statement_seconds < MIN_STATEMENT_SECONDS:
            raise OptionsError(
                f"--heartbeat {self.heartbeat_seconds:g} --lease {self.lease_seconds:g} leave "
                f"{self.statement_seconds:.3g} s for one database statement "
                "((lease - fence margin - heartbeat) / 2: a failed heartbeat must be retried before the fence "
                f"point), less than {MIN_STATEMENT_SECONDS:g} s; {hint}"
            )

    @property
    def expiry_seconds(self) -> float:
        return self.timings.expiry_seconds


def parse_list(value: str | None) -> tuple[str, ...]:
    """'a, b,,c' -> ('a', 'b', 'c'); 'none' or '' -> ()."""
    if value is None:
        return ()
    items = tuple(v.strip() for v in value.split(",") if v.strip())
    return () if items in {("none",), ("-",)} else items


def system_runtime_dir() -> Path:
    """The systemd unit's ``RuntimeDirectory=scrinalia-runner``: /run/scrinalia-runner
    (``SCRINALIA_RUNNER_SYSTEM_DIR`` names another, for a unit that moved it)."""
    return Path(os.environ.get("SCRINALIA_RUNNER_SYSTEM_DIR") or "/run/scrinalia-runner")


def runtime_dir() -> Path:
    """Where a daemon puts its control socket: $RUNTIME_DIRECTORY (systemd), $XDG_RUNTIME_DIR/scrinalia-runner,
    else /run/scrinalia-runner."""
    explicit = os.environ.get("RUNTIME_DIRECTORY")
    if explicit:
        return Path(explicit.split(":")[0])
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    if xdg:
        return Path(xdg) / "scrinalia-runner"
    return system_runtime_dir()


def status_dirs() -> list[Path]:
    """Where ``status`` looks for sockets: this session's directory (``runtime_dir``) and the systemd
    runner's, once each. An admin's SSH login has an $XDG_RUNTIME_DIR of its own, while the systemd
    runner's socket is under /run/scrinalia-runner: looking only in the first found nothing."""
    dirs: list[Path] = []
    for directory in (runtime_dir(), system_runtime_dir()):
        if directory not in dirs:
            dirs.append(directory)
    return dirs


def default_socket_path(name: str) -> Path:
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in name) or "runner"
    return runtime_dir() / f"{safe}.sock"
