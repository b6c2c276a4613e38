"""Small builders shared by the ledger tests."""
from __future__ import annotations

import re
import socket
import uuid
from typing import Any

from sqlalchemy import Engine

from scrinalia.db import migrate
from scrinalia.domains.archive import registry


def register_runner(engine: Engine, capabilities: list[str], *, lease: float = 60, heartbeat: float = 15,
                    name: str = "test-runner", kind: str = "daemon", devices: list[dict[str, Any]] | None = None,
                    sees: dict[str, Any] | None = None) -> uuid.UUID:
    runner_id = uuid.uuid4()
    registry.register(
        engine,
        registry.RunnerRegistration(
            runner_id=runner_id,
            name=name,
            hostname=socket.gethostname(),
            pid=1,
            package_version="test",
            schema_revision=migrate.head_revision(),
            capabilities=capabilities,
            concurrency=1,
            heartbeat_seconds=min(heartbeat, lease / 4),
            lease_seconds=lease,
            kind=kind,
            devices=devices or [],
            sees=sees or {},
        ),
    )
    return runner_id


class WireTrace:
    """Every statement an engine sends to the server, read off libpq's own protocol trace.

    Installed before any other connect hook (``insert=True``), so the dialect's first-connect queries are
    seen too. Each ``Query`` (simple protocol: psycopg's BEGIN/COMMIT) and ``Parse`` (extended
    protocol: a statement with parameters) message is one statement; the pool's pre-ping (an empty
    query, ``;``) is not a statement and is left out.
    """

    def __init__(self, engine: Engine) -> None:
        import tempfile

        from sqlalchemy import event

        self._file = tempfile.TemporaryFile(mode="w+")
        event.listen(engine, "connect", self._on_connect, insert=True)

    def _on_connect(self, dbapi_connection, connection_record) -> None:
        dbapi_connection.pgconn.trace(self._file.fileno())

    def statements(self) -> list[str]:
        self._file.flush()
        self._file.seek(0)
        messages: list[str] = []
        for line in self._file:  # a message is one line, unless its SQL has newlines (continuation lines)
            if re.match(r"^\S+ \S+\t[FB]\t", line) or not messages:
                messages.append(line)
            else:
                messages[-1] += line
        self._file.seek(0, 2)
        out = []
        for message in messages:
            parts = message.split("\t", 4)
            if len(parts) > 4 and parts[1] == "F" and parts[3] in ("Query", "Parse"):
                body = parts[4].strip()
                if parts[3] == "Parse":  # Parse "name" "sql" n-param-types...
                    body = body[body.index('" "') + 2:]
                sql = " ".join(body[1:body.rfind('"')].split())  # Query "sql"
                if sql != ";":
                    out.append(sql)
        return out
