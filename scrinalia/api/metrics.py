"""/metrics with prometheus_client: a collector that reads the database at every scrape.

Every figure but one comes from the database (decision 0035), so whichever of the API's processes
answers a scrape, the answer is the same: the collector runs its reads on one connection when the
registry is collected, and keeps nothing between scrapes. The finished-run counters and the duration
histogram are kept by the database itself: ``archive_run_totals`` (migration 0016, decision 0166) holds
the runs ended before a watermark, and each scrape first folds the runs ended since (up to a safe horizon,
bounded) into it, then reads the totals plus the runs of the last minutes (``archive_run_totals_now()``,
migration 0018, decision 0370): a scrape reads a few dozen rows and the recent runs whatever the history,
and a finish writes nothing for it.

The exception is ``scrinalia_events_dropped_total``: the events the panel's relay of THIS process
dropped (a client too slow for its queue). It is process-local by nature; Prometheus sums it over the
processes' scrapes only if each is scraped on its own, so read it as "some process drops events".

The names of the gauges written by hand before (``scrinalia_worker_runs_active``,
``scrinalia_worker_queued_age_seconds``, ``scrinalia_worker_failures_24h``, ``scrinalia_worker_units``,
``scrinalia_runners``, ``scrinalia_runner_running_runs``, ``scrinalia_build_info``) and their labels are
kept, so no scrape configuration or dashboard breaks. Decision 0167.
"""
from __future__ import annotations

import logging
import math
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from prometheus_client import CollectorRegistry, Counter, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString
from sqlalchemy import Connection, Engine, text

from scrinalia import __version__
from scrinalia.api import catalogue_view
from scrinalia.db import migrate, xmin_horizon
from scrinalia.db.engine import one_statement
from scrinalia.db.errors import database_errors
from scrinalia.domains.archive import registry
from scrinalia.domains.archive.ledger_events import DROP_REASONS
from scrinalia.domains.archive.workers.sdk import WorkerSpec
from scrinalia.scheduler.schedules import list_schedules

log = logging.getLogger("scrinalia.api.metrics")

#: The notifications the panel's relay dropped in this process, by why (process-local: see the module's
#: doc). Registered in each scrape's registry (``build_registry``), not in the library's global one.
EVENTS_DROPPED = Counter(
    "scrinalia_events_dropped_total",
    "Notifications on the ledger's channel that the live relay dropped, by reason (not JSON within the "
    "bounds, not the shape the ledger's triggers send: anyone with a database login may NOTIFY)",
    ["reason"],
    registry=None,
)


for _reason in DROP_REASONS:  # each reason at 0 from the first scrape, not "No data" until a drop
    EVENTS_DROPPED.labels(reason=_reason)

#: The statuses a run ends in: each worker's finished-run counter has one series of each from the start.
FINAL_STATUSES = ("SUCCESS", "FAILED", "INTERRUPTED", "CANCELLED")


def event_dropped(reason: str) -> None:
    """The relay's ``on_drop``: one more dropped notification of ``reason``."""
    EVENTS_DROPPED.labels(reason=reason).inc()


#: The channel of the notification probe: its own, so no runner or relay wakes for it.
PROBE_CHANNEL = "scrinalia_metrics_probe"
#: How long a scrape waits for its probe notification before it reports the probe as lost.
PROBE_TIMEOUT_S = 1.0

