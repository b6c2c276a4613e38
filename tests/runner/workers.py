"""Test workers, registered in real runner processes with
``SCRINALIA_WORKER_PLUGINS=tests.runner.workers:ALL`` (PYTHONPATH = the repository root).

Options (``request["options"]``) steer them; ``accepts_extra_options`` lets the tests pass anything.
"""
from __future__ import annotations

import ctypes
import os
import resource
import signal
import time
from typing import Any

from scrinalia.domains.archive.workers.sdk import RunContext, WorkerSpec


def _opt(ctx: RunContext, name: str, default: Any) -> Any:
    return (ctx.config.options or {}).get(name, default)


def _count_batches(ctx: RunContext, units: int, pause: float, hold: str | None = None) -> dict[str, Any]:
    """``units`` units in batches of db_batch_size, ``pause`` seconds each, honouring cancellation.
    ``hold``: a path; the last batch waits until it exists (at most 120 s), so a test keeps the run
    RUNNING exactly as long as it needs instead of for a fixed time long enough for a loaded machine."""
    remaining = [units]

    def fetch(conn, size):
        take = min(size, remaining[0])
        remaining[0] -= take
        return list(range(take))

    for batch in ctx.batches(fetch):
        if hold and remaining[0] == 0:
            deadline = time.monotonic() + 120
            while not os.path.exists(hold) and time.monotonic() < deadline:
                time.sleep(0.02)
        time.sleep(pause)
        ctx.report_progress(ctx.done + len(batch), units, "unit")
        ctx.result["processed"] = ctx.done
    return {"processed": ctx.done}


def run_ok(ctx: RunContext) -> dict[str, Any]:
    return _count_batches(ctx, int(_opt(ctx, "units", 4)), float(_opt(ctx, "pause", 0.0)))


def run_slow(ctx: RunContext) -> dict[str, Any]:
    return _count_batches(ctx, int(_opt(ctx, "units", 100)), float(_opt(ctx, "pause", 0.2)), _opt(ctx, "hold", None))


def run_raises(ctx: RunContext) -> None:
    raise ValueError(f"boom in run {ctx.run.run_id}")


def run_segfault(ctx: RunContext) -> None:
    ctypes.string_at(0)


def run_warm_vandal(ctx: RunContext) -> dict[str, Any]:
    """Builds the embedding engine from the fork server's warm copy, overwrites every weight in place, then
    segfaults: the fork server's copy (copy-on-write) must not see a byte of it."""
    from scrinalia.domains.archive.workers.embedding import SPEC as EMBEDDING
    from scrinalia.domains.archive.workers.engines import warm

    options = {"model": _opt(ctx, "model", None), "device": "cpu", "dtype": "float32", "batch_size": 32,
               "max_length": 256}
    engine = EMBEDDING.engines["transformers"].load(options)
    print(f"warm load: {warm.LOADS[-1]['warm']}", flush=True)
    for parameter in engine.model.parameters():
        parameter.data.fill_(1.0)
    ctypes.string_at(0)
    return {}


def run_exit3(ctx: RunContext) -> None:
    print("about to os._exit(3)", flush=True)
    os._exit(3)


def run_hang(ctx: RunContext) -> None:
    """Ignores cancellation and SIGTERM-free: it never reaches a batch boundary."""
    print("hanging", flush=True)
    while True:
        time.sleep(0.1)


