"""A container booted with systemd as PID 1, on a root of its own (decision 0300).

The root is an overlay: the host's ``/`` read-only underneath, a private tmpfs on top that takes every
write, so what the container installs, creates or removes never reaches the host; ``systemd-nspawn`` gives
it its own /tmp, /run, /dev, PID, mount, IPC and UTS namespaces; it shares the host's network
(the test's PostgreSQL on 127.0.0.1, the package registries for the install).
The host's own enabled services are masked in the overlay before the boot, so the container starts only
systemd's basic services and what a test enables. It is driven through ``nsenter`` into its PID 1's
namespaces (``systemctl``, ``journalctl``, ``runuser`` as an operator's root shell on that host would run
them); nothing is registered with a machined on the host, which may have no systemd at all.

Never boot systemd over the host's live ``/``: its tmpfiles empties /tmp and it starts the host's units.
"""
from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

SYSTEMD = Path("/lib/systemd/systemd")
#: What the container's boot may take before it is called failed (systemd's basic services: ~5 s here).
BOOT_TIMEOUT = 90.0
#: Whether the host itself is booted with systemd (its runtime directory exists only then).
HOST_RUNS_SYSTEMD = Path("/run/systemd/system").is_dir()
#: The overlay's writable layer: the venv with torch is most of it.
UPPER_SIZE = "6g"


class ContainerError(RuntimeError):
    """The container cannot be made or booted here; the message says why."""


def why_no_container() -> str | None:
    """None when this host can boot a container; else the reason (missing tool, no privilege)."""
    if os.geteuid() != 0:
        return "booting a container needs root (overlay mounts, namespaces)"
    for tool in ("systemd-nspawn", "nsenter", "mount", "umount"):
        if shutil.which(tool) is None:
            return f"{tool} is missing (Debian package systemd-container / util-linux; make system-deps)"
    if not SYSTEMD.exists():
        return f"{SYSTEMD} is missing (Debian package systemd)"
    if "overlay" not in Path("/proc/filesystems").read_text():
        return "the kernel has no overlayfs"
    return None


@dataclass
class Bind:
    """A host directory seen inside the container at ``target``."""

    source: Path
    target: str
    read_only: bool = True

    def flag(self) -> str:
        return f"--bind{'-ro' if self.read_only else ''}={self.source}:{self.target}"


