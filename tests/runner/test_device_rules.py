"""The pure parts of the GPU host: the device inventory, the slot and memory rule, CUDA failure names."""
from __future__ import annotations

import signal
from datetime import UTC

import pytest

from runner.devices import (
    Device,
    DeviceError,
    DevicePlanner,
    GpuNeed,
    Placement,
    child_env,
    inventory,
    needs_of,
    parse_devices,
)
from runner.launchers import ChildExit
from runner.options import OptionsError, RunnerOptions
from runner.outcome import decide
from scrinalia.domains.archive.workers.base import SystematicFailure, per_unit
from scrinalia.domains.archive.workers.cuda import classify, is_sticky_cuda_error
from scrinalia.domains.archive.workers.sdk import EngineSpec, Preset, WorkerSpec
from tests.runner.workers import ASSERT_TEXT, ILLEGAL_ACCESS_ABORT, KERNEL_ASSERT_LINE, OOM_TEXT

GiB = 2**30
NVML = [
    {"index": 0, "uuid": "GPU-aaaa", "name": "NVIDIA H200", "memory_total_bytes": 140 * GiB, "driver": "570"},
    {"index": 1, "uuid": "GPU-bbbb", "name": "NVIDIA H200", "memory_total_bytes": 140 * GiB, "driver": "570"},
]


# --- the inventory -------------------------------------------------------------------------------


def test_devices_auto_none_and_lists():
    assert parse_devices("auto") == "auto" and parse_devices(None) == "auto" and parse_devices("none") == "none"
    assert parse_devices("0, 1") == ("0", "1")
    assert parse_devices("GPU-aaaa,1") == ("GPU-aaaa", "1")
    for bad in ("0,0", "cuda:0", ","):
        with pytest.raises(DeviceError):
            parse_devices(bad)
    with pytest.raises(OptionsError, match="--per-device"):
        RunnerOptions(name="x", per_device=0).validate()
    with pytest.raises(OptionsError, match="neither an index"):
        RunnerOptions(name="x", devices="cuda:1").validate()

    assert [d.key for d in inventory("auto", NVML)] == ["GPU-aaaa", "GPU-bbbb"]
    assert inventory("auto", []) == []  # no NVML: no device; the children then see none
    assert inventory("none", NVML) == []
    assert [d.uuid for d in inventory(("1",), NVML)] == ["GPU-bbbb"]  # an index is NVML's (PCI bus order)
    assert [d.index for d in inventory(("GPU-aaaa",), NVML)] == [0]
    with pytest.raises(DeviceError, match="no device '7'"):
        inventory(("7",), NVML)
    # Without NVML an explicit list is taken as given: the slots work, the memory rule does not apply.
    assert inventory(("0", "1"), []) == [Device(0, None), Device(1, None)]


