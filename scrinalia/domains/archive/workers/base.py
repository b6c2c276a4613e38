"""The loop every document worker shares: pending batches (keyset-paged), per-unit errors, the fenced
commit of a batch's stamps and results, tallies."""
from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from sqlalchemy import Connection

from scrinalia.domains.archive.workers.cuda import is_sticky_cuda_error
from scrinalia.domains.archive.workers.sdk import RunContext, retry_database
from scrinalia.domains.archive.workers.stamps import ERROR, StampQueue, error_text

#: (document id, stamp fetched with it, DONE | ERROR, error message or None): ``StampQueue.write_stamps``.
Stamp = tuple[int, str | None, str, str | None]

T = TypeVar("T")
R = TypeVar("R")


def pending_batches(ctx: RunContext, queue: StampQueue, columns: str,
                    params: dict[str, Any] | None = None) -> Iterator[list[Any]]:
    """Batches of pending documents, by the queue's own condition, through ``ctx.batches``.

    Paged by id (``id > last``), so a document that stays pending (edited since its fetch, or skipped
    because it became HUMAN_APPROVED) is not fetched again in the same run: every run terminates.
    The run's total is the pending count at the start (the same condition).
    """
    sql = queue.fetch_sql(columns)
    state = {"after": 0}

    def fetch(conn: Connection, size: int) -> list[Any]:
        queue.prepare(conn, fetch=True)
        rows = list(conn.execute(sql, {"after": state["after"], "limit": size, **(params or {})}).all())
        if rows:
            state["after"] = rows[-1].id
        return rows

    ctx.total = retry_database("the pending count", lambda: queue.pending_count(ctx.engine), ctx.lease_seconds)
    ctx.result.setdefault("pending_at_start", ctx.total)
    ctx.report_progress(0, ctx.total)
    yield from ctx.batches(fetch)


def commit_batch(ctx: RunContext, queue: StampQueue, units: int, stamps: Sequence[Stamp],
                 write: Callable[[Connection, set[int]], dict[str, int]], **counters: int) -> None:
    """Commit one batch in one fenced transaction (``ctx.commit``), then tally it.

    The stamps are written first; ``write(conn, stamped)`` then writes the batch's results for the ids
    actually stamped (a governed queue skips a document that became HUMAN_APPROVED since the fetch) and
    returns its counters. The tally adds those, ``counters`` and ``errors`` (the ERROR stamps).
    """
    written = ctx.commit(lambda conn: write(conn, queue.write_stamps(conn, ctx.run_id, stamps)))
    ctx.tally(units, **written, **counters, errors=sum(1 for s in stamps if s[2] == ERROR))


def columns(rows: Sequence[Sequence[Any]], width: int) -> list[list[Any]]:
    """The columns of ``rows`` (each of ``width`` values): the arrays an ``unnest`` statement takes."""
    return [[row[i] for row in rows] for i in range(width)]


class SystematicFailure(RuntimeError):
    """Every unit of a batch failed on its own: the engine is broken, not the documents. Fail the run
    rather than stamp the whole archive ERROR."""


def per_unit(items: Sequence[T], batch_fn: Callable[[list[T]], list[R]]) -> list[tuple[R | None, str | None]]:
    """Run ``batch_fn`` on the batch; if it raises, retry unit by unit so one bad unit is stamped ERROR
    and the others DONE. Raises ``SystematicFailure`` when every unit of a multi-unit batch fails.

    A sticky CUDA error (a device-side assert, an illegal memory access: the process's CUDA context is
    lost) is raised as it is: it is the process's failure, never a document's, and the runner names it."""
    try:
        results = batch_fn(list(items))
        if len(results) != len(items):
            raise RuntimeError(f"engine returned {len(results)} results for {len(items)} inputs")
        return [(r, None) for r in results]
    except Exception as batch_exc:  # retried unit by unit below
        if is_sticky_cuda_error(batch_exc):
            raise
        out: list[tuple[R | None, str | None]] = []
        for item in items:
            try:
                out.append((batch_fn([item])[0], None))
            except Exception as exc:  # stamped ERROR with its message
                out.append((None, error_text(exc)))
        if len(items) > 1 and all(err is not None for _, err in out):
            raise SystematicFailure(f"every unit of the batch failed: {error_text(batch_exc)}") from batch_exc
        return out
