"""A PostgreSQL for benchmarks: BENCH_DATABASE_URL (a role that may CREATE DATABASE), else a private
throwaway cluster made with the installed binaries, with PostgreSQL's default durability (fsync on) and
``pg_stat_statements`` loaded; each bench database gets ``pg_stat_statements``, ``pg_walinspect`` and
``pgstattuple`` where the server has them (``server_cost`` reads the first two, ``bench_xmin`` the third)."""
from __future__ import annotations

import contextlib
import json
import os
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from scrinalia.db import migrate

BENCH_EXTENSIONS = ("pg_stat_statements", "pg_walinspect", "pgstattuple")


def create_extensions(conn, names: tuple[str, ...] = BENCH_EXTENSIONS) -> None:
    """What the cost benches read, where the server has them: statement counts, the WAL's contents, a
    table's live and dead bytes. One the server lacks (BENCH_DATABASE_URL's) is left out: its figure is."""
    for extension in names:
        try:
            conn.execute(text(f"CREATE EXTENSION IF NOT EXISTS {extension}"))
        except Exception:  # not loaded / not installed on this server
            pass


@contextlib.contextmanager
def bench_database(prefix: str = "bench", revision: str = "head") -> Iterator[str]:
    """Yield the URL of a fresh database migrated to ``revision`` (head); drop it (and any private cluster)
    after."""
    cluster = None
    admin_url = os.environ.get("BENCH_DATABASE_URL")
    if not admin_url:
        from scrinalia.db.local_cluster import LocalCluster

        cluster = LocalCluster.create(Path(tempfile.mkdtemp(prefix="scrinalia-bench-pg-")))
        cluster.start(fsync=True, max_connections=300,
                      settings={"shared_preload_libraries": "pg_stat_statements"})
        admin_url = cluster.url()
    admin = create_engine(make_url(admin_url).set(drivername="postgresql+psycopg"), isolation_level="AUTOCOMMIT")
    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        url = make_url(admin_url).set(database=name).render_as_string(hide_password=False)
        migrate.upgrade(url, revision)
        probe = create_engine(make_url(url).set(drivername="postgresql+psycopg"), isolation_level="AUTOCOMMIT")
        with probe.connect() as conn:
            create_extensions(conn)
        probe.dispose()
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


class ServerCost:
    """Statements (pg_stat_statements, this database only), WAL bytes (LSN delta) and full-page images
    (pg_walinspect) over a window. Cluster-wide WAL includes autovacuum and checkpoints: that is the cost."""

    def __init__(self, engine) -> None:
        self.engine = engine
        with engine.connect() as conn:
            self.has_statements = conn.execute(text(
                "SELECT count(*) FROM pg_extension WHERE extname = 'pg_stat_statements'")).scalar_one() == 1
            self.has_walinspect = conn.execute(text(
                "SELECT count(*) FROM pg_extension WHERE extname = 'pg_walinspect'")).scalar_one() == 1

    def start(self) -> None:
        with self.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            if self.has_statements:
                conn.execute(text("SELECT pg_stat_statements_reset()"))
            self.lsn = conn.execute(text("SELECT pg_current_wal_lsn()")).scalar_one()

    def stop(self) -> dict:
        with self.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            end = conn.execute(text("SELECT pg_current_wal_lsn()")).scalar_one()
            out: dict[str, Any] = {"wal_bytes": int(conn.execute(text("SELECT pg_wal_lsn_diff(:b, :a)"),
                                                 {"a": self.lsn, "b": end}).scalar_one())}
            # pg_walinspect reads flushed WAL only: bound the window by the flush position.
            flushed = conn.execute(text("SELECT LEAST(CAST(:b AS pg_lsn), pg_current_wal_flush_lsn()) "
                                        "> CAST(:a AS pg_lsn), LEAST(CAST(:b AS pg_lsn), pg_current_wal_flush_lsn())"),
                                   {"a": self.lsn, "b": end}).one()
            if flushed[0]:
                end = flushed[1]
            if self.has_walinspect and flushed[0]:
                fpi = conn.execute(text(
                    "SELECT count(*) FILTER (WHERE fpi_length > 0), coalesce(sum(fpi_length), 0) "
                    "FROM pg_get_wal_records_info(:a, :b)"), {"a": self.lsn, "b": end}).one()
                out["fpi_count"], out["fpi_bytes"] = int(fpi[0]), int(fpi[1])
                # Where the bytes went: resource manager and relation (this database's, else its number).
                out["wal_by_relation"] = [
                    (r.rmgr, r.rel, int(r.bytes)) for r in conn.execute(text(
                        "SELECT w.resource_manager AS rmgr, "
                        "coalesce(c.relname, w.rel, '-') AS rel, sum(w.record_length + w.fpi_length) AS bytes "
                        "FROM (SELECT resource_manager, record_length, fpi_length, "
                        "      substring(block_ref from 'rel [0-9]+/[0-9]+/([0-9]+)') AS rel "
                        "      FROM pg_get_wal_records_info(:a, :b)) AS w "
                        "LEFT JOIN pg_class c ON c.relfilenode::text = w.rel "
                        "GROUP BY 1, 2 ORDER BY 3 DESC LIMIT 10"), {"a": self.lsn, "b": end})]
            if self.has_statements:
                rows = conn.execute(text(
                    "SELECT query, calls, total_exec_time FROM pg_stat_statements "
                    "WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) "
                    "AND query !~ 'pg_stat_statements|pg_current_wal_lsn|pg_wal_lsn_diff|pg_get_wal|CHECKPOINT' "
                    "ORDER BY calls DESC")).all()
                out["statements"] = int(sum(r.calls for r in rows))
                out["exec_ms"] = round(sum(r.total_exec_time for r in rows), 3)
                out["by_statement"] = [(" ".join(r.query.split())[:90], int(r.calls)) for r in rows[:12]]
        return out


def run_peer(url: str, python: str, script: str, args: list[str], timeout: float = 1800) -> dict[str, Any]:
    """Run a peer's bench script (``bench/peer_*.py``) in its own venv (``python``: never a dependency of
    this project) against a new database ``<bench db>_peer`` of the same cluster, dropped after; its answer
    is the JSON of its last line, or ``{"error": ...}`` with the end of its stderr."""
    u = make_url(url)
    name = f"{u.database}_peer"
    admin = create_engine(u.set(drivername="postgresql+psycopg", database="postgres"), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        db = create_engine(u.set(drivername="postgresql+psycopg", database=name), isolation_level="AUTOCOMMIT")
        with db.connect() as conn:
            create_extensions(conn, ("pg_stat_statements", "pgstattuple"))
        db.dispose()
        conninfo = f"host={u.host} port={u.port} user={u.username} dbname={name}"
        done = subprocess.run([python, str(Path(__file__).with_name(script)), conninfo, *args],
                              capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            return {"peer": script, "error": done.stderr.strip().splitlines()[-3:]}
        answer: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
        return answer
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()
