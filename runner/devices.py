"""The GPU devices of a runner: what NVML sees, which devices the supervisor owns, and who may use them.

* ``GpuProbe``: NVML (``pynvml`` from nvidia-ml-py) when it is importable and a GPU answers. NVML is
  the driver's management library: it reads names, memory and per-process memory without creating a
  CUDA context, so the supervisor may use it (it must never initialise CUDA). Everything returns empty
  results where NVML, the driver or a GPU is absent. The loop's samples (``memory_by_pid``,
  ``free_memory``) run on one NVML thread and are waited for at most ``NVML_WAIT`` seconds: a wedged
  driver (a GPU fallen off the bus answers NVML in tens of seconds, or never) makes them stale, never
  the loop late (decision 0110).
* ``inventory``: the devices of ``--devices auto|none|LIST`` (auto: NVML's; LIST: indexes or UUIDs,
  which needs no NVML).
* ``DevicePlanner``: the slot accounting (``--per-device`` children per device) and the memory rule, as
  pure functions of the children's placements and of NVML's free memory: which workers may be claimed
  now (``claimable``: the capability list of the one claim statement) and on which device a claimed run
  goes (``place``). A child's device is given to it as ``CUDA_VISIBLE_DEVICES`` (``child_env``) before
  anything in it can initialise CUDA, so ``cuda:0`` inside the child is its own device.
"""
from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("scrinalia.runner.devices")

NVML_WAIT = 0.2  # seconds the loop waits for one NVML sample; then it uses the last one


class _BoundedCalls:
    """Runs one call at a time on a helper thread and waits for it at most ``wait`` seconds; a call that
    is late keeps running, and until it returns every new call answers the last known result at once."""

    def __init__(self, wait: float) -> None:
        self.wait = wait
        self.late = 0  # calls that missed their wait (the status of a wedged driver)
        self._busy = threading.Lock()
        self._last: dict[str, Any] = {}

    def call(self, key: str, fn: Callable[[], Any], default: Any) -> Any:
        if not self._busy.acquire(blocking=False):
            return self._last.get(key, default)  # the previous call is still in the driver
        done = threading.Event()

        def run() -> None:
            try:
                self._last[key] = fn()
            finally:
                done.set()
                self._busy.release()

        threading.Thread(target=run, name="nvml", daemon=True).start()
        if not done.wait(self.wait):
            self.late += 1
            log.warning("NVML did not answer within %gs; using its last answer", self.wait)
        return self._last.get(key, default)


class GpuProbe:
    def __init__(self) -> None:
        self._nvml: Any = None
        self._calls = _BoundedCalls(NVML_WAIT)
        try:
            import pynvml

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
        """GPU memory in use per process id, summed over the devices (bounded: see the module doc)."""
        if self._nvml is None:
            return {}
        return dict(self._calls.call("memory_by_pid", self._memory_by_pid, {}))

    def _memory_by_pid(self) -> dict[int, int]:
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

    def free_memory(self) -> dict[str, int]:
        """Free memory per device UUID, now (empty without NVML; bounded: see the module doc)."""
        if self._nvml is None:
            return {}
        return dict(self._calls.call("free_memory", self._free_memory, {}))

    def _free_memory(self) -> dict[str, int]:
        nvml = self._nvml
        if nvml is None:
            return {}
        free: dict[str, int] = {}
        try:
            for index in range(nvml.nvmlDeviceGetCount()):
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                free[_text(nvml.nvmlDeviceGetUUID(handle))] = int(nvml.nvmlDeviceGetMemoryInfo(handle).free)
        except Exception as exc:
            log.debug("NVML free memory failed: %s", type(exc).__name__)
        return free

    def close(self) -> None:
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                pass
            self._nvml = None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# --- the devices a supervisor owns -----------------------------------------------------------------


class DeviceError(ValueError):
    """A --devices value that names no device this host has."""


