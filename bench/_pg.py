"""A PostgreSQL for benchmarks: BENCH_DATABASE_URL (a role that may CREATE DATABASE), else a private
throwaway cluster made with the installed binaries, with PostgreSQL's default durability (fsync on)."""
from __future__ import annotations

import contextlib
import os
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from scrinalia.db import migrate


@contextlib.contextmanager
def bench_database(prefix: str = "bench") -> Iterator[str]:
    """Yield the URL of a fresh database migrated to head; drop it (and any private cluster) after."""
    cluster = None
    admin_url = os.environ.get("BENCH_DATABASE_URL")
    if not admin_url:
        from scrinalia.db.local_cluster import LocalCluster

        cluster = LocalCluster.create(Path(tempfile.mkdtemp(prefix="scrinalia-bench-pg-")))
        cluster.start(fsync=True, max_connections=300)
        admin_url = cluster.url()
    admin = create_engine(make_url(admin_url).set(drivername="postgresql+psycopg"), isolation_level="AUTOCOMMIT")
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        url = make_url(admin_url).set(database=name).render_as_string(hide_password=False)
        migrate.upgrade(url)
        yield url
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
        if cluster is not None:
            cluster.destroy()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]
