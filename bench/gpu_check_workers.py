"""The GPU check's own worker (``SCRINALIA_WORKER_PLUGINS=gpu_check_workers:ALL``, PYTHONPATH=bench):
a real CUDA error on the child's device. It holds 256 MiB on the GPU for ``hold_seconds`` (so that
``status`` shows its GPU memory beside the embedding run), then indexes a CUDA tensor out of range: the
index kernel's device-side assert, reported by torch as ``AcceleratorError: CUDA error: device-side
assert triggered`` at the next synchronisation. Its CUDA context is lost; the runner must name the
failure (``cuda-error``) and the next run on that device must succeed in a fresh child."""
from __future__ import annotations

import os
import time
from typing import Any

from scrinalia.domains.archive.workers.sdk import RunContext, WorkerSpec


def run_device_assert(ctx: RunContext) -> dict[str, Any]:
    import torch

    hold = float((ctx.config.options or {}).get("hold_seconds", 5.0))
    rehearsal = os.environ.get("GPU_CHECK_REHEARSAL") == "1"  # the script rehearsed on CPU
    block = torch.ones(64 * 2**20, device="cpu" if rehearsal else "cuda")  # 256 MiB on the child's own cuda:0
    deadline = time.monotonic() + hold

    def fetch(conn, size):
        if time.monotonic() >= deadline:
            return []
        time.sleep(0.1)
        return [1]

    for _ in ctx.batches(fetch):
        pass
    if rehearsal:
        raise torch.AcceleratorError("CUDA error: device-side assert triggered\n(rehearsal on CPU)")
    index = torch.tensor([10**6], device="cuda")
    value = block[:10][index]  # out of range: the kernel's CUDA_KERNEL_ASSERT fires on the device
    torch.cuda.synchronize()
    return {"unexpected": float(value.sum())}


ALL = [
    WorkerSpec(name="gpu-check-assert", label="GPU check: device-side assert",
               description="Triggers a device-side assert on its GPU (the GPU acceptance check).",
               run=run_device_assert, unit="step", default_batch_size=1, accepts_extra_options=True),
]
