"""Log lines as an operator reads them: in the journal under systemd, plain on a terminal or in a file.

Under systemd (the unit's stderr is the journal: ``$JOURNAL_STREAM`` names the device and inode of this
process's stderr) each record goes to journald over its native protocol, with its priority (``err``,
``warning``, ...) and the fields that find a run's lines: ``RUN_ID``, ``WORKER``, ``RUNNER_ID``, so
``journalctl -u scrinalia-runner RUN_ID=<id>`` answers "what happened to run X" (docs/operations.md,
"Journal"). Where the journal's socket cannot take a record, the line goes to stderr with its ``<N>``
priority prefix, which journald reads on a stream. Elsewhere the lines stay plain.

A record carries a run's fields in ``extra=run_fields(...)``; fields set with ``set_process_fields`` (the
runner's id, once registered) go on every record of the process.
"""
from __future__ import annotations

import logging
import os
import socket
import struct
import sys
from collections.abc import Mapping
from typing import IO, Any

#: journald's socket for the native protocol (sd_journal_send).
JOURNAL_SOCKET = "/run/systemd/journal/socket"
#: The record attributes (``extra=``) that become journal fields, and their field names.
RECORD_FIELDS = {"run_id": "RUN_ID", "worker": "WORKER", "runner_id": "RUNNER_ID"}
#: The plain line's format, as before: time, level, logger, pid, message.
PLAIN_FORMAT = "%(asctime)s %(levelname)s %(name)s[%(process)d]: %(message)s"
#: The journal stamps time, pid and unit itself: the message keeps only the level and the logger.
JOURNAL_FORMAT = "%(levelname)s %(name)s: %(message)s"

_process_fields: dict[str, str] = {}


def syslog_priority(levelno: int) -> int:
    """The syslog priority of a logging level: 3 err, 4 warning, 6 info, 7 debug, 2 crit."""
    if levelno >= logging.CRITICAL:
        return 2
    if levelno >= logging.ERROR:
        return 3
    if levelno >= logging.WARNING:
        return 4
    if levelno >= logging.INFO:
        return 6
    return 7


def run_fields(run: Any) -> dict[str, str]:
    """``extra=`` for a record about one run (anything with ``run_id`` and ``worker_name``)."""
    fields = {"run_id": str(run.run_id)}
    worker = getattr(run, "worker_name", None)
    if worker is not None:
        fields["worker"] = str(worker)
    return fields


def set_process_fields(**fields: object) -> None:
    """Fields every later record of this process carries (``runner_id=...``)."""
    _process_fields.update({name: str(value) for name, value in fields.items() if value is not None})


def under_journal(environ: Mapping[str, str] | None = None, stream: IO[Any] | None = None) -> bool:
    """True when ``stream`` (stderr) is the journal stream systemd gave this service (``$JOURNAL_STREAM``
    is ``DEVICE:INODE`` of it); a redirected or inherited-elsewhere stderr is not."""
    env = os.environ if environ is None else environ
    value = env.get("JOURNAL_STREAM", "")
    device, _, inode = value.partition(":")
    if not device.isdigit() or not inode.isdigit():
        return False
    try:
        st = os.fstat((stream or sys.stderr).fileno())
    except (OSError, ValueError, AttributeError):
        return False
    return (st.st_dev, st.st_ino) == (int(device), int(inode))


def priority_line(text: str, levelno: int = logging.ERROR, environ: Mapping[str, str] | None = None) -> str:
    """A line written straight to stderr (a refusal before logging is set up): with its ``<N>`` priority
    prefix under systemd, so the journal files it as ``err``; unchanged elsewhere."""
    return f"<{syslog_priority(levelno)}>{text}" if under_journal(environ) else text