def test_a_child_sees_its_own_device_or_none():
    assert child_env(Device(0, "GPU-aaaa")) == {"CUDA_VISIBLE_DEVICES": "GPU-aaaa", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert child_env(Device(1, None)) == {"CUDA_VISIBLE_DEVICES": "1", "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
    assert child_env(None) == {"CUDA_VISIBLE_DEVICES": ""}


def test_the_declared_gpu_memory_of_a_worker_its_engines_and_presets():
    engine = EngineSpec("e", "", load=lambda o: None, gpu_memory_bytes=2 * GiB,
                        presets={"big": Preset("big", "", {}, gpu_memory_bytes=6 * GiB), "cpu": Preset("cpu", "", {})})
    spec = WorkerSpec(name="w", label="w", description="", run=lambda ctx: None, engines={"e": engine})
    assert spec.gpu_memory_needed() == 6 * GiB  # decided before the claim: the largest, the safe side
    own = WorkerSpec(name="v", label="v", description="", run=lambda ctx: None, gpu_memory_bytes=GiB,
                     engines={"e": engine})
    cpu = WorkerSpec(name="c", label="c", description="", run=lambda ctx: None, gpu=False, engines={"e": engine})
    assert needs_of({"w": spec, "v": own, "c": cpu}) == {
        "w": GpuNeed(True, 6 * GiB), "v": GpuNeed(True, GiB), "c": GpuNeed(False, None)}
    assert spec.signature()["gpu"] is True and spec.signature()["gpu_memory_bytes"] == 6 * GiB


# --- slots and memory ----------------------------------------------------------------------------


def _planner(per_device=1, free=None, needs=None, devices=None):
    devices = devices if devices is not None else [Device(0, "GPU-aaaa", "H200", 140 * GiB),
                                                   Device(1, "GPU-bbbb", "H200", 140 * GiB)]
    needs = needs or {"gpu-a": GpuNeed(), "gpu-b": GpuNeed(), "cpu": GpuNeed(gpu=False)}
    return DevicePlanner(devices, per_device, needs, free_memory=(lambda: dict(free)) if free is not None else None)


def test_a_gpu_worker_is_claimable_only_while_a_device_slot_is_free():
    p = _planner()
    caps = ["gpu-a", "gpu-b", "cpu"]
    assert p.claimable(caps, []) == caps
    first = p.place("gpu-a", [])
    second = p.place("gpu-b", [Placement(first.key, None, None)])
    assert {first.key, second.key} == {"GPU-aaaa", "GPU-bbbb"}  # spread: never the same device
    both = [Placement(first.key, None, None), Placement(second.key, None, None)]
    assert p.claimable(caps, both) == ["cpu"]  # the claim then looks only at CPU-only workers
    assert p.place("cpu", both) is None  # a CPU-only worker takes no slot
    assert _planner(per_device=2).claimable(caps, both) == caps
    assert _planner(devices=[]).claimable(caps, both) == caps  # no device rule without devices
    assert not _planner(devices=[]).uses_device("gpu-a")


def test_memory_aware_claims_count_what_is_declared_but_not_yet_allocated():
    needs = {"big": GpuNeed(True, 60 * GiB), "small": GpuNeed(True, 10 * GiB)}
    nvml_free = {"GPU-aaaa": 100 * GiB, "GPU-bbbb": 50 * GiB}  # what NVML answers, changed below
    p = DevicePlanner([Device(0, "GPU-aaaa", "H200", 140 * GiB), Device(1, "GPU-bbbb", "H200", 140 * GiB)],
                      4, needs, free_memory=lambda: dict(nvml_free))
    assert p.claimable(["big", "small"], []) == ["big", "small"]
    assert p.place("big", []).key == "GPU-aaaa"  # the only device with 60 GiB free
    # The big model was just started and has allocated nothing yet: 100 - 60 = 40 GiB are left there,
    # and 50 GiB on the other: a second big one does not fit anywhere.
    started = [Placement("GPU-aaaa", 60 * GiB, None)]
    assert p.claimable(["big", "small"], started) == ["small"]
    assert p.place("small", started).key == "GPU-bbbb"  # least used first
    # Once NVML shows the model's memory in use, it is not counted twice.
    nvml_free["GPU-aaaa"] = 40 * GiB
    loaded = [Placement("GPU-aaaa", 60 * GiB, 60 * GiB)]
    assert p.claimable(["big", "small"], loaded) == ["small"]
    nvml_free["GPU-bbbb"] = 70 * GiB  # another process let go of memory on the second device
    assert p.place("big", loaded).key == "GPU-bbbb"
    nvml_free.update({"GPU-aaaa": 0, "GPU-bbbb": 0})  # taken by another process between claim and placement
    assert p.place("big", loaded).key == "GPU-bbbb"  # still a device with a free slot, never none
    # Without NVML (no free memory known), the slots alone decide.
    blind = _planner(per_device=4, needs=needs)
    assert blind.claimable(["big", "small"], started) == ["big", "small"]


def test_a_worker_larger_than_every_device_is_named_at_start():
    p = _planner(needs={"huge": GpuNeed(True, 200 * GiB), "ok": GpuNeed(True, GiB), "cpu": GpuNeed(False, 500 * GiB)})
    assert p.unfit_workers() == ["huge"]
    rows = p.registry_devices(NVML)
    assert rows[0] == {"index": 0, "uuid": "GPU-aaaa", "name": "H200", "memory_total_bytes": 140 * GiB,
                       "driver": "570", "slots": 1}


# --- CUDA failures -------------------------------------------------------------------------------


def test_cuda_failures_are_named_from_torch_texts():
    assertion = classify(f"AcceleratorError: {ASSERT_TEXT}")
    assert (assertion.exit_reason, assertion.name) == ("cuda-error", "device-side assert triggered")
    assert assertion.sticky
    legacy = classify("RuntimeError: CUDA error: device-side assert triggered\nCUDA kernel errors might be ...")
    assert legacy == assertion  # torch < 2.8 raised a RuntimeError with the same text
    illegal = classify(ILLEGAL_ACCESS_ABORT)
    assert (illegal.exit_reason, illegal.name) == ("cuda-error", "an illegal memory access was encountered")
    oom = classify("OutOfMemoryError: " + OOM_TEXT.format(gib=20, gpu=0, free=113))
    assert oom.exit_reason == "cuda-oom" and not oom.sticky
    assert classify("RuntimeError: CUDA error: out of memory").exit_reason == "cuda-oom"
    assert classify("RuntimeError: CUDA error: CUBLAS_STATUS_ALLOC_FAILED when calling `cublasCreate(handle)`"
                    ).exit_reason == "cuda-oom"
    cublas = classify("RuntimeError: CUBLAS_STATUS_EXECUTION_FAILED when calling `cublasGemmEx( handle, ...)`")
    assert cublas.name == "CUBLAS_STATUS_EXECUTION_FAILED"
    assert classify(KERNEL_ASSERT_LINE.format(b=0, t=3)).name == "device-side assert triggered"
    # Not CUDA failures: a host without a GPU, a worker's own message that mentions CUDA.
    for text in ("RuntimeError: device 'cuda' was asked for but this process sees no CUDA device",
                 "AssertionError: Torch not compiled with CUDA enabled", "ValueError: boom", None, ""):
        assert classify(text) is None
    assert is_sticky_cuda_error(RuntimeError(ASSERT_TEXT))
    assert not is_sticky_cuda_error(RuntimeError(OOM_TEXT.format(gib=1, gpu=0, free=1)))


def _decide(exit, result=None, tail="", **kw):
    base = dict(worker="w", exit=exit, result=result, kill_reason=None, signals_sent=set(), stderr_tail=tail,
                oom_kills_before=0, oom_kills_after=0, max_runtime=None, cancel_grace=60, drain_timeout=120)
    base.update(kw)
    return decide(**base)


def test_a_cuda_failure_ends_failed_with_its_own_reason_and_a_stable_first_line():
    raised = _decide(ChildExit(1, 1, None, 1, 0.1), {"status": "FAILED", "error": f"AcceleratorError: {ASSERT_TEXT}"})
    assert raised.status == "FAILED" and raised.exit_reason == "cuda-error"
    assert raised.error.splitlines()[0] == "CudaError: device-side assert triggered"
    assert "AcceleratorError: CUDA error: device-side assert triggered" in raised.error  # the original follows

    ooms = [_decide(ChildExit(1, 1, None, 1, 0.1),
                    {"status": "FAILED", "error": "OutOfMemoryError: " + OOM_TEXT.format(gib=g, gpu=g % 2, free=g)})
            for g in (1, 64)]
    assert {o.exit_reason for o in ooms} == {"cuda-oom"}
    assert {o.error.splitlines()[0] for o in ooms} == {"CudaOutOfMemory: CUDA out of memory on the child's device"}
    assert "Tried to allocate 64.00 GiB" in ooms[1].error

    aborted = _decide(ChildExit(1, None, signal.SIGABRT, 1, 0.1), tail=ILLEGAL_ACCESS_ABORT)
    assert aborted.exit_reason == "cuda-error" and aborted.exit_signal == signal.SIGABRT
    assert aborted.error.splitlines()[0] == ("CudaError: an illegal memory access was encountered "
                                            "(the child was killed by SIGABRT)")
    # A host OOM kill stays a host OOM kill, whatever the output said before it.
    host = _decide(ChildExit(1, None, signal.SIGKILL, 1, 0.1), tail=OOM_TEXT, oom_kills_after=1)
    assert host.exit_reason == "oom" and host.error.startswith("OutOfMemory:")
    # The supervisor's own reasons win: a timeout is a timeout.
    timeout = _decide(ChildExit(1, None, signal.SIGKILL, 1, 0.1), tail=ASSERT_TEXT, kill_reason="timeout",
                      signals_sent={signal.SIGKILL}, max_runtime=5)
    assert timeout.exit_reason == "timeout"
    plain = _decide(ChildExit(1, 1, None, 1, 0.1), {"status": "FAILED", "error": "ValueError: boom"})
    assert plain.exit_reason == "exception" and plain.error == "ValueError: boom"


def test_a_sticky_cuda_error_is_not_blamed_on_one_document():
    def engine(items):
        raise RuntimeError(ASSERT_TEXT)

    with pytest.raises(RuntimeError, match="device-side assert"):
        per_unit(["a"], engine)  # one unit: it would have been stamped ERROR

    def oom(items):
        if len(items) > 1:
            raise RuntimeError(OOM_TEXT.format(gib=1, gpu=0, free=1))
        return [len(items[0])]

    assert per_unit(["a", "bb"], oom) == [(1, None), (2, None)]  # an OOM batch is retried unit by unit
    with pytest.raises(SystematicFailure):
        per_unit(["a", "b"], lambda items: (_ for _ in ()).throw(ValueError("x")))


def test_the_api_says_why_a_gpu_run_waits():
    from datetime import datetime

    from scrinalia.api.views import queued_reason

    now = datetime.now(UTC)
    gpu = WorkerSpec(name="g", label="g", description="", run=lambda ctx: None)
    big = WorkerSpec(name="b", label="b", description="", run=lambda ctx: None, gpu_memory_bytes=200 * GiB)
    cpu = WorkerSpec(name="c", label="c", description="", run=lambda ctx: None, gpu=False)

    def runner(children, slots=1, devices=None):
        return {"state": "online", "capabilities": ["g", "b", "c"], "drain_requested_at": None,
                "schema_mismatch": False, "busy": False, "children": children,
                "devices": devices if devices is not None else [{"index": 0, "memory_total_bytes": 80 * GiB,
                                                                 "slots": slots}]}

    full = [runner([{"device": {"index": 0}}])]
    run = {"not_before": None, "attempt": 1}
    assert queued_reason(run, "g", full, now, "0004", gpu)["code"] == "waiting_for_device"
    assert "(1 of 1)" in queued_reason(run, "g", full, now, "0004", gpu)["message"]
    assert queued_reason(run, "c", full, now, "0004", cpu)["code"] == "waiting_for_claim"  # no slot needed
    assert queued_reason(run, "g", [runner([{"device": {"index": 0}}], slots=2)], now, "0004", gpu)["code"] \
        == "waiting_for_claim"
    assert queued_reason(run, "g", [runner([], devices=[])], now, "0004", gpu)["code"] == "waiting_for_claim"
    assert queued_reason(run, "b", [runner([])], now, "0004", big)["code"] == "no_device_fits"
    # A runner registered before devices had slots (NVML facts only) has no device rule.
    legacy = [runner([{"pid": 1}], devices=[{"index": 0, "name": "A100"}])]
    assert queued_reason(run, "g", legacy, now, "0004", gpu)["code"] == "waiting_for_claim"
