"""What /proc and the cgroup say about a process (RSS, peak RSS, liveness, OOM kills), and its title."""
from __future__ import annotations

import os
from pathlib import Path


def _status_kb(pid: int, key: str) -> int | None:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def rss_bytes(pid: int) -> int | None:
    kb = _status_kb(pid, "VmRSS")
    return None if kb is None else kb * 1024


def peak_rss_bytes(pid: int) -> int | None:
    kb = _status_kb(pid, "VmHWM")
    return None if kb is None else kb * 1024


def is_alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as fh:
            state = fh.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def mapped_files(pid: int) -> set[str]:
    """The files mapped into ``pid`` (shared libraries among them)."""
    out: set[str] = set()
    try:
        with open(f"/proc/{pid}/maps", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                parts = line.split(None, 5)
                if len(parts) == 6 and parts[5].startswith("/"):
                    out.add(parts[5].strip())
    except OSError:
        pass
    return out


def _own_cgroup_paths() -> list[tuple[str, str]]:
    """(controller-or-'' , path) lines of /proc/self/cgroup."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        parts = line.split(":", 2)
        if len(parts) == 3:
            out.append((parts[1], parts[2]))
    return out


def oom_kill_counter() -> int | None:
    """The ``oom_kill`` counter of this process's memory cgroup, or None where it cannot be read.

    cgroup v2: ``memory.events``; cgroup v1: ``memory.oom_control`` (kernel 4.13+). The children live in
    the supervisor's cgroup, so an increase between a child's start and its SIGKILL is an OOM kill.
    """
    candidates: list[Path] = []
    for controllers, path in _own_cgroup_paths():
        rel = path.lstrip("/")
        if controllers == "":
            candidates.append(Path("/sys/fs/cgroup") / rel / "memory.events")
        elif "memory" in controllers.split(","):
            candidates.append(Path("/sys/fs/cgroup/memory") / rel / "memory.oom_control")
    for candidate in candidates:
        try:
            for line in candidate.read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except (OSError, ValueError):
            continue
    return None


def kill_group(pid: int, sig: int) -> bool:
    """Signal the process group led by ``pid`` (every child is a session leader). False if gone."""
    try:
        os.killpg(pid, sig)
        return True
    except ProcessLookupError:
        try:
            os.kill(pid, sig)
            return True
        except ProcessLookupError:
            return False
    except PermissionError:
        return False


def set_title(title: str) -> None:
    """Show ``title`` in ps and top (``setproctitle`` rewrites /proc/self/cmdline); nothing without it.

    The supervisor, the fork server and each child title themselves, so an operator can tell them apart."""
    try:
        import setproctitle
    except ImportError:
        return
    setproctitle.setproctitle(title)
