"""The queue counts from ``archive_stamp_counts``: the summary the document writes keep (migration 0010).

Counting the five queues live costs a few partial-index counts per request (~30 ms on 100k documents
with large backlogs, docs/benchmarks.md). Every statement that writes ``archive_documents`` instead
records its net change in the counts, in its own transaction, by statement-level triggers (decision
0075), so the counts here are exact for the reader's snapshot and cost one read of a few dozen rows.

The triggers compute a document's state per stamp key with the conditions of the queues listed in
``SUMMARISED`` (copies of the workers' ``StampQueue``s as the migration encodes them). A catalogue
queue that differs from its copy, or has another key, is not in the summary: ``summarised`` says so,
and the caller counts it live (``stamps.catalogue_counts``); a test checks that every queue of the
catalogue is summarised and that the summary equals the live count.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine, text

from scrinalia.domains.archive.workers.stamps import (
    PENDING_CLEANING_TEXT_SQL,
    PENDING_EMBEDDING_SQL,
    PENDING_NER_SQL,
    PENDING_QUALITY_SQL,
    PENDING_TYPOLOGY_SQL,
    StampQueue,
)

_TEXT = "archive_text_stamp({a}.title, {a}.scope_and_content, {a}.admin_biographical_history, {a}.provenance)"

#: The queues whose states the triggers of migration 0010 compute, as the migration encodes them. The
#: stamp expressions are copied (the migration's SQL repeats them); the pending predicates are migration
#: 0009's functions, which the queues and their partial indexes share.
SUMMARISED: Mapping[str, StampQueue] = {
    "embedding": StampQueue(key="embedding", stamp_sql=_TEXT, governed=False, pending_sql=PENDING_EMBEDDING_SQL),
    "ner": StampQueue(key="ner", stamp_sql=_TEXT, governed=True, pending_sql=PENDING_NER_SQL),
    "typology": StampQueue(key="typology", stamp_sql="md5({a}.title)", governed=True,
                           pending_sql=PENDING_TYPOLOGY_SQL),
    "quality-validator": StampQueue(
        key="quality-validator", governed=True, pending_sql=PENDING_QUALITY_SQL,
        stamp_sql="archive_quality_stamp({a}.title, {a}.scope_and_content, {a}.admin_biographical_history, "
                  "{a}.provenance, {a}.date_text, {a}.date_start, {a}.date_end, {a}.execution_log)"),
    "cleaning": StampQueue(key="cleaning", stamp_sql=None, governed=True, per_rule=True,
                           pending_sql=PENDING_CLEANING_TEXT_SQL),
}

# Every group with a non-zero sum, and the current rule set's signature (the cleaning queue's pending
# count compares each group's rule set with it). A few dozen rows: folded groups plus recent deltas.
_READ = text(
    """
    SELECT c.stamp_key, c.governed, c.stale, c.failed, c.ruleset, CAST(sum(c.n) AS bigint) AS n, r.sig
      FROM archive_stamp_counts AS c CROSS JOIN (SELECT archive_cleaning_ruleset() AS sig) AS r
     GROUP BY c.stamp_key, c.governed, c.stale, c.failed, c.ruleset, r.sig
    HAVING sum(c.n) <> 0
    """
)
_RECOMPUTE = text("SELECT archive_stamp_counts_recompute()")
_FOLD = text("SELECT archive_stamp_counts_fold()")


@dataclass(frozen=True, slots=True)
class CountGroup:
    """The number of documents in one state of one stamp key (a row of the summary, summed)."""

    stamp_key: str
    governed: bool
    stale: bool
    failed: bool
    ruleset: str
    n: int


def summarised(queue: Any) -> bool:
    """Whether the triggers keep this queue's counts (it is exactly the queue they were written for)."""
    return isinstance(queue, StampQueue) and SUMMARISED.get(queue.key) == queue


def read_groups(conn: Connection) -> tuple[list[CountGroup], str | None]:
    rows = conn.execute(_READ).all()
    groups = [CountGroup(r.stamp_key, r.governed, r.stale, r.failed, r.ruleset, int(r.n)) for r in rows]
    return groups, (rows[0].sig if rows else None)


def queue_counts(queue: StampQueue, groups: list[CountGroup], ruleset: str | None) -> dict[str, int]:
    """pending / failed / processed of ``queue``, by the definitions of ``StampQueue.counts``: pending is
    the execution's condition, failed an ERROR stamp that is not pending, processed the rest of the
    eligible documents (the governed ones for a governed queue)."""
    pending = failed = eligible = 0
    for g in groups:
        if not _counted_by(queue, g):
            continue
        is_pending = _is_pending(queue, g, ruleset)
        eligible += g.n
        pending += g.n if is_pending else 0
        failed += g.n if g.failed and not is_pending else 0
    return {"pending": pending, "failed": failed, "processed": max(0, eligible - pending - failed)}


def _counted_by(queue: StampQueue, group: CountGroup) -> bool:
    """The group's documents are ``queue``'s: its stamp key, and governed ones for a governed queue."""
    return group.stamp_key == queue.key and (group.governed or not queue.governed)


def _is_pending(queue: StampQueue, group: CountGroup, ruleset: str | None) -> bool:
    """The execution's condition: a stale stamp; for a per-rule queue also another rule set than the
    active one, and nothing while no rule is active (a rule change re-queues all)."""
    if queue.per_rule:
        return ruleset is not None and (group.stale or group.ruleset != ruleset)
    return group.stale


def summary_counts(engine: Engine | Connection, queues: Mapping[str, StampQueue]) -> dict[str, dict[str, int]]:
    """The counts of every queue of ``queues`` (name -> queue; each ``summarised``) in one statement."""
    def run(conn: Connection) -> dict[str, dict[str, int]]:
        groups, ruleset = read_groups(conn)
        return {name: queue_counts(queue, groups, ruleset) for name, queue in queues.items()}

    if isinstance(engine, Connection):
        return run(engine)
    with engine.connect() as conn:
        out = run(conn)
        conn.rollback()
        return out


def differences(engine: Engine, catalogue: Mapping[str, Any]) -> dict[str, tuple[dict[str, int], dict[str, int]]]:
    """Worker -> (summary, live) for every summarised queue of ``catalogue`` whose two counts differ
    (none, unless something wrote the documents with the triggers disabled). Not one snapshot: run
    it while nothing writes documents, or expect the difference of a write in flight."""
    from scrinalia.domains.archive.workers.stamps import catalogue_counts

    kept = {name: spec.queue for name, spec in catalogue.items() if summarised(getattr(spec, "queue", None))}
    served = summary_counts(engine, kept)
    live = catalogue_counts(engine, {name: catalogue[name] for name in kept})
    return {name: (served[name], counts) for name, counts in live.items()
            if counts is not None and counts != served[name]}


def recompute(engine: Engine) -> int:
    """Rebuild the summary from the documents (a repair; blocks document writes while it runs).
    Returns the number of groups."""
    with engine.begin() as conn:
        return int(conn.execute(_RECOMPUTE).scalar_one())


def fold(engine: Engine) -> int:
    """Replace each group's rows by their sum now (the triggers do it every few dozen rows). Returns the
    number of rows folded."""
    with engine.begin() as conn:
        return int(conn.execute(_FOLD).scalar_one())
