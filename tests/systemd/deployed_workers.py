"""The workers of the real-systemd tests (tests/systemd/test_deployed.py), copied into the container's
virtualenv and named by ``SCRINALIA_WORKER_PLUGINS=deployed_workers:ALL`` in its runner.env: an operator's
plugin module, so it imports only the installed wheel.
"""
from __future__ import annotations

import time
from typing import Any

from scrinalia.domains.archive.workers.sdk import RunContext, WorkerSpec


def _option(ctx: RunContext, name: str, default: Any) -> Any:
    return (ctx.config.options or {}).get(name, default)


def run_slow(ctx: RunContext) -> dict[str, Any]:
    """``units`` batches of one unit, ``pause`` seconds each: a run in flight for as long as a test needs."""
    remaining = [int(_option(ctx, "units", 20))]
    pause = float(_option(ctx, "pause", 0.5))

    def fetch(conn: Any, size: int) -> list[int]:
        take = min(size, remaining[0])
        remaining[0] -= take
        return list(range(take))

    for batch in ctx.batches(fetch):
        time.sleep(pause)
        ctx.report_progress(ctx.done + len(batch), None, "unit")
    return {"processed": ctx.done}


def run_memory_hog(ctx: RunContext) -> None:
    """Touches 16 MiB more every few milliseconds until the kernel's OOM killer takes it (the unit's
    MemoryMax=); capped at ``cap_mb`` so a host without that limit raises MemoryError instead."""
    cap = int(_option(ctx, "cap_mb", 2048)) // 16
    hoard = []
    for _ in range(cap):
        block = bytearray(16 * 1024 * 1024)
        for i in range(0, len(block), 4096):
            block[i] = 1
        hoard.append(block)
        time.sleep(0.01)
    raise MemoryError(f"reached {cap * 16} MiB without an OOM kill")


def _spec(name: str, run: Any) -> WorkerSpec:
    return WorkerSpec(name=name, label=name, description=f"systemd test worker {name}", run=run, unit="unit",
                      default_batch_size=1, accepts_extra_options=True)


ALL = [_spec("deployed-slow", run_slow), _spec("deployed-memory-hog", run_memory_hog)]
