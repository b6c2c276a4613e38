"""Framing of the private sockets between the supervisor, the fork server and the children.

Both ends are this package's own code over a ``socketpair`` that no other process can reach, so a
frame is a 4-byte length and a pickle (a ``WorkerRun`` crosses unchanged). Messages are tuples
``(kind, payload)``.

Parent <-> child (SOCK_STREAM):

    parent -> child   ("assign", {...})        the run, its resolved config (already written by record_start),
                                               how to reach the database, the preload list
                      ("cancel", {})           cancellation requested: stop at the next batch boundary
    child -> parent   ("started", {"t"})       the worker's code is about to run (CLOCK_MONOTONIC)
                      ("progress", {...})      done/total/unit (throttled)
                      ("result", {...})        status, result, error, reason, metrics; the child exits
                                               next. ``lease_lost`` True (status None): RunContext.commit
                                               found the lease gone; the supervisor writes nothing
"""
from __future__ import annotations

import pickle
import socket
import struct
from typing import Any

HEADER = struct.Struct("!I")
MAX_FRAME = 64 * 1024 * 1024

Message = tuple[str, dict[str, Any]]


def encode(kind: str, payload: dict[str, Any] | None = None) -> bytes:
    body = pickle.dumps((kind, payload or {}), protocol=pickle.HIGHEST_PROTOCOL)
    if len(body) > MAX_FRAME:
        raise ValueError(f"message {kind!r} is {len(body)} bytes, over the {MAX_FRAME}-byte limit")
    return HEADER.pack(len(body)) + body


def send(sock: socket.socket, kind: str, payload: dict[str, Any] | None = None) -> None:
    """Send one message (blocking socket)."""
    sock.sendall(encode(kind, payload))


def _recv_exact(sock: socket.socket, size: int) -> bytes:
    chunks = bytearray()
    while len(chunks) < size:
        chunk = sock.recv(size - len(chunks))
        if not chunk:
            raise EOFError("the other end closed the socket")
        chunks += chunk
    return bytes(chunks)


def recv(sock: socket.socket) -> Message:
    """Receive one message (blocking socket). Raises EOFError when the peer has gone."""
    (size,) = HEADER.unpack(_recv_exact(sock, HEADER.size))
    if size > MAX_FRAME:
        raise ValueError(f"frame of {size} bytes is over the limit")
    return pickle.loads(_recv_exact(sock, size))


class FrameReader:
    """Reads whatever a non-blocking socket holds and returns the complete messages."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = bytearray()
        self.eof = False

    def read(self) -> list[Message]:
        while not self.eof:
            try:
                chunk = self.sock.recv(1 << 16)
            except (BlockingIOError, InterruptedError):
                break
            except (ConnectionResetError, OSError):
                chunk = b""
            if not chunk:
                self.eof = True
                break
            self.buffer += chunk
        messages: list[Message] = []
        while len(self.buffer) >= HEADER.size:
            (size,) = HEADER.unpack_from(self.buffer)
            if len(self.buffer) < HEADER.size + size:
                break
            body = bytes(self.buffer[HEADER.size : HEADER.size + size])
            del self.buffer[: HEADER.size + size]
            messages.append(pickle.loads(body))
        return messages
