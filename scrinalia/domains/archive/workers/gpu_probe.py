"""``gpu-probe``: what this runner's child sees of the GPU: CUDA name, memory, a short matmul timing.

It writes nothing to the archive; its result is the report. With no CUDA device it says so (and times
a small CPU matmul for comparison). An operator runs it to check a new GPU host end to end: the claim,
the child, the driver, torch's CUDA build.
"""
from __future__ import annotations

import platform
import time
from typing import Any

from sqlalchemy import Connection

from scrinalia.domains.archive.workers.sdk import OptionSpec, RunContext, WorkerSpec


def _matmul(torch, device, size: int, dtype, repeats: int) -> dict[str, Any]:
    a = torch.randn(size, size, device=device, dtype=dtype)
    b = torch.randn(size, size, device=device, dtype=dtype)
    torch.matmul(a, b)  # warm-up
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    for _ in range(repeats):
        torch.matmul(a, b)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds = (time.perf_counter() - start) / repeats
    return {"size": size, "dtype": str(dtype).replace("torch.", ""), "ms": round(seconds * 1000, 3),
            "tflops": round(2 * size ** 3 / seconds / 1e12, 3)}


def probe(unit: str, options: dict[str, Any]) -> dict[str, Any]:
    import torch

    if unit == "cpu":
        size = min(options["matmul_size"], 1024)
        return {"device": "cpu", "name": platform.processor() or platform.machine(),
                "threads": torch.get_num_threads(),
                "matmul": _matmul(torch, torch.device("cpu"), size, torch.float32, options["repeats"])}
    index = int(unit.split(":")[1])
    device = torch.device(unit)
    props = torch.cuda.get_device_properties(index)
    free, total = torch.cuda.mem_get_info(index)
    report = {"device": unit, "name": props.name, "capability": f"{props.major}.{props.minor}",
              "total_memory_mib": total // 2**20, "free_memory_mib": free // 2**20,
              "multiprocessors": props.multi_processor_count,
              "matmul": _matmul(torch, device, options["matmul_size"], torch.float16, options["repeats"])}
    torch.cuda.empty_cache()
    return report


def run(ctx: RunContext) -> dict[str, Any]:
    import torch

    cuda = torch.cuda.is_available()
    units = [f"cuda:{i}" for i in range(torch.cuda.device_count())] if cuda else []
    units.append("cpu")
    ctx.result.update(torch=torch.__version__, cuda_available=cuda, cuda_version=torch.version.cuda,
                      device_count=len(units) - 1, devices=[])
    if not cuda:
        ctx.result["message"] = "no CUDA device is visible to this process"
    queue = list(units)
    ctx.total = len(units)

    def fetch(conn: Connection, size: int) -> list[str]:
        taken, queue[:] = queue[:size], queue[size:]
        return taken

    for batch in ctx.batches(fetch):
        for unit in batch:
            try:
                ctx.result["devices"].append(probe(unit, ctx.options))
            except Exception as exc:  # a broken device is the report, not a crash
                ctx.result["devices"].append({"device": unit, "error": f"{type(exc).__name__}: {exc}"})
        ctx.tally(len(batch))
    return ctx.result


SPEC = WorkerSpec(
    name="gpu-probe",
    label="GPU probe",
    description="Reports the device a runner's child sees (CUDA name, memory, a short matmul timing, or "
                "that none is present). Writes nothing to the archive.",
    run=run,
    unit="device",
    governed=False,
    engine_source="none",
    stamp_key=None,
    default_batch_size=1,
    options={
        "matmul_size": OptionSpec("int", 4096, "side of the square matrices timed on a GPU", minimum=64,
                                  maximum=16384),
        "repeats": OptionSpec("int", 10, "timed multiplications", minimum=1, maximum=1000),
    },
    requires=("torch",),
)
