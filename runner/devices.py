"""GPU devices through NVML (``pynvml`` from nvidia-ml-py) when it is importable and a GPU answers.

NVML is the driver's management library: it reads device names, memory and per-process memory without
creating a CUDA context, so the supervisor may use it (it must never initialise CUDA). Everything
returns empty results where NVML, the driver or a GPU is absent.
"""
from __future__ import annotations

import logging
from typing import Any

log = logging.getLogger("scrinalia.runner.devices")


class GpuProbe:
    def __init__(self) -> None:
        self._nvml: Any = None
        try:
            import pynvml  # type: ignore[import-not-found]

            pynvml.nvmlInit()
            if pynvml.nvmlDeviceGetCount() > 0:
                self._nvml = pynvml
            else:
                pynvml.nvmlShutdown()
        except Exception as exc:  # no package, no driver, no device: no GPU information
            log.debug("NVML unavailable: %s", type(exc).__name__)
            self._nvml = None

    def devices(self) -> list[dict[str, Any]]:
        """[{index, name, uuid, memory_total_bytes, driver}] for the registry row."""
        nvml = self._nvml
        if nvml is None:
            return []
        out = []
        try:
            driver = _text(nvml.nvmlSystemGetDriverVersion())
            for index in range(nvml.nvmlDeviceGetCount()):
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                memory = nvml.nvmlDeviceGetMemoryInfo(handle)
                out.append(
                    {
                        "index": index,
                        "name": _text(nvml.nvmlDeviceGetName(handle)),
                        "uuid": _text(nvml.nvmlDeviceGetUUID(handle)),
                        "memory_total_bytes": int(memory.total),
                        "driver": driver,
                    }
                )
        except Exception as exc:
            log.warning("NVML could not list the devices: %s", type(exc).__name__)
        return out

    def memory_by_pid(self) -> dict[int, int]:
        """GPU memory in use per process id, summed over the devices."""
        nvml = self._nvml
        if nvml is None:
            return {}
        usage: dict[int, int] = {}
        try:
            for index in range(nvml.nvmlDeviceGetCount()):
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                processes = list(nvml.nvmlDeviceGetComputeRunningProcesses(handle))
                try:
                    processes += list(nvml.nvmlDeviceGetGraphicsRunningProcesses(handle))
                except Exception:
                    pass
                for proc in processes:
                    used = getattr(proc, "usedGpuMemory", None)
                    if isinstance(used, int) and used >= 0:
                        usage[proc.pid] = usage.get(proc.pid, 0) + used
        except Exception as exc:
            log.debug("NVML per-process memory failed: %s", type(exc).__name__)
        return usage

    def close(self) -> None:
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                pass
            self._nvml = None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
