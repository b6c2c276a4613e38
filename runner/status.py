"""The status snapshot of a live supervisor, and how ``scrinalia-runner status`` shows it.

``scrinalia-runner status --json`` prints the snapshot below unchanged (one JSON object per runner,
in a list). Its fields, documented in docs/operations.md ("Runner" > "status"):
"""
from __future__ import annotations

import json
import os
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from scrinalia.domains.archive.run_ids import short_id
from scrinalia.wording import plural_word

# Field -> meaning. The tests check that the JSON has exactly these top-level fields.
STATUS_FIELDS: dict[str, str] = {
    "runner_id": "the runner's id (archive_worker_runners.runner_id)",
    "name": "its --name",
    "kind": "daemon (the one-shot CLI has no control socket)",
    "hostname": "the host's name",
    "pid": "the supervisor's pid",
    "version": "the scrinalia-runner package version",
    "started_at": "when the supervisor started (ISO 8601, UTC, the host's clock)",
    "uptime_seconds": "seconds since then",
    "state": "running | draining | fenced (the lease could not be renewed: no claims)",
    "draining": "true once SIGTERM/SIGINT or a registry drain request was received",
    "drain_reason": "why it drains, or null",
    "drain_deadline_seconds": "seconds until the remaining children are stopped, or null",
    "database": "{state: ok|blocked (a lock or statement timeout: the server answers)|unreachable "
                "(no connection)|error|unknown, error: the last error's class or null, "
                "last_heartbeat_age_seconds: seconds since the last renewed heartbeat, "
                "statements: protocol statements sent since start, by step (heartbeat, claim, "
                "expire_leases, record_start, finish, ...)}",
    "notifications": "{state: hears (the LISTEN is up and a probe came back: the poll is a safety net)|deaf "
                     "(a NOTIFY to itself never came back, e.g. through PgBouncer in transaction mode: "
                     "claiming every --poll)|connecting|down|off (--no-listen), error: the last LISTEN "
                     "error or null, reconnects}",
    "lease_margin_seconds": "seconds left on the lease of the last heartbeat (the children are killed at "
                            "fence_margin_seconds), or null before the first heartbeat",
    "fence_margin_seconds": "the margin at which the supervisor self-fences",
    "heartbeat_seconds": "--heartbeat",
    "lease_seconds": "--lease",
    "poll_seconds": "--poll",
    "concurrency": "--concurrency",
    "devices": "the GPUs it owns (--devices, --per-device): one object per device: index, uuid, name, "
               "memory_total_bytes, slots (--per-device), children (the pids on it); empty: no device rule",
    "capabilities": "the workers this runner claims",
    "launcher": "{start_method: forkserver|spawn, pid, preload, preloaded, preload_seconds, healthy, "
                "cuda_initialized (the fork server's: always false), warm: {models: [{model_class, model_dir, "
                "dtype, bytes, load_seconds, workers}], bytes, limit_bytes, errors}, standby: {on, pid (the child "
                "forked ahead, null while none waits), used}} (warm: decision 0340; standby: 0341)",
    "counters": "runs since start: claimed, SUCCESS, FAILED, CANCELLED, INTERRUPTED, lost",
    "timings": "every time quantity in effect (runner.timings, docs/architecture.md \"Timings\"): "
               "{name: {seconds, formula}}",
    "children": "one object per child: pid, run_id, worker, phase (starting|running|finishing|stopping), "
                "elapsed_seconds, progress ({done, total, unit, ...} or null), rss_bytes, "
                "gpu_memory_bytes (NVML, null without a GPU), device ({index, uuid, name}: its CUDA_VISIBLE_DEVICES, "
                "null: it sees no GPU, or the runner owns none), cancel_requested",
}


