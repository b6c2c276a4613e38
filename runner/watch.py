"""``scrinalia-runner status --watch``: a live terminal view of the runners, redrawn every second.

One local runner (its control socket, the same ``status`` message as ``scrinalia-runner status``) or,
with ``--all``, every live runner of the registry with its RUNNING runs read from the ledger. Each child
shows its worker, run, phase, progress, rate and ETA (from the progress of the last seconds, measured by
this view), RSS and GPU memory, and its lease; each runner its database state, last heartbeat and lease
margin. Drawn by ``rich`` on the terminal's alternate screen (so quitting leaves the shell as it was):
it works over SSH and in tmux. ``q`` (or Ctrl-C) quits. Decision 0168.
"""
from __future__ import annotations

import contextlib
import os
import select
import sys
import termios
import time
import tty
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console, Group
from rich.live import Live
from rich.table import Table
from rich.text import Text

from scrinalia.domains.archive.run_ids import short_id

#: Seconds of progress the rate is measured over (long enough to smooth a batch, short enough to follow).
RATE_WINDOW_S = 10.0


@dataclass(frozen=True, slots=True)
class ChildView:
    """One child (one RUNNING run) as the view shows it."""

    run_id: str
    worker: str
    pid: int | None
    phase: str
    elapsed_s: float | None
    done: float | None
    total: float | None
    unit: str
    rss_bytes: int | None
    gpu_bytes: int | None
    lease_s: float | None  # what is left of the run's lease
    cancel_requested: bool = False


@dataclass(frozen=True, slots=True)
class RunnerView:
    """One runner and its children; ``error`` when it did not answer this time."""

    name: str
    runner_id: str
    state: str
    database: str
    heartbeat_age_s: float | None
    lease_margin_s: float | None
    concurrency: int
    children: list[ChildView] = field(default_factory=list)
    detail: str = ""
    error: str | None = None


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _child_from_status(c: dict[str, Any], lease_s: float | None) -> ChildView:
    raw = c.get("progress")
    progress: dict[str, Any] = raw if isinstance(raw, dict) else {}
    return ChildView(run_id=str(c.get("run_id")), worker=str(c.get("worker")), pid=c.get("pid"),
                     phase=str(c.get("phase") or "-"), elapsed_s=_number(c.get("elapsed_seconds")),
                     done=_number(progress.get("done")), total=_number(progress.get("total")),
                     unit=str(progress.get("unit") or ""), rss_bytes=c.get("rss_bytes"),
                     gpu_bytes=c.get("gpu_memory_bytes"), lease_s=lease_s,
                     cancel_requested=bool(c.get("cancel_requested")))


def runner_from_status(status: dict[str, Any]) -> RunnerView:
    """A local runner's ``status`` answer (runner.status.STATUS_FIELDS) as a view."""
    db = status.get("database") or {}
    margin = _number(status.get("lease_margin_seconds"))
    counters = status.get("counters") or {}
    draining = f" ({status.get('drain_reason')})" if status.get("draining") else ""
    return RunnerView(
        name=str(status.get("name")), runner_id=str(status.get("runner_id")),
        state=f"{status.get('state')}{draining}",
        database=str(db.get("state")) + (f" ({db['error']})" if db.get("error") else ""),
        heartbeat_age_s=_number(db.get("last_heartbeat_age_seconds")), lease_margin_s=margin,
        concurrency=int(status.get("concurrency") or 0),
        children=[_child_from_status(c, margin) for c in status.get("children") or []],
        detail=f"pid {status.get('pid')} on {status.get('hostname')} · up {_duration(status.get('uptime_seconds'))}"
               " · " + " ".join(f"{k}={v}" for k, v in counters.items()),
    )


