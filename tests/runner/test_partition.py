"""A silent partition between a runner and its database (issue 9): packets dropped on the database's
port (nftables), or a proxy that accepts bytes and never answers. Every child is dead before its true
lease end, measured against the database's ``lease_expires_at`` (not the runner's log); the loop keeps
answering ``status`` meanwhile; when the network heals the runner claims again within seconds and no
run stays RUNNING. With short timings (1/4) and with the defaults (15/60: over a minute, slow)."""
from __future__ import annotations

import functools
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

import pytest
from sqlalchemy import Engine, text

from runner.options import RunnerOptions
from scrinalia.domains.archive import ledger
from scrinalia.domains.archive.ledger import WorkerRun
from tests.runner import netfault
from tests.runner.conftest import enqueue, wait_for

pytestmark = pytest.mark.slow

SHORT = ("--heartbeat", "1", "--lease", "4")
DEFAULTS: tuple[str, ...] = ()


def _status_of(observer: Engine, run_id: uuid.UUID) -> str | None:
    row = ledger.get_run(observer, run_id)
    return row.status if row else None


def _is_closed(observer: Engine, run_id: uuid.UUID) -> bool:
    return _status_of(observer, run_id) == "INTERRUPTED"


def _running(observer: Engine) -> int:
    with observer.connect() as conn:
        return conn.execute(text("SELECT count(*) FROM archive_worker_runs WHERE status = 'RUNNING'")).scalar_one()


@contextmanager
def _fault(kind: str, port: int, proxy: netfault.SilentProxy | None) -> Iterator[None]:
    if kind == "nft":
        with netfault.drop_port(port):
            yield
    else:
        assert proxy is not None
        proxy.silence()
        try:
            yield
        finally:
            proxy.heal()


def _partition(kind: str, timings: tuple[str, ...], lease: float, start_runner, runner_env, engine, admin_engine,
               database_url: str) -> dict[str, float]:
    heartbeat = 15.0 if not timings else float(timings[1])
    bound = RunnerOptions(name="x", heartbeat_seconds=heartbeat, lease_seconds=lease).validate().statement_seconds
    port = netfault.cluster_port(database_url)
    if kind == "nft":
        netfault.require_nft()
    with ExitStack() as stack:
        env = dict(runner_env)
        proxy = None
        if kind == "proxy":
            proxy = netfault.SilentProxy("127.0.0.1", port)
            stack.callback(proxy.close)
            env["DATABASE_URL"] = netfault.through_proxy(database_url, proxy)
        observer = netfault.observer_engine(admin_engine, database_url) if kind == "nft" else engine
        stack.callback(observer.dispose)
        clock = netfault.DeathClock()
        stack.callback(clock.close)

        runner = start_runner(*timings, "--poll", "0.2", "--concurrency", "2", env=env)
        runs = [enqueue(engine, w, units=1_000_000, pause=0.1) for w in ("slow", "slow-b")]
        pids = {r.run_id: runner.child_for(r.run_id, timeout=60)["pid"] for r in runs}
        for pid in pids.values():
            clock.watch(pid)
        time.sleep(1.5)  # a heartbeat or more
        with _fault(kind, port, proxy):
            started = time.time()
            answered, unanswered = 0, []
            deadline = time.monotonic() + lease + 20
            while len(clock.died) < len(pids):
                assert time.monotonic() < deadline, f"children still alive {lease + 20}s into the partition"
                try:
                    runner.status(timeout=bound + 1.5)  # the loop is held by no step longer than its bound
                    answered += 1
                except (OSError, ValueError) as exc:
                    unanswered.append(f"{time.time() - started:.1f}s: {exc!r}")
                time.sleep(0.1)
            fenced_after = max(clock.died.values()) - started
            # The true lease ends: what the database holds (nothing could renew it since).
            for run_id, pid in pids.items():
                row = ledger.get_run(observer, run_id)
                assert row.status == "RUNNING"
                assert clock.died[pid] < row.lease_expires_at.timestamp(), (
                    f"child {pid} died {clock.died[pid] - row.lease_expires_at.timestamp():.3f}s after its lease end")
            assert answered > 0 and not unanswered, f"status unanswered during the partition: {unanswered}"
            queued = enqueue(observer, "ok")
            time.sleep(0.5)
        healed = time.time()
        def first_claim() -> WorkerRun | None:
            row = ledger.get_run(observer, queued.run_id)
            return row if row is not None and row.started_at is not None else None

        claimed = wait_for(first_claim, timeout=30, interval=0.05, what="the first claim after the partition healed")
        claim_after = claimed.started_at.timestamp() - healed
        assert claim_after < 10, f"first claim {claim_after:.1f}s after the partition healed"
        wait_for(lambda: _status_of(observer, queued.run_id) == "SUCCESS", 30, what="the new run to succeed")
        for run_id in pids:
            wait_for(functools.partial(_is_closed, observer, run_id), lease + 30, what=f"run {run_id} to be closed")
        assert _running(observer) == 0
        assert "self-fence" in runner.log()
        return {"fenced_after": fenced_after, "claim_after": claim_after}


@pytest.mark.parametrize("kind", ["nft", "proxy"])
def test_a_silent_partition_with_short_timings(kind, start_runner, runner_env, engine, admin_engine, database_url):
    _partition(kind, SHORT, 4.0, start_runner, runner_env, engine, admin_engine, database_url)


@pytest.mark.parametrize("kind", ["nft", "proxy"])
def test_a_silent_partition_with_the_default_timings(kind, start_runner, runner_env, engine, admin_engine,
                                                      database_url):
    _partition(kind, DEFAULTS, 60.0, start_runner, runner_env, engine, admin_engine, database_url)
