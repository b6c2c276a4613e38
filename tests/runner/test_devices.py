"""Devices as a resource of the supervisor, in real runner processes (no GPU needed: an explicit
``--devices 0,1`` needs no NVML), and CUDA failures named end to end (torch's exception classes and texts,
raised in a child without a GPU)."""
from __future__ import annotations

import json
import uuid

import pytest

from scrinalia.api import views
from scrinalia.domains.archive import registry
from scrinalia.domains.archive.workers.plugins import load_catalogue
from tests.runner.conftest import ROOT, RUNNER, enqueue, wait_for, wait_status

pytestmark = pytest.mark.slow

FAST = ("--heartbeat", "0.3", "--lease", "5", "--poll", "0.1")


def _worker_view(engine, name):
    catalogue = load_catalogue("tests.runner.workers:ALL")
    return views.workers_view(engine, catalogue, names=[name])["workers"][0]


def test_two_gpu_runs_never_share_a_device_a_third_waits_for_one_and_cpu_work_runs_beside(
    start_runner, engine, tmp_path
):
    runner = start_runner("--devices", "0,1", "--per-device", "1", "--concurrency", "4", *FAST)
    release = {w: tmp_path / f"release-{w}" for w in ("gpu-a", "gpu-b", "gpu-c", "cpu-only")}
    a = enqueue(engine, "gpu-a", until=str(release["gpu-a"]))
    b = enqueue(engine, "gpu-b", until=str(release["gpu-b"]))
    child_a, child_b = runner.child_for(a.run_id), runner.child_for(b.run_id)
    assert {child_a["device"]["index"], child_b["device"]["index"]} == {0, 1}

    c = enqueue(engine, "gpu-c", until=str(release["gpu-c"]))
    cpu = enqueue(engine, "cpu-only", until=str(release["cpu-only"]))
    cpu_child = runner.child_for(cpu.run_id)  # claimed after gpu-c, which waits: no device slot
    assert cpu_child["device"] is None
    status = runner.status()
    assert {ch["run_id"] for ch in status["children"]} == {str(a.run_id), str(b.run_id), str(cpu.run_id)}
    assert [len(d["children"]) for d in status["devices"]] == [1, 1]
    assert [d["slots"] for d in status["devices"]] == [1, 1]

    # The panel's reason (the API's answer) for the waiting run, once the registry shows the children.
    reason = wait_for(lambda: (_worker_view(engine, "gpu-c")["queued_reason"] or {}).get("code") == "waiting_for_device"
                      and _worker_view(engine, "gpu-c")["queued_reason"], 10, what="the waiting_for_device reason")
    assert "waiting for a free GPU" in reason["message"] and "(2 of 2)" in reason["message"]
    row = registry.get_runner(engine, uuid.UUID(status["runner_id"]))
    assert [d["slots"] for d in row.devices] == [1, 1]
    assert sorted(ch["device"]["index"] for ch in row.children if ch["device"]) == [0, 1]

    # A device frees up: the waiting run gets exactly that device.
    release["gpu-a"].touch()
    done_a = wait_status(engine, a.run_id, "SUCCESS")
    child_c = runner.child_for(c.run_id)
    assert child_c["device"] == child_a["device"]
    for w in ("gpu-b", "gpu-c", "cpu-only"):
        release[w].touch()
    rows = {r.worker_name: wait_status(engine, r.run_id, "SUCCESS") for r in (b, c, cpu)}
    rows["gpu-a"] = done_a

    # Each child saw only its own device (by index in PCI bus order: no NVML here to give a UUID).
    seen = {w: r.result["cuda_visible_devices"] for w, r in rows.items()}
    assert seen["cpu-only"] == ""
    assert {seen["gpu-a"], seen["gpu-b"]} == {"0", "1"} and seen["gpu-c"] == seen["gpu-a"]
    assert {r.result["cuda_device_order"] for w, r in rows.items() if w != "cpu-only"} == {"PCI_BUS_ID"}
    assert rows["gpu-c"].metrics["device"] == {"index": int(seen["gpu-a"]), "uuid": None, "name": None}
    assert "device" not in rows["cpu-only"].metrics
    # Never two GPU runs on one device at the same time: their RUNNING intervals on a device don't overlap.
    same = [rows["gpu-a"], rows["gpu-c"]]
    assert same[0].finished_at <= same[1].started_at


def test_with_devices_none_no_child_gets_a_gpu_and_gpu_workers_fall_back_to_cpu(start_runner, engine):
    runner = start_runner("--devices", "none", "--concurrency", "2", *FAST)
    assert runner.status()["devices"] == []
    report = enqueue(engine, "gpu-a", torch_device=True)
    probe = ledger_probe = enqueue(engine, "gpu-probe", matmul_size=64, repeats=1)
    row = wait_status(engine, report.run_id, "SUCCESS", timeout=60)
    assert row.result["cuda_visible_devices"] == "" and row.result["torch_device"] == "cpu"
    probe = wait_status(engine, ledger_probe.run_id, "SUCCESS", timeout=60)
    assert probe.result["cuda_available"] is False and probe.result["devices"][0]["device"] == "cpu"
    assert "device" not in probe.metrics
    assert "every child runs with CUDA_VISIBLE_DEVICES=''" in runner.log()


def test_a_device_list_is_checked_and_a_bad_one_refused(start_runner, runner_env):
    import subprocess

    done = subprocess.run([*RUNNER, "daemon", "--name", "x", "--devices", "cuda:0"], cwd=ROOT, env=runner_env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "neither an index nor a device UUID" in done.stderr


CUDA_CASES = {
    # worker: (exit_reason, exit_signal, first line of the error)
    "cuda-assert": ("cuda-error", None, "CudaError: device-side assert triggered"),
    "cuda-oom": ("cuda-oom", None, "CudaOutOfMemory: CUDA out of memory on the child's device"),
    "cuda-abort": ("cuda-error", 6, "CudaError: an illegal memory access was encountered "
                                    "(the child was killed by SIGABRT)"),
}


def test_cuda_failures_end_failed_with_their_reason_and_one_fingerprint_across_runs(start_runner, engine):
    runner = start_runner("--devices", "0", "--concurrency", "3", *FAST)
    sibling = enqueue(engine, "cpu-only")
    fingerprints = {}
    for worker, (reason, sig, head) in CUDA_CASES.items():
        rows = []
        for n in (1, 5):  # two occurrences with different sizes, devices and addresses in their texts
            run = enqueue(engine, worker, n=n)
            rows.append(wait_status(engine, run.run_id, "FAILED", timeout=60))
        for row in rows:
            assert (row.exit_reason, row.exit_signal) == (reason, sig), row
            assert row.error.splitlines()[0] == head, row.error
            assert row.metrics["device"]["index"] == 0
        assert rows[0].error_fingerprint == rows[1].error_fingerprint, [r.error for r in rows]
        fingerprints[worker] = rows[0].error_fingerprint
    assert len(set(fingerprints.values())) == 3
    assert fingerprints["cuda-oom"] != "outofmemory: worker cuda-oom was killed by the kernel's oom killer"
    # The supervisor and the sibling are untouched, and the device is free again for the next run.
    assert wait_status(engine, sibling.run_id, "SUCCESS").result["cuda_visible_devices"] == ""
    nxt = enqueue(engine, "gpu-a")
    assert wait_status(engine, nxt.run_id, "SUCCESS").result["cuda_visible_devices"] == "0"
    assert runner.proc.poll() is None
    assert json.dumps(runner.status()["devices"][0]["children"]) == "[]"
