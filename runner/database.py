"""The supervisor's database: its engine (short timeouts, no pre-ping), the schema check, the registration."""
from __future__ import annotations

import math
import os
import socket
import uuid
from typing import Any

from sqlalchemy import Engine

from runner import bounded
from runner.options import RunnerOptions
from runner.timings import ChildSessionBounds
from scrinalia import __version__
from scrinalia.db import migrate
from scrinalia.db.engine import connect_args_for, create_engine_from_url

# The refusals of ``check_schema``, where the runner's callers have always found them.
from scrinalia.db.migrate import SchemaAhead as SchemaAhead
from scrinalia.db.migrate import SchemaBehind as SchemaBehind
from scrinalia.db.migrate import SchemaMismatch as SchemaMismatch
from scrinalia.domains.archive.registry import RunnerRegistration
from scrinalia.settings import DatabaseUrl, Settings


def parent_engine(url: DatabaseUrl | str, options: RunnerOptions, settings: Settings | None = None) -> Engine:
    """The supervisor's engine. Every step is bounded, so the loop can always reach its self-fence:
    on the client (``runner.bounded``: a step that outlives ``statement_seconds``, or the fence point the
    supervisor clips it to, is abandoned; a connection is made off the loop and waited for at most
    ``connect_seconds``), and on the server (statement_timeout and lock_timeout, a share of the client's
    bound so that the server's "blocked" comes first while it answers; tcp_user_timeout).
    libpq's connect_timeout (whole seconds, at least 2) only ends the abandoned attempt's helper thread.
    No pre-ping: one heartbeat is one statement, and a failed one is retried by the loop anyway."""
    bound_ms = max(1, int(options.statement_seconds * 1000))
    server_ms = max(1, int(options.server_statement_seconds * 1000))  # fires first while the server answers
    connect_args: dict[str, Any] = {
        "connect_timeout": max(2, math.ceil(options.connect_seconds)),
        "options": f"-c statement_timeout={server_ms} -c lock_timeout={server_ms}",
        "tcp_user_timeout": bound_ms,
    }
    engine = create_engine_from_url(
        url,
        settings=settings,
        application_name="scrinalia-runner",
        pool_size=2,
        max_overflow=2,
        pool_pre_ping=False,
        pool_timeout=options.statement_seconds,
        connect_args=connect_args,
    )
    bounded.install(engine, options.statement_seconds, options.connect_seconds)
    return engine


def child_connect_args(settings: Settings | None, options: RunnerOptions | None = None) -> dict[str, Any]:
    """What a child passes to its own engine (TLS settings and its session bounds; no secret: the URL
    travels separately)."""
    args = connect_args_for(settings, "scrinalia-runner-child")
    if options is not None:
        args["options"] = ChildSessionBounds.for_lease(options.lease_seconds).options()
    return args


def check_schema(engine: Engine) -> str:
    """The database's revision when it is the bundled head. Otherwise ``SchemaBehind`` (an older revision
    of these migrations, or none: migrate first, exit 4) or ``SchemaAhead`` (a revision they do not know:
    a newer release migrated it, so this runner is the one to upgrade, exit 7), even when that schema
    declares this release compatible: the runner's statements are the ledger's protocol (decision 0392)."""
    with engine.connect() as conn:
        return migrate.require_head(conn, "runner")[0]


def registration(
    options: RunnerOptions,
    capabilities: list[str],
    *,
    kind: str,
    schema_revision: str | None,
    devices: list[dict[str, Any]] | None = None,
    sees: dict[str, Any] | None = None,
) -> RunnerRegistration:
    return RunnerRegistration(
        runner_id=uuid.uuid4(),
        name=options.name,
        hostname=socket.gethostname(),
        pid=os.getpid(),
        package_version=__version__,
        schema_revision=schema_revision,
        capabilities=list(capabilities),
        concurrency=options.concurrency,
        heartbeat_seconds=options.heartbeat_seconds,
        lease_seconds=options.lease_seconds,
        poll_seconds=options.poll_seconds if kind == "daemon" else None,
        kind=kind,
        devices=devices or [],
        sees=sees or {},
    )
