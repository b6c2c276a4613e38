"""Small builders shared by the ledger tests."""
from __future__ import annotations

import socket
import uuid

from sqlalchemy import Engine

from scrinalia.db import migrate
from scrinalia.domains.archive import registry


def register_runner(engine: Engine, capabilities: list[str], *, lease: float = 60, heartbeat: float = 15,
                    name: str = "test-runner", kind: str = "daemon") -> uuid.UUID:
    runner_id = uuid.uuid4()
    registry.register(
        engine,
        registry.RunnerRegistration(
            runner_id=runner_id,
            name=name,
            hostname=socket.gethostname(),
            pid=1,
            package_version="test",
            schema_revision=migrate.head_revision(),  # a runner of this release
            capabilities=capabilities,
            concurrency=1,
            heartbeat_seconds=min(heartbeat, lease / 4),
            lease_seconds=lease,
            kind=kind,
        ),
    )
    return runner_id