def local_source(paths: list[Any] | Callable[[], list[Any]],
                 query: Callable[[Any, dict[str, Any]], dict[str, Any]], *,
                 pinned: bool = True) -> Callable[[], list[RunnerView]]:
    """Ask each control socket for its status at every refresh. ``paths``: the sockets, or a function
    that lists them anew at each refresh (the shared socket folder: a runner started later appears).

    ``pinned`` (a socket the operator named): shown as "not answering" when it does not answer. Found in
    a folder: a socket that never answered in this view is a file a stopped runner left behind and is
    not shown (a folder of them would fill the screen at every redraw); one that answered before and
    stops answering is shown, since that runner has just gone away."""
    answered: set[str] = set()

    def fetch() -> list[RunnerView]:
        views = []
        for path in paths() if callable(paths) else paths:
            try:
                views.append(runner_from_status(query(path, {"command": "status"})))
                answered.add(str(path))
            except (OSError, ValueError) as exc:
                if pinned or str(path) in answered:
                    views.append(RunnerView(name=str(path), runner_id="", state="not answering",
                                            database="unknown", heartbeat_age_s=None, lease_margin_s=None,
                                            concurrency=0, error=f"{exc.__class__.__name__}: {exc}"))
        return views
    return fetch


def registry_source(engine: Any) -> Callable[[], list[RunnerView]]:
    """Every live runner of the registry, with its RUNNING runs and their leases from the ledger (the
    registry's children snapshot adds pid, phase and memory)."""
    from sqlalchemy import text

    from scrinalia.db.engine import one_statement
    from scrinalia.domains.archive import registry

    running = text(
        "SELECT run_id, runner_id, worker_name, progress, extract(epoch FROM lease_expires_at - now()) AS lease_s, "
        "       extract(epoch FROM now() - started_at) AS elapsed_s, cancel_requested_at IS NOT NULL AS cancel "
        "  FROM archive_worker_runs WHERE status = 'RUNNING' ORDER BY id")
    now = text("SELECT now()")

    def fetch() -> list[RunnerView]:
        with one_statement(engine) as conn:
            db_now = conn.execute(now).scalar_one()
            runners = [r for r in registry.list_runners(conn) if r.state != "stopped"]
            runs = conn.execute(running).all()
        views = []
        for r in runners:
            snapshot = {str(c.get("run_id")): c for c in r.children or [] if isinstance(c, dict)}
            children = []
            for run in runs:
                if run.runner_id != r.runner_id:
                    continue
                c = snapshot.get(str(run.run_id), {})
                progress = run.progress if isinstance(run.progress, dict) else {}
                children.append(ChildView(
                    run_id=str(run.run_id), worker=run.worker_name, pid=c.get("pid"), phase=str(c.get("phase") or "-"),
                    elapsed_s=_number(run.elapsed_s), done=_number(progress.get("done")),
                    total=_number(progress.get("total")), unit=str(progress.get("unit") or ""),
                    rss_bytes=c.get("rss_bytes"), gpu_bytes=c.get("gpu_memory_bytes"), lease_s=_number(run.lease_s),
                    cancel_requested=bool(run.cancel)))
            age = (db_now - r.last_heartbeat_at).total_seconds()
            views.append(RunnerView(
                name=r.name, runner_id=str(r.runner_id),
                state=r.state + (" (draining)" if r.drain_requested_at is not None else ""),
                database=f"registry: {r.state}", heartbeat_age_s=age,
                lease_margin_s=r.lease_seconds - age, concurrency=r.concurrency, children=children,
                detail=f"{r.kind} pid {r.pid} on {r.hostname} · version {r.package_version}"))
        return views
    return fetch


class RateTracker:
    """Units per second of each run over the last ``window_s`` seconds of this view's samples."""

    def __init__(self, window_s: float = RATE_WINDOW_S) -> None:
        self.window_s = window_s
        self._samples: dict[str, deque[tuple[float, float]]] = {}

    def observe(self, run_id: str, done: float | None, at: float) -> None:
        if done is None:
            return
        samples = self._samples.setdefault(run_id, deque())
        if samples and done < samples[-1][1]:  # a restarted count: start over
            samples.clear()
        samples.append((at, done))
        while len(samples) > 2 and at - samples[0][0] > self.window_s:
            samples.popleft()

    def rate(self, run_id: str) -> float | None:
        samples = self._samples.get(run_id)
        if not samples or len(samples) < 2:
            return None
        (t0, d0), (t1, d1) = samples[0], samples[-1]
        return (d1 - d0) / (t1 - t0) if t1 > t0 else None

    def forget_except(self, run_ids: set[str]) -> None:
        for run_id in list(self._samples):
            if run_id not in run_ids:
                del self._samples[run_id]