def supervisor_status(sup: Any) -> dict[str, Any]:
    now = sup.clock.monotonic()
    margin = sup.lease.margin()
    snapshot = {
        "runner_id": str(sup.runner_id),
        "name": sup.registration.name,
        "kind": sup.registration.kind,
        "hostname": sup.registration.hostname,
        "pid": os.getpid(),
        "version": sup.registration.package_version,
        "started_at": datetime.fromtimestamp(sup.uptime.wall, UTC).isoformat(),
        "uptime_seconds": round(now - sup.uptime.mono, 3),
        "state": sup.state,
        "draining": sup.drain.draining,
        "drain_reason": sup.drain.reason,
        "drain_deadline_seconds": round(max(0.0, sup.drain.deadline - now), 3)
        if sup.drain.draining and sup.drain.deadline is not None else None,
        "database": {
            "state": sup.db.state,
            "error": sup.db.error,
            "last_heartbeat_age_seconds": round(now - sup.lease.last_ok, 3)
            if sup.lease.last_ok is not None else None,
            "statements": dict(sup.db.statements),
        },
        "notifications": _notifications(sup.services.wakeup),
        "lease_margin_seconds": round(margin, 3) if margin != float("inf") else None,
        "fence_margin_seconds": round(sup.timings.fence_margin, 3),
        "heartbeat_seconds": sup.options.heartbeat_seconds,
        "lease_seconds": sup.options.lease_seconds,
        "poll_seconds": sup.options.poll_seconds,
        "concurrency": sup.options.concurrency,
        "devices": sup.poll.device_status(),
        "capabilities": list(sup.capabilities),
        "launcher": sup.launcher.info(),
        "counters": dict(sup.counters),
        "timings": sup.timings.to_json(),
        "children": [c.snapshot(now) for c in sup.children.values()],
    }
    assert set(snapshot) == set(STATUS_FIELDS)
    return snapshot


def _notifications(wakeup: Any) -> dict[str, Any]:
    """The LISTEN's state (runner.wakeup.Wakeup.state), or ``off`` without one."""
    if wakeup is None:
        return {"state": "off", "error": None, "reconnects": 0}
    return dict(wakeup.state())


def _bytes(value: Any) -> str:
    if not isinstance(value, (int, float)):
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return str(value)


def _device(device: Any) -> str:
    """``0 (GPU-8f3a...)``, the index alone, or ``-`` for a child that sees no GPU."""
    if not isinstance(device, dict):
        return "-"
    index, uuid_ = device.get("index"), device.get("uuid")
    if index is None:
        return str(uuid_ or "-")
    return f"{index} ({uuid_[:12]})" if uuid_ else str(index)


def _progress(progress: Any) -> str:
    if not isinstance(progress, dict) or progress.get("done") is None:
        return "-"
    total = progress.get("total")
    text = f"{progress['done']}/{total}" if total is not None else str(progress["done"])
    unit = progress.get("unit")
    if not unit:
        return text
    # "190/200 documents", "1/1 document", "0 documents": the count that is the unit's is the total
    return f"{text} {plural_word(total if total is not None else progress['done'], str(unit))}"


def render_status(status: dict[str, Any]) -> str:
    lines = _header_lines(status)
    for d in status.get("devices") or []:
        lines.append(f"  GPU {_device(d)}  {d.get('name') or ''}  {len(d['children'])}/{d['slots']} slots busy"
                     + (f"  {_bytes(d['memory_total_bytes'])}" if d.get("memory_total_bytes") else ""))
    if status["children"]:
        lines.append(f"  {'PID':>7}  {'RUN':<12}  {'WORKER':<20} {'PHASE':<9} {'ELAPSED':>8}  {'PROGRESS':<18} "
                     f"{'RSS':>10} {'GPU':>10}  DEVICE")
        lines.extend(_child_line(c) for c in status["children"])
    else:
        lines.append("  no children")
    return "\n".join(lines)


