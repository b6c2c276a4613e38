"""A primary and a streaming standby (pg_basebackup -R) made with the installed binaries, for the
failover tests: the primary is stopped for real (``pg_ctl stop -m immediate``) and the standby promoted
(``pg_ctl promote``), as Patroni or a managed service does it.

Replication is synchronous (``synchronous_standby_names = '*'``, ``synchronous_commit = remote_write``):
a commit the runner was told about is on the standby too, so a failover loses nothing that was
acknowledged, the guarantee an operator's HA setup gives (an asynchronous one may lose the last commits,
whatever the client does)."""
from __future__ import annotations

import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from scrinalia.db.local_cluster import SERVER_USER, LocalCluster, find_bindir, free_port
from tests.foundation.clusters import psql

SYNC = {"synchronous_commit": "remote_write", "wal_level": "replica", "max_wal_senders": "4", "hot_standby": "on"}


@dataclass
class Pair:
    primary: LocalCluster
    standby: LocalCluster

    def url(self, database: str) -> str:
        """libpq's multi-host URL, as a Patroni or managed-PostgreSQL guide prints it."""
        return (f"postgresql://{SERVER_USER}@127.0.0.1:{self.primary.port},127.0.0.1:{self.standby.port}/{database}"
                "?target_session_attrs=read-write")

    def fail_over(self) -> float:
        """Stop the primary at once (no shutdown checkpoint, connections cut), promote the standby;
        the CLOCK_MONOTONIC moment the standby accepts writes."""
        self.primary.stop("immediate")
        proc = subprocess.run(self.standby._as_server_user(
            [str(self.standby.bindir / "pg_ctl"), "-D", str(self.standby.data_dir), "-w", "-t", "60", "promote"]),
            capture_output=True, text=True, timeout=90)
        assert proc.returncode == 0, proc.stderr
        return time.monotonic()


@contextmanager
def primary_and_standby() -> Iterator[Pair]:
    root = Path(tempfile.mkdtemp(prefix="scrinalia-pgha-"))
    primary = LocalCluster.create(root / "primary")
    standby = LocalCluster(root / "standby" / "pgdata", free_port(), find_bindir())
    try:
        primary.start(fsync=False, max_connections=60, settings=SYNC)
        (root / "standby").mkdir()
        primary._chown(root / "standby")
        proc = subprocess.run(primary._as_server_user([
            str(primary.bindir / "pg_basebackup"), "-h", "127.0.0.1", "-p", str(primary.port), "-U", SERVER_USER,
            "-D", str(standby.data_dir), "-R", "-X", "stream", "--no-sync"]),
            capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        standby.start(fsync=False, max_connections=60, settings=SYNC)
        psql(primary, "postgres", "ALTER SYSTEM SET synchronous_standby_names = '*'")
        psql(primary, "postgres", "SELECT pg_reload_conf()")
        deadline = time.monotonic() + 30
        while psql(primary, "postgres", "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'") != "1":
            assert time.monotonic() < deadline, "the standby did not become synchronous"
            time.sleep(0.1)
        yield Pair(primary, standby)
    finally:
        standby.destroy()
        primary.destroy()
        shutil.rmtree(root, ignore_errors=True)
