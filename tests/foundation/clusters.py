"""A second, small PostgreSQL cluster for a test that needs server settings of its own (TLS, a short
autovacuum naptime), made with the same installed binaries as the session's cluster."""
from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from scrinalia.db import migrate
from scrinalia.db.local_cluster import LocalCluster


@contextmanager
def private_cluster(
    settings: Mapping[str, str] | None = None,
    before_start: Callable[[Path], Mapping[str, str]] | None = None,
) -> Iterator[LocalCluster]:
    """A started cluster under a new directory outside pytest's basetemp (a pytest session of its
    own resets that to 0700, which would lock the postgres user out). ``before_start(root)`` may
    write files there (certificates) and return more settings."""
    root = Path(tempfile.mkdtemp(prefix="scrinalia-pgx-"))
    cluster = LocalCluster.create(root / "cluster")
    try:
        extra = dict(settings or {})
        if before_start is not None:
            extra.update(before_start(root))
        cluster.start(fsync=False, max_connections=40, settings=extra)
        yield cluster
    finally:
        cluster.destroy()
        shutil.rmtree(root, ignore_errors=True)


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
