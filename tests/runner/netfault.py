"""Real network faults between a runner and its database, for the liveness tests (issue 9).

* ``drop_port``: packets to and from the test cluster's TCP port dropped on the loopback interface
  (an nftables table of our own, matching that one port only, always deleted in a ``finally``), the
  silent partition of a VPN that goes away: no RST, no ICMP, nothing.
* ``SilentProxy``: a TCP proxy the runner connects through, which can switch to "accept bytes and never
  answer": both ends' bytes are read (so their kernels see every byte acknowledged, and
  ``tcp_user_timeout`` never fires) and thrown away.
* ``Observer``: the test's own view of the database while the port is cut: a connection through the
  cluster's unix socket, which the packet filter does not see.
* ``DeathClock``: when each watched process died, by the wall clock (pidfd: no polling error), to compare
  with the database's ``lease_expires_at`` (the same host: one clock).
"""
from __future__ import annotations

import os
import select
import shutil
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url


def nft_available() -> bool:
    if shutil.which("nft") is None or os.geteuid() != 0:
        return False
    probe = subprocess.run(["nft", "list", "tables"], capture_output=True)
    return probe.returncode == 0


def require_nft() -> None:
    if not nft_available():
        pytest.skip("nftables is needed (root and the nft command: make system-deps installs it)")


@contextmanager
def drop_port(port: int) -> Iterator[None]:
    """Drop every packet to or from ``port`` on this host (loopback included) while inside."""
    table = f"scrinalia_partition_{port}"
    rules = (f"table inet {table} {{\n"
             f"  chain out {{ type filter hook output priority -10; policy accept;\n"
             f"    tcp dport {port} drop\n    tcp sport {port} drop\n  }}\n}}\n")
    subprocess.run(["nft", "-f", "-"], input=rules.encode(), check=True)
    try:
        yield
    finally:
        subprocess.run(["nft", "delete", "table", "inet", table], check=False, capture_output=True)


class SilentProxy:
    """127.0.0.1:<port> -> the database; ``silence()`` makes it swallow everything, ``heal()`` undoes it
    (closing the connections whose bytes it threw away: their streams cannot be resumed)."""

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        self.upstream = (upstream_host, upstream_port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self._silent = threading.Event()
        self._lock = threading.Lock()
        self._spoiled: list[socket.socket] = []   # connections that lost bytes to the silence
        self._live: list[tuple[socket.socket, socket.socket | None]] = []
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def silence(self) -> None:
        with self._lock:
            self._silent.set()
            for a, b in self._live:
                self._spoiled.extend(s for s in (a, b) if s is not None)

    def heal(self) -> None:
        with self._lock:
            self._silent.clear()
            spoiled, self._spoiled = self._spoiled, []
            self._live = [(a, b) for a, b in self._live if a not in spoiled]
        for sock in spoiled:
            _close(sock)

    def close(self) -> None:
        self._closed = True
        _close(self.listener)
        with self._lock:
            for a, b in self._live:
                _close(a)
                if b is not None:
                    _close(b)

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if self._silent.is_set():  # accepted, and never answered
                with self._lock:
                    self._live.append((client, None))
                    self._spoiled.append(client)
                threading.Thread(target=self._pump, args=(client, None), daemon=True).start()
                continue
            try:
                upstream = socket.create_connection(self.upstream, timeout=5)
                upstream.settimeout(None)
            except OSError:
                _close(client)
                continue
            with self._lock:
                self._live.append((client, upstream))
            threading.Thread(target=self._pump, args=(client, upstream), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket | None) -> None:
        while True:
            try:
                data = src.recv(65536)
            except OSError:
                data = b""
            if not data:
                _close(src)
                if dst is not None:
                    _close(dst)
                return
            if self._silent.is_set() or dst is None:
                continue  # read (acknowledged by the kernel), never passed on
            try:
                dst.sendall(data)
            except OSError:
                _close(src)
                return


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    try:
        sock.close()
    except OSError:
        pass


def through_proxy(database_url: str, proxy: SilentProxy) -> str:
    return make_url(database_url).set(host="127.0.0.1", port=proxy.port).render_as_string(hide_password=False)


def cluster_port(database_url: str) -> int:
    url = make_url(database_url)
    if url.host not in ("127.0.0.1", "localhost") or url.port is None:
        pytest.skip("the partition needs the local test cluster (TCP on 127.0.0.1)")
    return int(url.port)


def observer_engine(admin_engine: Engine, database_url: str) -> Engine:
    """An engine on the cluster's unix socket (unaffected by ``drop_port``)."""
    with admin_engine.connect() as conn:
        dirs = conn.execute(text("SHOW unix_socket_directories")).scalar_one()
    directory = next((d.strip() for d in str(dirs).split(",") if d.strip()), "")
    if not directory:
        pytest.skip("the test cluster has no unix socket")
    url = make_url(database_url).set(drivername="postgresql+psycopg", host=None, port=None)
    return create_engine(url, connect_args={"host": directory}, pool_pre_ping=True)


class DeathClock:
    """Records, by ``time.time()``, when each watched pid goes away (pidfd readable)."""

    def __init__(self) -> None:
        self.died: dict[int, float] = {}
        self._fds: dict[int, int] = {}
        self._lock = threading.Lock()
        self._stop = False
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def watch(self, pid: int) -> None:
        try:
            fd = os.pidfd_open(pid)
        except ProcessLookupError:
            self.died.setdefault(pid, time.time())
            return
        with self._lock:
            self._fds[fd] = pid

    def _watch(self) -> None:
        while not self._stop:
            with self._lock:
                fds = list(self._fds)
            if not fds:
                time.sleep(0.005)
                continue
            ready, _, _ = select.select(fds, [], [], 0.01)
            now = time.time()
            for fd in ready:
                with self._lock:
                    pid = self._fds.pop(fd)
                os.close(fd)
                self.died[pid] = now

    def close(self) -> None:
        self._stop = True
        self._thread.join(timeout=1)