@dataclass
class Container:
    base: Path
    name: str
    binds: list[Bind] = field(default_factory=list)
    #: False: the host's network namespace (the registries for the install, the test's PostgreSQL on
    #: 127.0.0.1); the host's own enabled services are masked, so nothing else of the container listens.
    private_network: bool = False
    nspawn: subprocess.Popen[bytes] | None = None
    leader: int | None = None
    _mounted: list[Path] = field(default_factory=list)

    @property
    def root(self) -> Path:
        return self.base / "root"

    @property
    def console(self) -> Path:
        return self.base / "console.log"

    # --- making and booting ----------------------------------------------------------------------------

    def prepare(self) -> None:
        """The overlay root, with the host's enabled units masked and a host name of its own."""
        layer = self.base / "layer"
        for d in (layer, self.root):
            d.mkdir(parents=True, exist_ok=True)
        self._mount(["-t", "tmpfs", "-o", f"size={UPPER_SIZE},mode=0755", "tmpfs", str(layer)], layer)
        (layer / "upper").mkdir()
        (layer / "work").mkdir()
        self._mount(["-t", "overlay", "overlay", "-o",
                     f"lowerdir=/,upperdir={layer / 'upper'},workdir={layer / 'work'}", str(self.root)], self.root)
        units = self.root / "etc" / "systemd" / "system"
        for wants in Path("/etc/systemd/system").glob("*.wants"):
            for link in wants.iterdir():
                self._mask(units, link.name)
        for alias in Path("/etc/systemd/system").glob("*.service"):
            self._mask(units, alias.name)
        for unit in ("systemd-timesyncd.service", "apt-daily.timer", "apt-daily-upgrade.timer", "getty@tty1.service",
                     "console-getty.service", "e2scrub_all.timer", "fstrim.timer", "man-db.timer"):
            self._mask(units, unit)
        (self.root / "etc" / "hostname").write_text(f"{self.name}\n")

    @staticmethod
    def _mask(units: Path, name: str) -> None:
        target = units / name
        if target.is_symlink() or target.exists():
            target.unlink()
        target.symlink_to("/dev/null")

    def _mount(self, argv: list[str], where: Path) -> None:
        proc = subprocess.run(["mount", *argv], capture_output=True, text=True, timeout=60)
        if proc.returncode != 0:
            raise ContainerError(f"mount {where}: {proc.stderr.strip()}")
        self._mounted.append(where)

    def boot(self) -> None:
        """``systemd-nspawn --boot``; returns once the container's systemd says it is up."""
        with open(self.console, "wb") as console:
            self.nspawn = subprocess.Popen(
                ["systemd-nspawn", "--quiet", "--directory", str(self.root), "--boot",
                 *(["--private-network"] if self.private_network else []), "--register=no",
                 # No systemd on the host: the container stays in this process's cgroup. On a systemd host
                 # nspawn asks it for a scope of its own, as it does by default.
                 *([] if HOST_RUNS_SYSTEMD else ["--keep-unit"]),
                 f"--machine={self.name}", "--console=read-only",
                 *(b.flag() for b in self.binds)],
                stdin=subprocess.DEVNULL, stdout=console, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + BOOT_TIMEOUT
        while time.monotonic() < deadline:
            if self.nspawn.poll() is not None:
                raise ContainerError(f"systemd-nspawn exited {self.nspawn.returncode}: {self.console_tail()}")
            self.leader = self.leader or self._find_leader()
            if self.leader is not None:
                state = self.sh("systemctl is-system-running --wait", check=False, timeout=BOOT_TIMEOUT)
                if state.stdout.strip() in ("running", "degraded"):
                    return
                if state.stdout.strip() not in ("", "initializing", "starting"):
                    raise ContainerError(f"the container's systemd is {state.stdout.strip()!r}: "
                                         + self.sh("systemctl --failed --no-pager", check=False).stdout)
            time.sleep(0.2)
        raise ContainerError(f"the container did not boot within {BOOT_TIMEOUT:g}s: {self.console_tail()}")

    def _find_leader(self) -> int | None:
        """The container's PID 1 as the host sees it: the child of nspawn that runs systemd."""
        assert self.nspawn is not None
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
                ppid = int(stat.rsplit(")", 1)[1].split()[1])
                if ppid == self.nspawn.pid and (entry / "comm").read_text().strip() == "systemd":
                    return int(entry.name)
            except (OSError, ValueError, IndexError):
                continue
        return None

    def console_tail(self, chars: int = 3000) -> str:
        try:
            return self.console.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    # --- driving -----------------------------------------------------------------------------------------

    def sh(self, script: str, *, check: bool = True, timeout: float = 120,
           input: str | None = None) -> subprocess.CompletedProcess[str]:
        """``/bin/sh -c script`` as root inside the container (its namespaces, its root, its PATH)."""
        assert self.leader is not None, "not booted"
        proc = subprocess.run(
            ["nsenter", "-t", str(self.leader), "-a", "--", "/usr/bin/env", "-i",
             "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/root", "LANG=C.UTF-8",
             "/bin/sh", "-c", script],
            capture_output=True, text=True, timeout=timeout, input=input, cwd="/")
        if check and proc.returncode != 0:
            raise ContainerError(f"in the container: {script!r} exited {proc.returncode}:\n"
                                 f"{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
        return proc

    # --- the end -----------------------------------------------------------------------------------------

    def destroy(self) -> None:
        """Power the container off (SIGKILL if it does not stop), then unmount and remove everything."""
        if self.nspawn is not None and self.nspawn.poll() is None:
            self.nspawn.send_signal(signal.SIGTERM)  # nspawn asks the container's systemd to power off
            try:
                self.nspawn.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.nspawn.pid, signal.SIGKILL)
                self.nspawn.wait(timeout=30)
        for where in reversed(self._mounted):
            subprocess.run(["umount", "--lazy", str(where)], capture_output=True, timeout=60)
        self._mounted.clear()
        if not any(os.path.ismount(d) for d in (self.root, self.base / "layer")):
            shutil.rmtree(self.base, ignore_errors=True)