def _bytes(value: Any) -> str:
    if not isinstance(value, (int, float)):
        return "-"
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(size) < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return "-"


def _duration(seconds: Any) -> str:
    if not isinstance(seconds, (int, float)) or seconds != seconds or seconds < 0:
        return "-"
    s = int(seconds)
    if s < 60:
        return f"{seconds:.0f}s" if seconds >= 10 else f"{seconds:.1f}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


#: From this many columns the view shows the whole run id, the pid and the phase.
WIDE_COLUMNS = 140


#: The worker column's widest (a longer name ends with an ellipsis): the figures are never cut.
WORKER_MAX = 24


def _table_rows(children: list[ChildView], rates: RateTracker, *, wide: bool) -> tuple[list[str], list[list[str]]]:
    """The columns and the cells of the children's table, in the wide or the narrow layout."""
    columns = (["WORKER", "RUN"] + (["PID", "PHASE"] if wide else [])
               + ["ELAPSED", "PROGRESS", "RATE", "ETA", "RSS", "GPU", "LEASE"])
    rows = []
    for c in children:
        rate = rates.rate(c.run_id)
        eta = ((c.total - c.done) / rate if rate and rate > 0 and c.total is not None and c.done is not None
               else None)
        phase = c.phase + (", cancel" if c.cancel_requested else "")
        worker = c.worker if wide or phase == "running" else f"{c.worker} ({phase})"
        rows.append([worker, c.run_id if wide else short_id(c.run_id)]
                    + ([str(c.pid or "-"), phase] if wide else [])
                    + [_duration(c.elapsed_s), _progress(c, with_unit=wide),
                       f"{rate:.1f}/s" if rate is not None else "-", _duration(eta),
                       _bytes(c.rss_bytes), _bytes(c.gpu_bytes), _duration(c.lease_s)])
    return columns, rows


def _column_widths(columns: list[str], rows: list[list[str]], width: int) -> list[int]:
    """Every column as wide as its widest cell, but the worker's: what is left, up to ``WORKER_MAX``."""
    widths = [max([len(name), *(len(row[index]) for row in rows)]) for index, name in enumerate(columns)]
    gaps = 2 * (len(columns) - 1)  # one space of padding on each side of a column, none at the edges
    widths[0] = max(len("WORKER"), min(widths[0], WORKER_MAX, width - gaps - sum(widths[1:])))
    return widths


def _fits(columns: list[str], rows: list[list[str]], width: int) -> bool:
    return sum(_column_widths(columns, rows, width)) + 2 * (len(columns) - 1) <= width


def _children_table(children: list[ChildView], rates: RateTracker, *, width: int) -> Table:
    """One row per child within ``width`` columns: the wide layout (whole run id, pid, phase, unit) from
    ``WIDE_COLUMNS`` when it fits, else the narrow one. No figure is ever cut or wrapped; the worker's
    name takes what is left, with an ellipsis when cut."""
    columns, rows = _table_rows(children, rates, wide=True)
    if width < WIDE_COLUMNS or not _fits(columns, rows, width):
        columns, rows = _table_rows(children, rates, wide=False)
    table = Table(box=None, pad_edge=False, header_style="bold")
    for name, column_width in zip(columns, _column_widths(columns, rows, width), strict=True):
        left = name in ("WORKER", "RUN", "PHASE", "PROGRESS")
        table.add_column(name, justify="left" if left else "right", no_wrap=True, overflow="ellipsis",
                         width=column_width)
    for row in rows:
        table.add_row(*row)
    return table