def _header_lines(status: dict[str, Any]) -> list[str]:
    db = status["database"]
    margin = status["lease_margin_seconds"]
    draining = (f" ({status['drain_reason']}, {status['drain_deadline_seconds']:.0f}s left)"
                if status["draining"] else "")
    age = db["last_heartbeat_age_seconds"]
    return [
        f"runner {status['name']}  id {status['runner_id']}  pid {status['pid']}  on {status['hostname']}"
        f"  version {status['version']}",
        f"  state {status['state']}{draining}  up {status['uptime_seconds']:.0f}s",
        f"  database {db['state']}" + (f" ({db['error']})" if db["error"] else "")
        + (f"  last heartbeat {age:.1f}s ago" if age is not None else "")
        + (f"  lease margin {margin:.1f}s" if margin is not None else ""),
        f"  notifications {status['notifications']['state']}"
        + ("  (they do not arrive: claiming every --poll)" if status["notifications"]["state"] == "deaf" else ""),
        f"  {len(status['children'])}/{status['concurrency']} busy  capabilities {','.join(status['capabilities'])}"
        f"  launcher {status['launcher'].get('start_method')}",
        *_warm_lines(status["launcher"].get("warm") or {}),
        "  counters " + " ".join(f"{k}={v}" for k, v in status["counters"].items()),
        *_timing_lines(status.get("timings") or {}),
    ]


def _warm_lines(warm: dict[str, Any]) -> list[str]:
    """The fork server's warm models, one line (none when the launcher keeps none)."""
    models = warm.get("models") or []
    if not models and not warm.get("errors"):
        return []
    held = ", ".join(f"{Path(m['model_dir']).name} {m['dtype']} {m['bytes'] / 2**20:.0f} MiB "
                     f"({','.join(m['workers'])})" for m in models)
    limit = warm.get("limit_bytes") or 0
    return [f"  warm models {held or 'none'}  {warm.get('bytes', 0) / 2**20:.0f}/{limit / 2**20:.0f} MiB"
            + (f"  errors: {'; '.join(warm['errors'])}" if warm.get("errors") else "")]


def _timing_lines(timings: dict[str, Any]) -> list[str]:
    """The effective time quantities (runner.timings), a few to a line."""
    import textwrap

    items = [f"{name}=-" if v.get("seconds") is None else f"{name}={v['seconds']:g}s" for name, v in timings.items()]
    return textwrap.wrap(" ".join(items), width=116, initial_indent="  timings ", subsequent_indent="          ")


def _child_line(c: dict[str, Any]) -> str:
    return (f"  {c['pid']:>7}  {short_id(c['run_id']):<12}  {c['worker'][:20]:<20} {c['phase']:<9} "
            f"{c['elapsed_seconds']:>7.1f}s  {_progress(c['progress'])[:18]:<18} {_bytes(c['rss_bytes']):>10} "
            f"{_bytes(c['gpu_memory_bytes']):>10}  {_device(c.get('device'))}"
            + ("  cancel requested" if c["cancel_requested"] else ""))


def runner_row_json(row: Any) -> dict[str, Any]:
    out = {}
    for key in row.__dataclass_fields__:
        value = getattr(row, key)
        if isinstance(value, datetime):
            value = value.isoformat()
        elif isinstance(value, uuid.UUID):
            value = str(value)
        out[key] = value
    return out


def render_registry(rows: list[Any]) -> str:
    if not rows:
        return "no runners in the registry"
    lines = [f"{'NAME':<24} {'KIND':<7} {'STATE':<8} {'HOST':<20} {'PID':>7} {'VERSION':<10} {'BUSY':>5}  "
             f"{'LAST HEARTBEAT':<26} RUNNER ID"]
    for r in rows:
        lines.append(
            f"{r.name[:24]:<24} {r.kind:<7} {r.state:<8} {r.hostname[:20]:<20} {r.pid:>7} {r.package_version[:10]:<10} "
            f"{len(r.children or []):>2}/{r.concurrency:<2}  {r.last_heartbeat_at.isoformat(timespec='seconds'):<26} "
            f"{r.runner_id}"
        )
    return "\n".join(lines)


def dumps(value: Any) -> str:
    return json.dumps(value, indent=2, default=str)
