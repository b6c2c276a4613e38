"""CUDA failures named from the texts torch and the CUDA runtime print (no torch import: the runner's
parent classifies a dead child's error and stderr tail with it, and the API never imports torch).

A CUDA error that is not an out-of-memory is *sticky*: the process's CUDA context is lost and every
later CUDA call fails the same way, so it is the process's failure, never one document's. A CUDA
out-of-memory is not sticky (the allocator raised before the kernel ran) and is a different operator
action (a smaller batch, fewer children per device) from the kernel's OOM killer on host memory.

``classify`` returns the failure with a *stable* name: the first line of a run's error is what the
ledger fingerprints, so it must not carry the sizes, device numbers or addresses of one occurrence.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

CUDA_OOM = "cuda-oom"
CUDA_ERROR = "cuda-error"


@dataclass(frozen=True, slots=True)
class CudaFailure:
    exit_reason: str  # cuda-oom | cuda-error (archive_worker_runs.exit_reason)
    name: str         # stable: "out of memory", "device-side assert triggered", "CUBLAS_STATUS_EXECUTION_FAILED"

    @property
    def sticky(self) -> bool:
        """The CUDA context of the process is lost (everything after fails too)."""
        return self.exit_reason == CUDA_ERROR

    def headline(self) -> str:
        """The first line of the run's error: ``CudaOutOfMemory: ...`` or ``CudaError: <name>``."""
        if self.exit_reason == CUDA_OOM:
            return "CudaOutOfMemory: CUDA out of memory on the child's device"
        return f"CudaError: {self.name}"


# In order: out-of-memory first (``CUDA error: out of memory`` is the driver's OOM), then the runtime's
# ``CUDA error: <text>`` lines, then the library status codes and the driver's own errors.
_OOM = re.compile(r"CUDA out of memory|CUDA error: out of memory|CUBLAS_STATUS_ALLOC_FAILED|"
                  r"CUDNN_STATUS_ALLOC_FAILED|cudaErrorMemoryAllocation")
_RUNTIME = re.compile(r"CUDA error: ([A-Za-z][^\n.:]*)")
_DRIVER = re.compile(r"CUDA driver error: ([A-Za-z][^\n.:]*)")
_LIBRARY = re.compile(r"\b((?:CUBLAS|CUDNN|CUSOLVER|CUFFT|CUSPARSE)_STATUS_[A-Z_]+)\b")
_ASSERT = re.compile(r"device-side assert(?:ion)? triggered|Assertion `[^`]*` failed")


def classify(*texts: str | None) -> CudaFailure | None:
    """The CUDA failure that ``texts`` (a run's error, then the child's output tail) report, or None."""
    for text in texts:
        if not text:
            continue
        if _OOM.search(text):
            return CudaFailure(CUDA_OOM, "out of memory")
        for pattern in (_RUNTIME, _DRIVER, _LIBRARY):
            match = pattern.search(text)
            if match:
                return CudaFailure(CUDA_ERROR, match.group(1).strip())
        if _ASSERT.search(text):
            return CudaFailure(CUDA_ERROR, "device-side assert triggered")
    return None


def is_sticky_cuda_error(exc: BaseException) -> bool:
    """An exception that lost the process's CUDA context: retrying unit by unit would only fail each unit."""
    failure = classify(f"{type(exc).__name__}: {exc}")
    return failure is not None and failure.sticky
