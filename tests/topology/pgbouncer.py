"""A real PgBouncer (Debian's package) in front of a test cluster: started on a free port with an ini
generated for the test, as the tests start their own PostgreSQL clusters (tests/foundation/clusters.py).

PgBouncer refuses to run as root, so when we are root it runs as the ``postgres`` user (the cluster's
server user), like the cluster itself. Authentication is ``trust`` against the cluster's own trust
authentication on 127.0.0.1; the user names a test connects as are listed in the generated auth file.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from scrinalia.db.local_cluster import SERVER_USER, free_port

#: What docs/install.md ("PgBouncer and managed PostgreSQL") tells an operator to add to PgBouncer's
#: defaults: psycopg sends libpq's ``options`` (our sessions' keepalives and bounds); PgBouncer refuses
#: an unknown startup parameter unless it is listed here.
DOCUMENTED_SETTINGS: dict[str, str] = {"ignore_startup_parameters": "extra_float_digits,options"}


def pgbouncer_binary() -> str:
    found = shutil.which("pgbouncer") or ("/usr/sbin/pgbouncer" if Path("/usr/sbin/pgbouncer").exists() else None)
    if found is None:
        raise RuntimeError("pgbouncer is not installed (Debian package pgbouncer; `make system-deps`)")
    return found


@dataclass
class PgBouncer:
    """A running PgBouncer: ``url(database)`` for a client, ``log()`` for what it said."""

    port: int
    root: Path
    proc: subprocess.Popen[bytes]

    def url(self, database: str, user: str = SERVER_USER) -> str:
        return f"postgresql://{user}@127.0.0.1:{self.port}/{database}"

    def log(self) -> str:
        try:
            return (self.root / "pgbouncer.log").read_text(errors="replace")
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # 1.18's immediate shutdown (SIGINT waits for clients)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _ini(port: int, server_port: int, root: Path, pool_mode: str, settings: Mapping[str, str]) -> str:
    lines = [
        "[databases]",
        f"* = host=127.0.0.1 port={server_port}",
        "[pgbouncer]",
        "listen_addr = 127.0.0.1",
        f"listen_port = {port}",
        "unix_socket_dir =",
        "auth_type = trust",
        f"auth_file = {root / 'userlist.txt'}",
        f"pool_mode = {pool_mode}",
        "max_client_conn = 500",
        "default_pool_size = 20",
        f"logfile = {root / 'pgbouncer.log'}",
        f"admin_users = {SERVER_USER}",
    ]
    lines += [f"{name} = {value}" for name, value in settings.items()]
    return "\n".join(lines) + "\n"


@contextmanager
def pgbouncer(
    server_port: int,
    *,
    pool_mode: str = "transaction",
    settings: Mapping[str, str] | None = None,
    users: Sequence[str] = (SERVER_USER, "scrinalia_runner"),
) -> Iterator[PgBouncer]:
    """A PgBouncer in ``pool_mode`` in front of the server on 127.0.0.1:``server_port``, with its
    default settings plus ``settings`` (pass ``DOCUMENTED_SETTINGS`` for the supported configuration)."""
    root = Path(tempfile.mkdtemp(prefix="scrinalia-pgb-"))
    port = free_port()
    (root / "userlist.txt").write_text("".join(f'"{u}" ""\n' for u in users))
    (root / "pgbouncer.ini").write_text(_ini(port, server_port, root, pool_mode, settings or {}))
    argv = [pgbouncer_binary(), str(root / "pgbouncer.ini")]
    user = None
    if os.geteuid() == 0:
        for path in (root, *root.iterdir()):
            shutil.chown(path, SERVER_USER, SERVER_USER)
        user = SERVER_USER  # the process itself (not runuser), so that it gets our signals
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, user=user, group=user)
    bouncer = PgBouncer(port, root, proc)
    try:
        _wait_listening(bouncer)
        yield bouncer
    finally:
        bouncer.stop()
        shutil.rmtree(root, ignore_errors=True)


def _wait_listening(bouncer: PgBouncer, timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if bouncer.proc.poll() is not None:
            raise RuntimeError(f"pgbouncer exited {bouncer.proc.returncode}:\n{bouncer.log()}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", bouncer.port)) == 0:
                return
        time.sleep(0.05)
    raise RuntimeError(f"pgbouncer did not listen on {bouncer.port}:\n{bouncer.log()}")
