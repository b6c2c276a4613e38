"""The control socket: a unix stream socket in the runtime directory, for ``scrinalia-runner status``.

Reachable only by the runner's user: the socket is chmod 0600 and the peer's uid (SO_PEERCRED) must be
ours or root's. Its directory is the operator's: one that does not exist is created 0700 (and removed
again at close), one that exists is never chmod-ed (``--socket /tmp/x.sock`` must not take the sticky
bit off /tmp), and one that others may write to without the sticky bit is refused, since anyone could
then replace the socket (docs/security.md, "The runner's control socket"). One JSON request line, one
JSON answer, then close:

    {"command": "status"}    the status snapshot (runner.status.STATUS_FIELDS)
    {"command": "modules"}   which heavy modules (torch, transformers, ...) the supervisor has imported
    {"command": "drain"}     start a drain, as SIGTERM would

The supervisor serves it from its own loop (the listening socket is in its ``select``). A client has
``CONTROL_CLIENT_TIMEOUT`` in all (not per read: a client trickling one byte at a time is cut at the same
moment), and one call serves at most ``CONTROL_SERVE_BUDGET`` seconds of clients, the rest waiting for the next
tick, so no client can hold the loop past its self-fence (decision 0110).
"""
from __future__ import annotations

import json
import logging
import os
import socket
import stat
import struct
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from runner.timings import CONTROL_CLIENT_MIN, CONTROL_CLIENT_TIMEOUT, CONTROL_SERVE_BUDGET

log = logging.getLogger("scrinalia.runner.control")

MAX_REQUEST = 4096


class ControlSocketBusy(RuntimeError):
    """A live supervisor already answers on this path."""


class ControlSocketUnsafe(RuntimeError):
    """The socket's directory (or what is at its path) would let another user replace the socket."""


def check_directory(directory: Path) -> None:
    """Refuse a directory that someone else may write to without the sticky bit: a user other than
    us (or root) owning it, or group or world write without +t. A sticky 1777 directory (/tmp) and
    a 0755 one are fine: the socket itself is 0600."""
    st = directory.stat()
    if not stat.S_ISDIR(st.st_mode):
        raise ControlSocketUnsafe(f"{directory} is not a directory")
    mode = stat.S_IMODE(st.st_mode)
    if st.st_uid not in (os.getuid(), 0):
        raise ControlSocketUnsafe(f"{directory} belongs to uid {st.st_uid}, who could replace the control socket; "
                                  "use a directory of this user (--socket)")
    if mode & 0o022 and not mode & stat.S_ISVTX:
        raise ControlSocketUnsafe(f"{directory} (mode {mode:04o}) may be written by others and has no sticky bit, "
                                  "so anyone could replace the control socket; use a directory of this user or "
                                  "a sticky one (--socket)")


class ControlServer:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.sock: socket.socket | None = None
        self.created_directory = False

    def open(self) -> None:
        directory = self.path.parent
        if not directory.exists():
            directory.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.chmod(directory, 0o700)  # ours: the umask may not narrow mkdir's mode to 0700
            self.created_directory = True
        check_directory(directory)
        if os.path.lexists(self.path):
            if not stat.S_ISSOCK(os.lstat(self.path).st_mode):
                raise ControlSocketUnsafe(f"{self.path} exists and is not a socket; refusing to replace it")
            try:
                query(self.path, {"command": "status"}, timeout=1.0)
            except (OSError, ValueError):
                self.path.unlink()  # a stale socket left by a killed supervisor
            else:
                raise ControlSocketBusy(f"a runner already answers on {self.path}")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old_umask = os.umask(0o177)
        try:
            sock.bind(str(self.path))
        finally:
            os.umask(old_umask)
        os.chmod(self.path, 0o600)
        sock.listen(16)
        sock.setblocking(False)
        self.sock = sock

    def fileno(self) -> int | None:
        return self.sock.fileno() if self.sock is not None else None

    def serve_pending(self, handler: Callable[[dict[str, Any]], dict[str, Any]], until: float | None = None) -> None:
        """Answer the clients waiting now, within ``CONTROL_SERVE_BUDGET`` and never past ``until`` (the caller's
        self-fence point, CLOCK_MONOTONIC); those left wait for the next call."""
        if self.sock is None:
            return
        budget_end = time.monotonic() + CONTROL_SERVE_BUDGET
        if until is not None:
            budget_end = min(budget_end, until)
        while time.monotonic() < budget_end:
            try:
                conn, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                log.warning("control socket accept failed: %s", exc)
                return
            with conn:
                self._serve_one(conn, handler, until)

    def _serve_one(self, conn: socket.socket, handler: Callable[[dict[str, Any]], dict[str, Any]],
                   until: float | None = None) -> None:
        def limit() -> float:
            at = time.monotonic() + CONTROL_CLIENT_TIMEOUT
            return at if until is None else max(min(at, until), time.monotonic() + CONTROL_CLIENT_MIN)

        deadline = limit()

        def left() -> float:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError("the control client took too long")
            return remaining

        conn.settimeout(CONTROL_CLIENT_TIMEOUT)
        try:
            uid = _peer_uid(conn)
            if uid is not None and uid not in (os.getuid(), 0):
                conn.sendall(b'{"error": "permission denied"}\n')
                return
            data = b""
            while b"\n" not in data and len(data) < MAX_REQUEST:
                conn.settimeout(left())
                chunk = conn.recv(MAX_REQUEST)
                if not chunk:
                    break
                data += chunk
            try:
                request = json.loads(data.decode() or "{}")
                if not isinstance(request, dict):
                    raise ValueError("not an object")
                answer = handler(request)
            except ValueError as exc:
                answer = {"error": f"bad request: {exc}"}
            deadline = limit()  # the answer's own budget: the handler's time is not the client's
            conn.settimeout(left())
            conn.sendall(json.dumps(answer, default=str).encode() + b"\n")
        except (TimeoutError, OSError) as exc:
            log.debug("control client dropped: %s", exc)

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
            try:
                self.path.unlink()
            except FileNotFoundError:
                pass
            if self.created_directory:
                try:
                    self.path.parent.rmdir()
                except OSError:  # not empty: someone else's files are there now
                    pass


def _peer_uid(conn: socket.socket) -> int | None:
    try:
        creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        _pid, uid, _gid = struct.unpack("3i", creds)
        return uid
    except (OSError, AttributeError):
        return None


def query(path: Path | str, request: dict[str, Any], timeout: float = 5.0) -> dict[str, Any]:
    """Send one request to a supervisor's control socket and return its answer."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        sock.connect(str(path))
        sock.sendall(json.dumps(request).encode() + b"\n")
        data = b""
        while True:
            chunk = sock.recv(1 << 16)
            if not chunk:
                break
            data += chunk
    if not data:
        raise ValueError("the supervisor closed the connection without an answer")
    return json.loads(data.decode())