def _progress(c: ChildView, *, with_unit: bool = True) -> str:
    if c.done is None:
        return "-"
    done = f"{c.done:g}"
    # "112/200 documents": the unit agrees with the number it counts (issue 28, 7)
    count = c.total if c.total else c.done
    unit = f" {c.unit}{'' if count == 1 else 's'}" if with_unit and c.unit else ""
    if c.total:
        return f"{done}/{c.total:g}{unit} ({100 * c.done / c.total:.0f}%)"
    return f"{done}{unit}"


def render(views: list[RunnerView], rates: RateTracker, *, title: str, clock: str, width: int = 200) -> Group:
    """The whole screen: one block per runner (header line, then its children's table). Under
    ``WIDE_COLUMNS`` columns (an 80-column SSH terminal) the run id is the short one and the pid and the
    phase columns are left out (a phase other than running follows the worker's name)."""
    parts: list[Any] = [_line(Text.assemble((f"scrinalia-runner status --watch · {title}", "bold"),
                                            f" · {clock} · q quits"))]
    for v in views:
        parts.append(Text(""))
        if v.error is not None:
            parts.append(_line(Text.assemble((v.name, "bold"), "  ", (f"{v.state}: {v.error}", "red"))))
            continue
        db_style = "green" if v.database.startswith(("ok", "registry: online")) else "yellow"
        # Two short lines rather than one that wraps: who and in what state, then its database and lease.
        parts.append(_line(Text.assemble(("runner ", ""), (v.name, "bold"), f"  {v.state}")))
        parts.append(_line(Text.assemble(
            "  database ", (v.database, db_style), f" · heartbeat {_duration(v.heartbeat_age_s)} ago"
            f" · lease margin {_duration(v.lease_margin_s)} · {len(v.children)}/{v.concurrency} busy")))
        if v.detail:
            parts.append(_line(Text(f"  {v.detail}", style="dim")))
        if not v.children:
            parts.append(Text("  no children", style="dim"))
            continue
        parts.append(_children_table(v.children, rates, width=width))
    if not views:
        parts.append(Text("no runner", style="dim"))
    return Group(*parts)


def _line(text: Text) -> Text:
    """A line of the view that never wraps: cut with an ellipsis at the terminal's edge (a redraw that
    wraps pushes the children's table down and off a small terminal)."""
    text.no_wrap = True
    text.overflow = "ellipsis"
    return text


@contextlib.contextmanager
def _keys() -> Iterator[Callable[[float], str]]:
    """A reader of single key presses (cbreak mode, restored on exit); without a terminal, a plain wait."""
    fd = sys.stdin.fileno() if sys.stdin is not None and sys.stdin.isatty() else None
    if fd is None:
        def wait(timeout: float) -> str:
            time.sleep(timeout)
            return ""
        yield wait
        return
    saved = termios.tcgetattr(fd)
    tty.setcbreak(fd)
    try:
        def read(timeout: float) -> str:
            ready, _, _ = select.select([fd], [], [], max(0.0, timeout))
            return os.read(fd, 32).decode(errors="replace") if ready else ""
        yield read
    finally:
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def watch(fetch: Callable[[], list[RunnerView]], *, title: str, interval: float = 1.0,
          console: Console | None = None) -> None:
    """Redraw every ``interval`` seconds until ``q`` (or Ctrl-C)."""
    console = console or Console()
    rates = RateTracker()
    with _keys() as read, Live(console=console, screen=True, auto_refresh=False, transient=True) as live:
        with contextlib.suppress(KeyboardInterrupt):
            _loop(fetch, live, read, rates, title, interval)


def _loop(fetch: Callable[[], list[RunnerView]], live: Live, read: Callable[[float], str], rates: RateTracker,
          title: str, interval: float) -> None:
    while True:
        now = time.monotonic()
        views = fetch()
        seen = set()
        for v in views:
            for c in v.children:
                rates.observe(c.run_id, c.done, now)
                seen.add(c.run_id)
        rates.forget_except(seen)
        live.update(render(views, rates, title=title, clock=time.strftime("%H:%M:%S"), width=live.console.width),
                    refresh=True)
        deadline = now + interval
        while (left := deadline - time.monotonic()) > 0:
            if "q" in read(left).lower():
                return
