"""Workers for the topology tests, registered beside the runner's test workers
(``SCRINALIA_WORKER_PLUGINS=tests.runner.workers:ALL,tests.topology.workers:ALL``)."""
from __future__ import annotations

import time
from typing import Any

from scrinalia.domains.archive.workers.sdk import RunContext
from tests.runner.workers import _opt, _spec


def run_outlives_its_bound(ctx: RunContext) -> dict[str, Any]:
    """One statement (``pg_sleep(seconds)``) longer than the child's statement_timeout (lease / 2): the
    server must cancel it, through a transaction pooler too. Reports the SQLSTATE and when it ended."""
    from sqlalchemy import text
    from sqlalchemy.exc import DBAPIError

    seconds = float(_opt(ctx, "seconds", 30.0))
    started = time.monotonic()
    try:
        with ctx.engine.connect() as conn:
            conn.execute(text("SELECT pg_sleep(:s)"), {"s": seconds})
    except DBAPIError as exc:
        return {"sqlstate": getattr(exc.orig, "sqlstate", None), "after": round(time.monotonic() - started, 2)}
    return {"sqlstate": None, "after": round(time.monotonic() - started, 2)}


ALL = [_spec("outlives-its-bound", run_outlives_its_bound)]
