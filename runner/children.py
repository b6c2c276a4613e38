"""One entry of the supervisor's table: a started run, its process, its channel and its output.

The run's phase and everything its outcome is decided from live in ``state`` (``runner.run_state``);
``Child`` holds what the supervisor observes of the process: its channel (the one path for what the
child says, and whose EOF is half of "the child has ended"), its output (relayed to the journal, its
tail kept for the error), its resources.
"""
from __future__ import annotations

import logging
import os
import socket
from dataclasses import dataclass, field
from typing import Any

from runner import wire
from runner.devices import Device
from runner.run_state import RunState
from runner.stall import StallWatch
from scrinalia.domains.archive.ledger import WorkerRun
from scrinalia.domains.archive.run_ids import short_id

log = logging.getLogger("scrinalia.runner")

OUTPUT_TAIL_BYTES = 16 * 1024
RELAY_LINE_MAX = 500


@dataclass(slots=True)
class Resources:
    """What the supervisor samples of a child (``status``, the GPU memory rule, the run's metrics)."""

    oom_kills_at_start: int | None = None
    rss_bytes: int | None = None
    gpu_bytes: int | None = None
    gpu_peak_bytes: int = 0


@dataclass(eq=False)
class Output:
    """The read end of a child's stdout+stderr pipe: relayed line by line, its tail kept."""

    fd: int | None
    tail: bytearray = field(default_factory=bytearray)
    partial_line: bytearray = field(default_factory=bytearray)

    def read(self, label: str) -> None:
        """Everything the pipe holds now; at EOF the last partial line is relayed and the pipe closed."""
        while self.fd is not None:
            try:
                data = os.read(self.fd, 65536)
            except BlockingIOError:
                return
            except OSError:
                data = b""
            if not data:
                self._relay(label, final=True)
                self.close()
                return
            self.tail += data
            if len(self.tail) > OUTPUT_TAIL_BYTES:
                del self.tail[: len(self.tail) - OUTPUT_TAIL_BYTES]
            self.partial_line += data
            self._relay(label)

    def _relay(self, label: str, final: bool = False) -> None:
        """The child's output, line by line, into the supervisor's log (the journal)."""
        *lines, rest = bytes(self.partial_line).split(b"\n")
        if final and rest:
            lines.append(rest)
            rest = b""
        self.partial_line = bytearray(rest[-OUTPUT_TAIL_BYTES:])
        for line in lines:
            text = line.decode("utf-8", errors="replace").rstrip("\r")
            if text.strip():
                log.info("[%s] %s", label, text[:RELAY_LINE_MAX])

    def tail_text(self, max_lines: int = 25) -> str:
        text = self.tail.decode("utf-8", errors="replace")
        return "\n".join(text.splitlines()[-max_lines:])

    def close(self) -> None:
        if self.fd is not None:
            try:
                os.close(self.fd)
            except OSError:
                pass
            self.fd = None


@dataclass(eq=False)
class Child:
    """A started run: the claimed row, the process that runs it, and its state machine."""

    run: WorkerRun
    pid: int
    channel: socket.socket
    output_fd: int | None
    claimed_at: float                    # CLOCK_MONOTONIC, just after the claim returned
    device: Device | None = None         # the GPU it was given (CUDA_VISIBLE_DEVICES), or None
    gpu_need_bytes: int | None = None    # the GPU memory its worker declared
    progress: dict[str, Any] | None = None
    progress_written: dict[str, Any] | None = None  # what record_progress last wrote for it
    resources: Resources = field(default_factory=Resources)
    stall: StallWatch | None = None      # its liveness while the worker runs (runner.stall, decision 0111)
    state: RunState = field(init=False)
    output: Output = field(init=False)
    reader: wire.FrameReader = field(init=False)

    def __post_init__(self) -> None:
        self.state = RunState(claimed_at=self.claimed_at)
        self.output = Output(self.output_fd)
        self.reader = wire.FrameReader(self.channel)

    @property
    def phase(self) -> str:
        return self.state.shown_phase

    @property
    def short_id(self) -> str:
        return short_id(self.run.run_id)

    @property
    def label(self) -> str:
        return f"run {self.short_id} {self.run.worker_name}"

    def read(self) -> list[wire.Message]:
        """The output and the messages the child has sent since the last read. Raises what the framing
        raises for bytes that are not the protocol (the caller kills the child)."""
        self.output.read(self.label)
        if self.reader.eof:
            return []
        return self.reader.read()

    def send(self, kind: str, payload: dict[str, Any] | None = None) -> None:
        try:
            self.channel.sendall(wire.encode(kind, payload))
        except (BlockingIOError, OSError) as exc:
            log.debug("child %d: %s not delivered: %s", self.pid, kind, exc)

    def close(self) -> None:
        try:
            self.channel.close()
        except OSError:
            pass
        self.output.close()

    def snapshot(self, now: float) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "run_id": str(self.run.run_id),
            "worker": self.run.worker_name,
            "phase": self.phase,
            "elapsed_seconds": round(now - self.claimed_at, 3),
            "progress": self.progress,
            "rss_bytes": self.resources.rss_bytes,
            "gpu_memory_bytes": self.resources.gpu_bytes,
            "device": self.device.describe() if self.device is not None else None,
            "cancel_requested": self.state.cancel_sent_at is not None,
        }