@dataclass(frozen=True, slots=True)
class Device:
    """One GPU of the runner: NVML's index (PCI bus order) and, when NVML answered, its identity."""

    index: int | None
    uuid: str | None
    name: str | None = None
    memory_total_bytes: int | None = None

    @property
    def key(self) -> str:
        return self.uuid or str(self.index)

    @property
    def visible_as(self) -> str:
        """What ``CUDA_VISIBLE_DEVICES`` names it by: the UUID when known (CUDA's own enumeration order
        is not NVML's), else the index in PCI bus order (``CUDA_DEVICE_ORDER=PCI_BUS_ID``)."""
        return self.key

    def describe(self) -> dict[str, Any]:
        """The device as a child's snapshot and a run's metrics show it."""
        return {"index": self.index, "uuid": self.uuid, "name": self.name}


def parse_devices(value: str | None) -> str | tuple[str, ...]:
    """``auto`` | ``none`` | the listed indexes/UUIDs (``0,1``, ``GPU-8f...``)."""
    text = (value or "auto").strip()
    if text.lower() in ("auto", "none"):
        return text.lower()
    items = tuple(item.strip() for item in text.split(",") if item.strip())
    if not items:
        raise DeviceError("--devices must be auto, none, or a comma-separated list of indexes or UUIDs")
    for item in items:
        if not (item.isdigit() or item.startswith(("GPU-", "MIG-"))):
            raise DeviceError(f"--devices: {item!r} is neither an index nor a device UUID (GPU-...)")
    if len(set(items)) != len(items):
        raise DeviceError("--devices names a device twice")
    return items


def inventory(devices: str | tuple[str, ...], nvml_devices: list[dict[str, Any]]) -> list[Device]:
    """The devices this supervisor owns. ``nvml_devices``: ``GpuProbe.devices()`` (empty without NVML).

    ``auto`` is every device NVML lists (none without NVML: the children then see no GPU and the GPU
    workers fall back to CPU). A LIST is checked against NVML when it answers; without NVML it is taken
    as given (indexes in PCI bus order, or UUIDs), so the slots work on a host whose NVML is missing."""
    known = [Device(d["index"], d.get("uuid"), d.get("name"), d.get("memory_total_bytes")) for d in nvml_devices]
    if devices == "none":
        return []
    if devices == "auto":
        return known
    return [_named_device(item, known) for item in devices]


def _named_device(item: str, known: list[Device]) -> Device:
    """The device ``item`` (an index or a UUID) names: as given without NVML, else NVML's."""
    if not known:
        return Device(int(item), None) if item.isdigit() else Device(None, item)
    match = [d for d in known if (str(d.index) == item if item.isdigit() else d.uuid == item)]
    if not match:
        listed = ", ".join(f"{d.index} ({d.uuid})" for d in known)
        raise DeviceError(f"--devices: no device {item!r} on this host (NVML lists {listed})")
    return match[0]


@dataclass(frozen=True, slots=True)
class GpuNeed:
    """What a worker declares (``WorkerSpec.gpu``, ``gpu_memory_needed()``)."""

    gpu: bool = True
    memory_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class Placement:
    """A live child's hold on a device: its declared memory, and what NVML last saw it use."""

    device_key: str
    need_bytes: int | None
    used_bytes: int | None

    @property
    def reserved_bytes(self) -> int:
        """Declared memory the child has not allocated yet: NVML's free memory does not show it."""
        return max(0, (self.need_bytes or 0) - (self.used_bytes or 0))


@dataclass(frozen=True, slots=True)
class Availability:
    """A device with a free slot: how many children hold it and the memory still free on it (None:
    NVML does not answer, so the memory rule does not apply)."""

    device: Device
    holders: int
    free_bytes: int | None


def available(devices: list[Device], per_device: int, placements: Iterable[Placement],
              free_by_key: Mapping[str, int]) -> list[Availability]:
    """The devices with a free slot, least used first (the runs spread over the devices), then most
    memory free. The free memory is NVML's minus what the children there declared and have not yet
    allocated, so two models that would not fit together are not started one right after the other."""
    holders: dict[str, list[Placement]] = {d.key: [] for d in devices}
    for p in placements:
        holders.setdefault(p.device_key, []).append(p)
    out = []
    for device in devices:
        mine = holders[device.key]
        if len(mine) >= per_device:
            continue
        free = free_by_key.get(device.key)
        if free is not None:
            free -= sum(p.reserved_bytes for p in mine)
        out.append(Availability(device, len(mine), free))
    return sorted(out, key=lambda a: (a.holders, -(a.free_bytes or 0)))


