"""A second, small PostgreSQL cluster for a test that needs server settings of its own (TLS, a short
autovacuum naptime), made with the same installed binaries as the session's cluster."""
from __future__ import annotations

import subprocess
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from scrinalia.db import migrate
from scrinalia.db.local_cluster import LocalCluster


@contextmanager
def private_cluster(root: Path, settings: Mapping[str, str] | None = None) -> Iterator[LocalCluster]:
    cluster = LocalCluster.create(root)
    cluster.start(fsync=False, max_connections=40, settings=settings)
    try:
        yield cluster
    finally:
        cluster.destroy()


def create_database(cluster: LocalCluster, name: str, *, migrated: bool = True) -> str:
    """CREATE DATABASE ``name`` (migrated to head unless told otherwise); its URL."""
    psql(cluster, "postgres", f'CREATE DATABASE "{name}"')
    url = cluster.url(name)
    if migrated:
        migrate.upgrade(url)
    return url


def psql(cluster: LocalCluster, database: str, sql: str) -> str:
    proc = subprocess.run(
        [str(cluster.bindir / "psql"), "-X", "-v", "ON_ERROR_STOP=1", "-At", "-h", "127.0.0.1",
         "-p", str(cluster.port), "-U", "postgres", "-d", database, "-c", sql],
        capture_output=True, text=True, timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip()