def run_memory_hog(ctx: RunContext) -> None:
    """Grows its memory 16 MiB at a time until something kills it.

    Safe on a shared machine: RLIMIT_AS caps the process at its current size + ``cap_mb`` (default
    512 MiB), beyond which an allocation fails with MemoryError instead of growing further.
    """
    cap = int(_opt(ctx, "cap_mb", 512)) * 1024 * 1024
    with open("/proc/self/statm") as fh:
        size = int(fh.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    resource.setrlimit(resource.RLIMIT_AS, (size + cap, size + cap))
    hoard = []
    while True:
        block = bytearray(16 * 1024 * 1024)
        for i in range(0, len(block), 4096):
            block[i] = 1  # touch every page: resident, not just reserved
        hoard.append(block)
        ctx.report_progress(len(hoard) * 16, None, "MiB")
        time.sleep(0.05)


def run_sigterm_ignorer(ctx: RunContext) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    run_hang(ctx)


def run_committer(ctx: RunContext) -> dict[str, Any]:
    """Slow batches, each written through RunContext.commit (the lease fence)."""
    from sqlalchemy import text

    remaining = [int(_opt(ctx, "units", 1000))]

    def fetch(conn, size):
        take = min(size, remaining[0])
        remaining[0] -= take
        return list(range(take))

    for batch in ctx.batches(fetch):
        time.sleep(float(_opt(ctx, "pause", 0.1)))
        ctx.commit(lambda conn: conn.execute(text("SELECT 1")))
        ctx.report_progress(ctx.done + len(batch), None, "unit")
    return {"processed": ctx.done}


#: The table the ``stamper`` workers stamp (created by a test with ``STAMPER_TABLE_SQL``): one row per unit,
#: keyed by the worker that owns it; a stamp is idempotent like the archive's (``done_by IS NULL``).
STAMPER_TABLE_SQL = """
CREATE TABLE IF NOT EXISTS fence_units (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    worker text NOT NULL,
    done_by uuid,
    done_batch int,
    done_count int NOT NULL DEFAULT 0,
    done_xact_at timestamptz
);
CREATE INDEX IF NOT EXISTS ix_fence_units_pending ON fence_units (worker, id) WHERE done_by IS NULL;
"""


def run_stamper(ctx: RunContext) -> dict[str, Any]:
    """Stamps its worker's pending ``fence_units`` rows, one fenced ``RunContext.commit`` per batch.

    Options: ``pause`` (seconds before each commit), ``hold_at`` (a batch number) with ``hold`` (seconds
    to sleep INSIDE that batch's transaction) or ``until`` (a file: wait inside the transaction until it
    exists); at the hold it prints ``in-commit <batch>``. ``units``: at most that many units per run.
    """
    from sqlalchemy import bindparam, text
    from sqlalchemy.dialects.postgresql import ARRAY
    from sqlalchemy.types import BigInteger

    worker = ctx.run.worker_name
    limit = [int(_opt(ctx, "units", 1_000_000))]
    pause = float(_opt(ctx, "pause", 0.0))
    hold_at, hold, until = int(_opt(ctx, "hold_at", 0)), float(_opt(ctx, "hold", 0.0)), _opt(ctx, "until", None)
    fetch_sql = text("SELECT id FROM fence_units WHERE worker = :w AND done_by IS NULL ORDER BY id LIMIT :n")
    stamp_sql = text(
        "UPDATE fence_units SET done_by = :run, done_batch = :batch, done_count = done_count + 1, "
        "done_xact_at = now() WHERE id = ANY(:ids) AND done_by IS NULL"
    ).bindparams(bindparam("ids", type_=ARRAY(BigInteger)))
    ctx.total = min(limit[0], ctx.total or limit[0])

    def fetch(conn, size):
        take = min(size, limit[0])
        if take <= 0:
            return []
        return [r.id for r in conn.execute(fetch_sql, {"w": worker, "n": take})]

    for batch in ctx.batches(fetch):
        if pause:
            time.sleep(pause)
        number = ctx.batch_index

        def write(conn, number=number, batch=batch):
            written = conn.execute(stamp_sql, {"run": str(ctx.run_id), "batch": number, "ids": batch}).rowcount
            if number == hold_at:
                print(f"in-commit {number}", flush=True)
                if until:
                    while not os.path.exists(until):
                        time.sleep(0.05)
                else:
                    time.sleep(hold)
            return written

        written = ctx.commit(write)
        limit[0] -= len(batch)
        ctx.tally(len(batch), stamped=written)
    return dict(ctx.result)


def run_session_settings(ctx: RunContext) -> dict[str, Any]:
    """Reports the bounds its own database session runs under (decision 0101, 0102)."""
    from sqlalchemy import text

    names = ("statement_timeout", "lock_timeout", "idle_in_transaction_session_timeout",
             "tcp_keepalives_idle", "tcp_keepalives_interval", "tcp_keepalives_count", "tcp_user_timeout")
    with ctx.engine.connect() as conn:
        return {n: conn.execute(text(f"SHOW {n}")).scalar_one() for n in names}


def run_noop(ctx: RunContext) -> dict[str, Any]:
    return {"noop": True}


def run_device_report(ctx: RunContext) -> dict[str, Any]:
    """Reports the device its child was given, and holds it until the file ``until`` exists."""
    seen = {"cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
            "cuda_device_order": os.environ.get("CUDA_DEVICE_ORDER")}
    print(f"CUDA_VISIBLE_DEVICES={seen['cuda_visible_devices']!r}", flush=True)
    until = _opt(ctx, "until", None)

    def fetch(conn, size):
        if until is None or os.path.exists(until):
            return []
        time.sleep(0.05)
        return [1]

    for _ in ctx.batches(fetch):
        pass
    if _opt(ctx, "torch_device", False):  # what a GPU worker would pick (engines.common.torch_device)
        from scrinalia.domains.archive.workers.engines.common import torch_device

        seen["torch_device"] = str(torch_device("auto"))
    return seen


# The texts torch 2.x raises for CUDA failures (c10's CUDA_CHECK and the caching allocator), raised
# here without a GPU through the same exception classes.
ASSERT_TEXT = (
    "CUDA error: device-side assert triggered\n"
    "Search for `cudaErrorAssert' in https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__TYPES.html "
    "for more information.\n"
    "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below "
    "might be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
    "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n"
)
KERNEL_ASSERT_LINE = ("/pytorch/aten/src/ATen/native/cuda/IndexKernel.cu:111: operator(): block: [{b},0,0], "
                      "thread: [{t},0,0] Assertion `-sizes[i] <= index && index < sizes[i] && \"index out of "
                      "bounds\"` failed.")
OOM_TEXT = (
    "CUDA out of memory. Tried to allocate {gib}.00 GiB. GPU {gpu} has a total capacity of 79.19 GiB of which "
    "{free} MiB is free. Including non-PyTorch memory, this process has 78.63 GiB memory in use. Of the "
    "allocated memory 77.10 GiB is allocated by PyTorch, and 1.02 GiB is reserved by PyTorch but unallocated. "
    "If reserved but unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True "
    "to avoid fragmentation.  See documentation for Memory Management  "
    "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
)
ILLEGAL_ACCESS_ABORT = (
    "terminate called after throwing an instance of 'c10::AcceleratorError'\n"
    "  what():  CUDA error: an illegal memory access was encountered\n"
    "Search for `cudaErrorIllegalAddress' in https://docs.nvidia.com/cuda/cuda-runtime-api/"
    "group__CUDART__TYPES.html for more information.\n"
    "Exception raised from c10_cuda_check_implementation at /pytorch/c10/cuda/CUDAException.cpp:44 "
    "(most recent call first):\n"
)


def run_cuda_assert(ctx: RunContext) -> None:
    import torch

    n = int(_opt(ctx, "n", 1))
    print(KERNEL_ASSERT_LINE.format(b=n, t=n * 7), flush=True)
    raise torch.AcceleratorError(ASSERT_TEXT)


def run_cuda_oom(ctx: RunContext) -> None:
    import torch

    n = int(_opt(ctx, "n", 1))
    raise torch.OutOfMemoryError(OOM_TEXT.format(gib=2 ** n, gpu=n % 2, free=100 + n))


def run_cuda_abort(ctx: RunContext) -> None:
    """A CUDA error thrown where Python cannot catch it (a C++ destructor, a CUDA callback): std::terminate."""
    os.write(2, ILLEGAL_ACCESS_ABORT.encode())
    os.abort()


def _spec(name: str, run, batch: int = 1, **declared: Any) -> WorkerSpec:
    return WorkerSpec(
        name=name, label=name, description=f"test worker {name}", run=run, unit="unit",
        default_batch_size=batch, accepts_extra_options=True, **declared,
    )


ALL = [
    _spec("ok", run_ok),
    _spec("slow", run_slow),
    _spec("slow-b", run_slow),
    _spec("raises", run_raises),
    _spec("segfault", run_segfault),
    _spec("warm-vandal", run_warm_vandal),
    _spec("exit3", run_exit3),
    _spec("hang", run_hang),
    _spec("memory-hog", run_memory_hog),
    _spec("stubborn", run_sigterm_ignorer),
    _spec("noop", run_noop),
    _spec("session-settings", run_session_settings),
    _spec("committer", run_committer),
    *[_spec(f"stamper-{c}", run_stamper, batch=2) for c in "abcdefgh"],
    *[_spec(f"sleepy-{i:02d}", run_slow) for i in range(16)],
    *[_spec(f"gpu-{c}", run_device_report) for c in "abc"],
    _spec("cpu-only", run_device_report, gpu=False),
    _spec("gpu-big", run_device_report, gpu_memory_bytes=10 * 2**30),
    _spec("cuda-assert", run_cuda_assert),
    _spec("cuda-oom", run_cuda_oom),
    _spec("cuda-abort", run_cuda_abort),
]


def run_sessions(ctx: RunContext) -> dict[str, Any]:
    """Touches no database: reports how many sessions its engine opened (the resolver's read included)."""
    pool: Any = ctx.engine.pool  # a QueuePool: counts its connections
    return {"sessions": pool.checkedin() + pool.checkedout(), "options": dict(ctx.options)}


ALL.append(_spec("sessions", run_sessions))


def resolve_where(spec: WorkerSpec, engine: Any, request: Any, layer: Any = None) -> Any:
    """A custom resolver that says which process ran it (the supervisor resolves at claim, once, from the
    ``layer`` it read through the ledger port), and refuses a request with ``options.refuse`` (a
    configuration error found at claim)."""
    import dataclasses

    from scrinalia.domains.archive.workers.sdk import InvalidOption, resolve_config

    if (request.get("options") or {}).get("refuse"):
        raise InvalidOption("options.refuse", "refused by the resolver at claim")
    resolved = resolve_config(spec, engine, request, layer=layer)
    return dataclasses.replace(resolved, config={**resolved.config, "resolved_in_pid": os.getpid()})


def run_first_look(ctx: RunContext) -> dict[str, Any]:
    """Its first line reads its own run: what record_start wrote before any of the worker's code ran."""
    from scrinalia.domains.archive import ledger

    run = ledger.get_run(ctx.engine, ctx.run.run_id)
    assert run is not None
    return {"status": run.status, "config": run.config, "options": run.options, "child_pid": os.getpid(),
            "resolved_in_pid": ctx.config.config.get("resolved_in_pid")}


ALL.append(_spec("first-look", run_first_look, resolver=resolve_where))


def run_late_result(ctx: RunContext) -> dict[str, Any] | None:
    """The child exits at once without a result; a process it forked still holds the channel and sends
    the run's result a moment later (what the child's channel says, the finisher reads)."""
    if os.fork() == 0:
        time.sleep(float(_opt(ctx, "delay", 0.5)))
        return {"late": True}  # the forked process returns into child_main, which sends the result
    os._exit(0)


ALL.append(_spec("late-result", run_late_result))


# --- liveness (issue 9): stalled children, one long C call, silent CPU work -----------------------


def run_stall(ctx: RunContext) -> None:
    """Sleeps forever without progress: a stalled child (no message, no CPU)."""
    print("stalling", flush=True)
    while True:
        time.sleep(0.5)


def run_quiet_then_done(ctx: RunContext) -> dict[str, Any]:
    """Silent for ``seconds`` (no message, no CPU), then done."""
    time.sleep(float(_opt(ctx, "seconds", 5.0)))
    return {"quiet": True}


def run_c_call(ctx: RunContext) -> dict[str, Any]:
    """One C call that holds the GIL for ``seconds`` (libc sleep through ctypes.PyDLL, which keeps the
    GIL): no thread of the child runs, nothing is sent, no CPU is used."""
    libc = ctypes.PyDLL(None)
    libc.sleep.argtypes = [ctypes.c_uint]
    libc.sleep(int(_opt(ctx, "seconds", 5)))
    return {"slept": int(_opt(ctx, "seconds", 5))}


def run_busy_silent(ctx: RunContext) -> dict[str, Any]:
    """Burns CPU for about ``seconds`` in ONE C call (PBKDF2, its iterations calibrated first), without a
    message: alive, by its CPU time."""
    import hashlib

    began = time.monotonic()
    hashlib.pbkdf2_hmac("sha256", b"stall", b"salt", 200_000)
    per_iteration = max(1e-9, (time.monotonic() - began) / 200_000)
    iterations = int(float(_opt(ctx, "seconds", 10.0)) / per_iteration)
    hashlib.pbkdf2_hmac("sha256", b"stall", b"salt", iterations)
    return {"iterations": iterations}


ALL.extend([
    _spec("stall", run_stall),
    _spec("quiet-unwatched", run_quiet_then_done, stall_timeout=0),
    _spec("c-call", run_c_call),
    _spec("busy-silent", run_busy_silent),
])