_ACTIVE = text(
    "SELECT worker_name, status::text AS status, count(*) AS n, "
    "max(extract(epoch FROM now() - queued_at)) FILTER (WHERE status = 'QUEUED') AS oldest, "
    "max(extract(epoch FROM now() - GREATEST(queued_at, not_before))) "
    "    FILTER (WHERE status = 'QUEUED' AND (not_before IS NULL OR not_before <= now())) AS claimable "
    "FROM archive_worker_runs WHERE status IN ('QUEUED', 'RUNNING') GROUP BY worker_name, status"
)
_FAILURES_24H = text(
    "SELECT worker_name, count(*) AS n FROM archive_worker_runs "
    "WHERE error_fingerprint IS NOT NULL AND finished_at >= now() - interval '24 hours' GROUP BY worker_name"
)
# Every RUNNING run's lease margin (the runner's part of it): what is left of its lease now.
_LEASES = text(
    "SELECT worker_name, runner_id, extract(epoch FROM lease_expires_at - now()) AS margin "
    "FROM archive_worker_runs WHERE status = 'RUNNING' AND runner_id IS NOT NULL"
)
_NOW = text("SELECT now()")
_RUNNING_PER_RUNNER = text(
    "SELECT runner_id, count(*) AS n FROM archive_worker_runs WHERE status = 'RUNNING' AND runner_id IS NOT NULL "
    "GROUP BY runner_id"
)
_FOLD = text("SELECT archive_run_totals_fold()")
_TOTALS = text(
    "SELECT worker_name, status::text AS status, runs, timed, duration_seconds_sum, duration_buckets, "
    "       archive_run_duration_bounds() AS bounds FROM archive_run_totals_now() ORDER BY worker_name, status"
)

_BOUNDS = text("SELECT archive_run_duration_bounds()")
_QUEUE_USAGE = text("SELECT pg_notification_queue_usage()")
_NOTIFY = text("SELECT pg_notify(:channel, :payload)")


@dataclass(frozen=True, slots=True)
class Probe:
    """One NOTIFY sent and awaited through the database: seconds, or None when it did not arrive."""

    seconds: float | None


def probe_notification(engine: Engine, timeout_s: float = PROBE_TIMEOUT_S) -> Probe:
    """Send a NOTIFY on a pooled connection and wait for it (bounded by ``timeout_s``) on a connection of
    its own that LISTENs, detached from the pool and closed after: its subscription ends with its session,
    so nothing that listens goes back into the pool.

    The path is the one every notification of the ledger takes (the server's notification queue, then
    the listener's socket), so a database that is slow to deliver notifications shows here. Behind a
    transaction pooler the API needs DATABASE_SESSION_URL for its relay's LISTEN anyway; the probe's
    LISTEN then goes through the pooler and is reported lost (``scrinalia_notification_probe_ok`` 0)."""
    token = secrets.token_hex(8)
    pooled = engine.raw_connection()
    driver = pooled.driver_connection
    assert driver is not None, "a checked-out connection has a driver connection"
    pooled.detach()
    try:
        driver.autocommit = True
        driver.execute(f"LISTEN {PROBE_CHANNEL}")
        started = time.monotonic()
        with one_statement(engine) as notify_conn:
            notify_conn.execute(_NOTIFY, {"channel": PROBE_CHANNEL, "payload": token})
        deadline = started + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            for note in driver.notifies(timeout=left, stop_after=1):
                if note.payload == token:
                    return Probe(time.monotonic() - started)
        return Probe(None)
    finally:
        driver.close()


class LedgerCollector(Collector):
    """The ledger, the registry, the schedules and the unit counts as metrics, read at each collect."""

    def __init__(self, engine: Engine, catalogue: dict[str, WorkerSpec],
                 counts_cache: catalogue_view.CountsCache | None = None, *, probe: bool = True) -> None:
        self.engine = engine
        self.catalogue = catalogue
        self.counts_cache = counts_cache
        self.probe = probe

    def describe(self) -> list[Metric]:
        """Nothing: registering the collector must not read the database (prometheus_client would
        otherwise collect once to learn the names)."""
        return []

    def collect(self) -> Iterator[Metric]:
        with one_statement(self.engine) as conn:
            yield from _build_info()
            yield from _run_metrics(conn, self.catalogue)
            yield from _runner_metrics(conn)
            yield from _totals(conn, self.catalogue)
            yield from _schedule_metrics(conn)
            yield from _xmin_metrics(conn)
            yield from self._units(conn)
            usage = conn.execute(_QUEUE_USAGE).scalar_one()
        queue = GaugeMetricFamily("scrinalia_notification_queue_usage_ratio",
                                  "Fraction of the database's notification queue held by notifications some "
                                  "listener has not read yet (at 1 every NOTIFY fails).")
        queue.add_metric([], float(usage))
        yield queue
        if self.probe:
            yield from _probe_metrics(self.engine)

    def _units(self, conn: Connection) -> Iterator[Metric]:
        counts = (self.counts_cache.get(self.engine, self.catalogue, conn=conn)[0] if self.counts_cache is not None
                  else catalogue_view.unit_counts(self.engine, self.catalogue, conn=conn))
        units = GaugeMetricFamily("scrinalia_worker_units", "Units per worker: pending, processed, failed.",
                                  labels=["worker", "kind"])
        for name, c in counts.items():
            for kind in ("pending", "processed", "failed"):
                value = c.get(kind)
                if value is not None:
                    units.add_metric([name, kind], float(value))
        yield units


