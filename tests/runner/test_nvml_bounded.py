"""NVML samples never hold the supervisor's loop (issue 9): a driver that does not answer (a GPU fallen
off the bus) makes the sample stale, not the loop late. There is no GPU here: the NVML module is a
stand-in whose calls block, the shape of a wedged driver."""
from __future__ import annotations

import threading
import time
from types import SimpleNamespace

from runner import devices
from runner.devices import GpuProbe


def _wedged_nvml(release: threading.Event) -> SimpleNamespace:
    def count() -> int:
        release.wait()
        return 1

    return SimpleNamespace(
        nvmlDeviceGetCount=count,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetComputeRunningProcesses=lambda h: [SimpleNamespace(pid=42, usedGpuMemory=1024)],
        nvmlDeviceGetGraphicsRunningProcesses=lambda h: [],
        nvmlDeviceGetUUID=lambda h: "GPU-x",
        nvmlDeviceGetMemoryInfo=lambda h: SimpleNamespace(free=7, total=9),
        nvmlShutdown=lambda: None,
    )


def test_a_wedged_driver_answers_the_last_sample_at_once():
    release = threading.Event()
    probe = GpuProbe.__new__(GpuProbe)
    probe._nvml = _wedged_nvml(release)
    probe._calls = devices._BoundedCalls(devices.NVML_WAIT)
    began = time.monotonic()
    assert probe.memory_by_pid() == {}          # waited NVML_WAIT, nothing known yet
    assert probe.memory_by_pid() == {}          # the first call is still in the driver: no wait at all
    assert time.monotonic() - began < devices.NVML_WAIT + 0.3
    assert probe._calls.late == 1
    release.set()                               # the driver answers again
    deadline = time.monotonic() + 5
    while probe.memory_by_pid() != {42: 1024}:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert probe.free_memory() == {"GPU-x": 7}