def fits(need: GpuNeed, availability: Availability) -> bool:
    if need.memory_bytes is None or availability.free_bytes is None:
        return True  # nothing declared, or no NVML: the slots alone decide
    return availability.free_bytes >= need.memory_bytes


class DevicePlanner:
    """The supervisor's device accounting (``devices`` empty: no device rule; every child sees none)."""

    def __init__(self, devices: list[Device], per_device: int, needs: Mapping[str, GpuNeed],
                 free_memory: Any = None) -> None:
        if per_device < 1:
            raise DeviceError(f"--per-device must be at least 1, got {per_device}")
        self.devices = list(devices)
        self.per_device = per_device
        self.needs = dict(needs)
        self._free_memory = free_memory  # () -> {uuid: free bytes}; GpuProbe.free_memory

    @property
    def slots(self) -> int:
        return len(self.devices) * self.per_device

    def need(self, worker: str) -> GpuNeed:
        return self.needs.get(worker, GpuNeed())

    def uses_device(self, worker: str) -> bool:
        return bool(self.devices) and self.need(worker).gpu

    def _available(self, placements: Iterable[Placement]) -> list[Availability]:
        free = self._free_memory() if self._free_memory is not None else {}
        return available(self.devices, self.per_device, placements, free)

    def claimable(self, capabilities: Iterable[str], placements: Iterable[Placement]) -> list[str]:
        """The workers a claim may take now: the CPU-only ones always, a GPU one only while a device
        with a free slot (and, when it declares memory and NVML answers, that much free) exists."""
        caps = list(capabilities)
        if not self.devices:
            return caps
        free = self._available(placements)
        return [w for w in caps if not self.need(w).gpu or any(fits(self.need(w), a) for a in free)]

    def place(self, worker: str, placements: Iterable[Placement]) -> Device | None:
        """The device for a claimed run of ``worker`` (None: a CPU-only worker, or no devices)."""
        if not self.uses_device(worker):
            return None
        need = self.need(worker)
        free = self._available(placements)
        for a in free:
            if fits(need, a):
                return a.device
        # claimable() said yes a moment ago: only another process changed NVML's numbers since. The slot
        # rule still holds; the run must not fall back to CPU (or to every device) for that.
        return free[0].device if free else None

    def registry_devices(self, nvml_devices: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The registry row's ``devices``: each owned device, its driver, and its slots (the API reads
        them, with the children's devices, to say that a queued run waits for a free device)."""
        drivers = {d.get("uuid"): d.get("driver") for d in nvml_devices}
        return [{**d.describe(), "memory_total_bytes": d.memory_total_bytes, "driver": drivers.get(d.uuid),
                 "slots": self.per_device} for d in self.devices]

    def unfit_workers(self) -> list[str]:
        """Workers that declare more memory than any owned device has: never claimed here."""
        totals = [d.memory_total_bytes for d in self.devices if d.memory_total_bytes]
        if not totals:
            return []
        return sorted(w for w, n in self.needs.items() if n.gpu and n.memory_bytes and n.memory_bytes > max(totals))


def child_env(device: Device | None) -> dict[str, str]:
    """The environment a daemon's child starts with. A child without a device (a runner that owns none:
    ``--devices none``, or auto without NVML; or a CPU-only worker) sees no GPU: GPU workers fall back
    to CPU, and nothing lands on a GPU by accident."""
    if device is None:
        return {"CUDA_VISIBLE_DEVICES": ""}
    return {"CUDA_VISIBLE_DEVICES": device.visible_as, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}


def needs_of(catalogue: Mapping[str, Any]) -> dict[str, GpuNeed]:
    """Each worker's ``GpuNeed`` from its ``WorkerSpec``."""
    return {name: GpuNeed(bool(getattr(spec, "gpu", True)), spec.gpu_memory_needed()
                          if hasattr(spec, "gpu_memory_needed") else None)
            for name, spec in catalogue.items()}