def _build_info() -> Iterator[Metric]:
    build = GaugeMetricFamily("scrinalia_build_info", "The API's package version and the schema head it was "
                              "built for.", labels=["version", "schema_head"])
    build.add_metric([__version__, migrate.head_revision() or ""], 1)
    yield build


def _run_metrics(conn: Connection, catalogue: dict[str, WorkerSpec]) -> Iterator[Metric]:
    active = list(conn.execute(_ACTIVE).all())
    by = {(r.worker_name, r.status): r for r in active}
    names = sorted(set(catalogue) | {w for w, _ in by})
    runs = GaugeMetricFamily("scrinalia_worker_runs_active", "Active runs (QUEUED or RUNNING) per worker.",
                             labels=["worker", "status"])
    age = GaugeMetricFamily("scrinalia_worker_queued_age_seconds", "Age of the QUEUED run per worker (a retry "
                            "backing off included).", labels=["worker"])
    wait = GaugeMetricFamily("scrinalia_worker_queued_wait_seconds", "How long the QUEUED run of a worker has been "
                             "claimable without being claimed (since queued, or since its retry backoff ended).",
                             labels=["worker"])
    for name in names:
        for status in ("QUEUED", "RUNNING"):
            row = by.get((name, status))
            runs.add_metric([name, status], row.n if row is not None else 0)
        queued = by.get((name, "QUEUED"))
        if queued is not None and queued.oldest is not None:
            age.add_metric([name], float(queued.oldest))
        if queued is not None and queued.claimable is not None:
            wait.add_metric([name], max(0.0, float(queued.claimable)))
    failures = GaugeMetricFamily("scrinalia_worker_failures_24h", "Runs that ended with an error in the last 24 "
                                 "hours.", labels=["worker"])
    failed = {name: 0 for name in names}  # 0 for each worker of the catalogue, from the first scrape
    failed.update({row.worker_name: row.n for row in conn.execute(_FAILURES_24H).all()})
    for name, n in failed.items():
        failures.add_metric([name], n)
    margin = GaugeMetricFamily("scrinalia_run_lease_margin_seconds", "What is left of each RUNNING run's lease now "
                               "(the runner renews it every heartbeat; near 0 the runner is about to lose it).",
                               labels=["worker", "runner_id"])
    for row in conn.execute(_LEASES).all():
        margin.add_metric([row.worker_name, str(row.runner_id)], float(row.margin))
    yield from (runs, age, wait, failures, margin)


