"""A private PostgreSQL cluster made with the installed binaries (initdb, pg_ctl).

Used by the test harness (a throwaway cluster per test session) and by ``scrinalia dev`` (a durable one
under ``.scrinalia/``). PostgreSQL refuses to run as root, so when we are root every server command runs
as the ``postgres`` user through ``runuser``. The server listens on 127.0.0.1 and on a private socket
directory, with trust authentication for local connections only.
"""
from __future__ import annotations

import glob
import os
import random
import shutil
import socket
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

SERVER_USER = "postgres"


class LocalClusterError(RuntimeError):
    pass


def find_bindir() -> Path:
    """The newest installed PostgreSQL bin directory that has initdb and pg_ctl."""
    candidates = sorted(
        glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(Path(p).parent.name), reverse=True
    )
    for cand in candidates:
        if Path(cand, "initdb").exists() and Path(cand, "pg_ctl").exists():
            return Path(cand)
    initdb = shutil.which("initdb")
    if initdb and shutil.which("pg_ctl"):
        return Path(initdb).parent
    raise LocalClusterError("no PostgreSQL server binaries found (initdb, pg_ctl); install postgresql")


#: Where ``free_port`` looks: below Linux's ephemeral range (``net.ipv4.ip_local_port_range``, 32768-60999
#: by default), so no outgoing connection of another process is handed the port between our check and the
#: server's bind, as a port the kernel picks from that range can be.
LISTEN_PORTS = range(20000, 32768)


def free_port() -> int:
    """A port on 127.0.0.1 that nothing listens on now, drawn at random from ``LISTEN_PORTS``."""
    draw = random.SystemRandom()
    for _ in range(200):
        port = draw.choice(LISTEN_PORTS)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise LocalClusterError(f"no free port in {LISTEN_PORTS.start}-{LISTEN_PORTS.stop - 1} on 127.0.0.1")


@dataclass
class LocalCluster:
    data_dir: Path
    port: int
    bindir: Path

    @classmethod
    def create(cls, root: Path, port: int | None = None) -> LocalCluster:
        """Init a cluster under ``root`` (or reuse the one already there) and return it, not started."""
        root = root.resolve()
        cluster = cls(root / "pgdata", port or _saved_port(root) or free_port(), find_bindir())
        root.mkdir(parents=True, exist_ok=True)
        (root / "port").write_text(str(cluster.port))
        if not (cluster.data_dir / "PG_VERSION").exists():
            cluster._init()
        return cluster

    @property
    def socket_dir(self) -> Path:
        return self.data_dir.parent / "socket"

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{SERVER_USER}@127.0.0.1:{self.port}/{database}"

    def _as_server_user(self, argv: list[str]) -> list[str]:
        if os.geteuid() == 0:
            return ["runuser", "-u", SERVER_USER, "--", *argv]
        return argv

    def _chown(self, path: Path) -> None:
        if os.geteuid() == 0:
            shutil.chown(path, SERVER_USER, SERVER_USER)

    def _init(self) -> None:
        root = self.data_dir.parent
        # The server user must be able to reach its directories through every parent.
        for parent in [root, *root.parents]:
            if parent == Path("/"):
                break
            mode = parent.stat().st_mode
            if os.geteuid() == 0 and not mode & 0o001:
                os.chmod(parent, mode | 0o011)
        for d in (self.data_dir, self.socket_dir):
            d.mkdir(parents=True, exist_ok=True)
            self._chown(d)
        os.chmod(self.data_dir, 0o700)
        _run(self._as_server_user([
            str(self.bindir / "initdb"), "-D", str(self.data_dir), "-U", SERVER_USER,
            "-A", "trust", "-E", "UTF8", "--locale=C.UTF-8", "--no-sync",
        ]))

    def start(self, *, fsync: bool = True, max_connections: int = 200,
              settings: Mapping[str, str] | None = None) -> None:
        """Start the server; ``settings`` are more ``-c name=value`` (no spaces in a value), for a test
        cluster that needs TLS or a short autovacuum naptime."""
        if self.is_running():
            return
        self.socket_dir.mkdir(parents=True, exist_ok=True)
        self._chown(self.socket_dir)
        options = (
            f"-p {self.port} -k {self.socket_dir} -c listen_addresses=127.0.0.1"
            f" -c max_connections={max_connections} -c fsync={'on' if fsync else 'off'}"
            f" -c synchronous_commit={'on' if fsync else 'off'} -c full_page_writes={'on' if fsync else 'off'}"
        ) + "".join(f" -c {name}={value}" for name, value in (settings or {}).items())
        log = self.data_dir.parent / "postgres.log"
        log.touch()
        self._chown(log)
        _run(self._as_server_user([
            str(self.bindir / "pg_ctl"), "-D", str(self.data_dir), "-l", str(log), "-o", options,
            "-w", "-t", "60", "start",
        ]))
        self._wait_ready()

    def is_running(self) -> bool:
        proc = subprocess.run(
            self._as_server_user([str(self.bindir / "pg_ctl"), "-D", str(self.data_dir), "status"]),
            capture_output=True,
        )
        return proc.returncode == 0

    def _wait_ready(self, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", self.port)) == 0:
                    return
            time.sleep(0.05)
        raise LocalClusterError(f"PostgreSQL did not accept connections on port {self.port}")

    def stop(self, mode: str = "fast") -> None:
        if self.is_running():
            pg_ctl = str(self.bindir / "pg_ctl")
            _run(self._as_server_user([pg_ctl, "-D", str(self.data_dir), "-m", mode, "-w", "stop"]))

    def destroy(self) -> None:
        self.stop("immediate")
        shutil.rmtree(self.data_dir.parent, ignore_errors=True)


def _saved_port(root: Path) -> int | None:
    try:
        return int((root / "port").read_text().strip())
    except (OSError, ValueError):
        return None


def _run(argv: list[str]) -> None:
    proc = subprocess.run(argv, capture_output=True, text=True)
    if proc.returncode != 0:
        output = proc.stderr.strip() or proc.stdout.strip()
        raise LocalClusterError(f"{' '.join(argv[:1] + argv[-1:])} failed: {output}")