def journal_fields(record: logging.LogRecord, message: str, identifier: str) -> dict[str, str]:
    """The native-protocol fields of one record."""
    fields = {
        "MESSAGE": message,
        "PRIORITY": str(syslog_priority(record.levelno)),
        "SYSLOG_IDENTIFIER": identifier,
        "LOGGER": record.name,
        "CODE_FILE": record.pathname,
        "CODE_LINE": str(record.lineno),
        "CODE_FUNC": record.funcName,
    }
    for attribute, field in RECORD_FIELDS.items():
        value = getattr(record, attribute, None)
        if value is None:
            value = _process_fields.get(attribute)
        if value is not None:
            fields[field] = str(value)
    return fields


def encode_fields(fields: Mapping[str, str]) -> bytes:
    """journald's native datagram: ``NAME=value\\n``, or for a value with a newline ``NAME\\n``, its length
    as 64-bit little endian, the value and ``\\n``."""
    out = bytearray()
    for name, value in fields.items():
        data = value.encode("utf-8", "replace")
        if b"\n" in data:
            out += name.encode() + b"\n" + struct.pack("<Q", len(data)) + data + b"\n"
        else:
            out += name.encode() + b"=" + data + b"\n"
    return bytes(out)


class PriorityFormatter(logging.Formatter):
    """``<N>`` before each line (journald's stream protocol reads it as the line's priority)."""

    def format(self, record: logging.LogRecord) -> str:
        prefix = f"<{syslog_priority(record.levelno)}>"
        return "\n".join(prefix + line for line in super().format(record).splitlines() or [""])


class JournalHandler(logging.Handler):
    """Sends each record to journald natively; a record it cannot send goes to stderr with ``<N>``."""

    def __init__(self, identifier: str, address: str = JOURNAL_SOCKET, fallback: IO[str] | None = None) -> None:
        super().__init__()
        self.identifier = identifier
        self.address = address
        self.setFormatter(logging.Formatter(JOURNAL_FORMAT))
        self._fallback = logging.StreamHandler(fallback or sys.stderr)
        self._fallback.setFormatter(PriorityFormatter(JOURNAL_FORMAT))
        self._socket: socket.socket | None = None

    def _send(self, payload: bytes) -> None:
        if self._socket is None:
            self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self._socket.sendto(payload, self.address)

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = self.format(record)
            self._send(encode_fields(journal_fields(record, message, self.identifier)))
        except OSError:
            # A datagram too large, the socket gone: the line still reaches the journal, by the stream.
            self._fallback.emit(record)
        except Exception:
            self.handleError(record)

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close()
            self._socket = None
        super().close()


def uvicorn_log_config(level: str, identifier: str = "scrinalia-api",
                       environ: Mapping[str, str] | None = None) -> dict[str, Any] | None:
    """uvicorn's ``log_config`` under systemd: its lines and the app's to the journal, each at its priority
    (uvicorn applies it in every worker process). None elsewhere: uvicorn's own plain lines."""
    if not under_journal(environ):
        return None
    level = level.upper()
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "handlers": {"journal": {"()": "scrinalia.journal.JournalHandler", "identifier": identifier}},
        "loggers": {
            "uvicorn": {"handlers": ["journal"], "level": level, "propagate": False},
            "uvicorn.error": {"level": level},
            "uvicorn.access": {"handlers": ["journal"], "level": level, "propagate": False},
        },
        "root": {"handlers": ["journal"], "level": level},
    }


def setup_logging(level: int | str, identifier: str, environ: Mapping[str, str] | None = None,
                  plain_format: str = PLAIN_FORMAT) -> logging.Handler | None:
    """As ``logging.basicConfig``: the root logger's handler, unless one is already there (a host process
    that configured logging, a test's capture): the journal under systemd, plain lines on stderr elsewhere."""
    root = logging.getLogger()
    root.setLevel(getattr(logging, level.upper(), logging.INFO) if isinstance(level, str) else level)
    if root.handlers:
        return None
    handler: logging.Handler
    if under_journal(environ):
        handler = JournalHandler(identifier)
    else:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(plain_format))
    root.addHandler(handler)
    return handler