def _runner_metrics(conn: Connection) -> Iterator[Metric]:
    """The registry (its one rule of online / stale / stopped) against the database's clock."""
    db_now: datetime = conn.execute(_NOW).scalar_one()
    runners = registry.list_runners(conn)
    by_state = GaugeMetricFamily("scrinalia_runners", "Runners in the registry by state.", labels=["state"])
    for state in ("online", "stale", "stopped"):
        by_state.add_metric([state], sum(1 for r in runners if r.state == state))
    running_of = {r.runner_id: int(r.n) for r in conn.execute(_RUNNING_PER_RUNNER).all()}
    labels = ["runner", "runner_id"]
    running = GaugeMetricFamily("scrinalia_runner_running_runs", "Runs each live runner holds.", labels=labels)
    up = GaugeMetricFamily("scrinalia_runner_up", "1 while a registered runner heartbeats within its lease, 0 "
                           "when it has gone silent without stopping.", labels=labels)
    age = GaugeMetricFamily("scrinalia_runner_heartbeat_age_seconds", "Seconds since each live runner's last "
                            "heartbeat, by the database's clock.", labels=labels)
    lease = GaugeMetricFamily("scrinalia_runner_lease_seconds", "Each live runner's lease.", labels=labels)
    heartbeat = GaugeMetricFamily("scrinalia_runner_heartbeat_interval_seconds", "Each live runner's heartbeat "
                                  "interval.", labels=labels)
    draining = GaugeMetricFamily("scrinalia_runner_draining", "1 while a drain is requested of the runner.",
                                 labels=labels)
    # The fork server's warm models (decision 0340), as the runner's heartbeat last wrote them (0381).
    warm_total = GaugeMetricFamily("scrinalia_runner_warm_models_bytes", "Bytes of the models each live runner's "
                                   "fork server keeps warm (0: none).", labels=labels)
    warm_limit = GaugeMetricFamily("scrinalia_runner_warm_models_limit_bytes", "The bound on what each live "
                                   "runner's fork server keeps warm (--warm-limit-mb; 0: nothing is kept warm).",
                                   labels=labels)
    warm_model = GaugeMetricFamily("scrinalia_runner_warm_model_bytes", "Bytes of each model a live runner's fork "
                                   "server keeps warm (its parameters and buffers, shared copy-on-write by the "
                                   "children).", labels=[*labels, "model_class", "model_dir", "dtype"])
    for r in runners:
        if r.state == "stopped":
            continue
        values = [r.name, str(r.runner_id)]
        running.add_metric(values, running_of.get(r.runner_id, 0))
        up.add_metric(values, 1 if r.state == "online" else 0)
        age.add_metric(values, max(0.0, (db_now - r.last_heartbeat_at).total_seconds()))
        lease.add_metric(values, float(r.lease_seconds))
        heartbeat.add_metric(values, float(r.heartbeat_seconds))
        draining.add_metric(values, 1 if r.drain_requested_at is not None else 0)
        warm = r.warm if isinstance(r.warm, dict) else {}
        warm_total.add_metric(values, float(warm.get("bytes") or 0))
        warm_limit.add_metric(values, float(warm.get("limit_bytes") or 0))
        for model in warm.get("models") or []:
            if isinstance(model, dict):
                warm_model.add_metric([*values, str(model.get("model_class") or ""), str(model.get("model_dir") or ""),
                                       str(model.get("dtype") or "")], float(model.get("bytes") or 0))
    yield from (by_state, running, up, age, lease, heartbeat, draining, warm_total, warm_limit, warm_model)


def _totals(conn: Connection, catalogue: dict[str, WorkerSpec]) -> Iterator[Metric]:
    """The finished-run counters and the duration histograms; every catalogue worker has a series of each
    final status and an (empty) histogram from the first scrape, at 0 until a run of it ends."""
    finished = CounterMetricFamily("scrinalia_runs_finished", "Runs that ended, by worker and final status.",
                                   labels=["worker", "status"])
    runs: dict[tuple[str, str], float] = {(w, s): 0 for w in catalogue for s in FINAL_STATUSES}
    bounds = list(conn.execute(_BOUNDS).scalar_one())
    try:  # its own transaction (autocommit): the runs ended before its horizon, bounded
        conn.execute(_FOLD)
    except database_errors() as exc:  # a read-only session, a timeout: the read below is exact all the same
        log.warning("metrics: the run totals' fold failed (%s); counted from the watermark", type(exc).__name__)
    per_worker: dict[str, dict[str, Any]] = {
        w: {"count": 0, "sum": 0.0, "buckets": [0] * len(bounds), "bounds": bounds} for w in catalogue}
    for row in conn.execute(_TOTALS).all():
        runs[(row.worker_name, row.status)] = row.runs
        acc = per_worker.setdefault(row.worker_name, {"count": 0, "sum": 0.0, "buckets": None,
                                                      "bounds": list(row.bounds)})
        acc["count"] += row.timed
        acc["sum"] += row.duration_seconds_sum
        acc["buckets"] = (list(row.duration_buckets) if acc["buckets"] is None
                          else [a + b for a, b in zip(acc["buckets"], row.duration_buckets, strict=True)])
    for (worker, status), n in sorted(runs.items()):
        finished.add_metric([worker, status], n)
    durations = HistogramMetricFamily("scrinalia_run_duration_seconds", "Durations of the runs that ended after "
                                      "starting, by worker.", labels=["worker"])
    for worker, acc in per_worker.items():
        buckets = [(floatToGoString(b), float(n)) for b, n in zip(acc["bounds"], acc["buckets"], strict=True)]
        buckets.append(("+Inf", float(acc["count"])))
        durations.add_metric([worker], buckets, sum_value=acc["sum"])
    yield from (finished, durations)


def _schedule_metrics(conn: Connection) -> Iterator[Metric]:
    quarantined = GaugeMetricFamily("scrinalia_schedule_quarantined", "1 while the scheduler keeps a schedule "
                                    "quarantined for a crash loop, 0 otherwise.", labels=["worker", "schedule_id"])
    enabled = GaugeMetricFamily("scrinalia_schedule_enabled", "1 while a schedule is enabled.",
                                labels=["worker", "schedule_id"])
    for s in list_schedules(conn):
        quarantined.add_metric([s.worker_name, str(s.id)], 1 if s.quarantined else 0)
        enabled.add_metric([s.worker_name, str(s.id)], 1 if s.enabled else 0)
    yield from (quarantined, enabled)


def _xmin_metrics(conn: Connection) -> Iterator[Metric]:
    """The oldest holder of the xmin horizon (decision 0371): 0 when none, from the first scrape."""
    holder = xmin_horizon.oldest_xmin(conn)
    seconds = GaugeMetricFamily("scrinalia_oldest_xmin_age_seconds", "Seconds since the oldest holder of the "
                                "database's xmin horizon began (a session's transaction, a prepared transaction; "
                                "0: none, or a replication slot, see the _transactions gauge): while it holds, "
                                "VACUUM keeps every dead row version and the ledger's hot tables grow.")
    seconds.add_metric([], float(holder.age_seconds or 0.0) if holder is not None else 0.0)
    xids = GaugeMetricFamily("scrinalia_oldest_xmin_age_transactions", "Transactions since the oldest xmin any "
                             "session, prepared transaction or replication slot holds (0: none).")
    xids.add_metric([], float(holder.age_xids) if holder is not None else 0.0)
    yield from (seconds, xids)


def _probe_metrics(engine: Engine) -> Iterator[Metric]:
    try:
        probe = probe_notification(engine)
    except Exception as exc:  # the class only: a driver message may name the host
        log.warning("metrics: the notification probe failed (%s)", type(exc).__name__)
        probe = Probe(None)
    arrived = GaugeMetricFamily("scrinalia_notification_probe_ok", "1 when this scrape's probe NOTIFY arrived "
                                f"within {PROBE_TIMEOUT_S:g} s, 0 when it did not.")
    arrived.add_metric([], 1 if probe.seconds is not None else 0)
    lag = GaugeMetricFamily("scrinalia_notification_lag_seconds", "Seconds from a NOTIFY to its arrival on a "
                            "listening connection of this API process, measured at the scrape (NaN: it did not "
                            "arrive in time; see scrinalia_notification_probe_ok).")
    lag.add_metric([], probe.seconds if probe.seconds is not None else math.nan)
    yield from (arrived, lag)


def build_registry(engine: Engine, catalogue: dict[str, WorkerSpec],
                   counts_cache: catalogue_view.CountsCache | None = None) -> CollectorRegistry:
    """The registry /metrics exposes: the database collector and this process's relay counter."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(LedgerCollector(engine, catalogue, counts_cache))
    registry.register(EVENTS_DROPPED)
    return registry


def exposition(registry: CollectorRegistry) -> bytes:
    """The text exposition format (0.0.4) of ``registry``, collected now."""
    return generate_latest(registry)
