"""Stamps: how a document worker knows what is pending, records what it did, and counts both.

Every document carries ``execution_log`` (jsonb): one entry per stamp key,
``{"stamp": <value>, "status": "DONE"|"ERROR", "run_id": ..., "at": ..., "error": ...}``.

A document is *pending* for a worker when its recorded stamp differs from the stamp its current data
would get. The stamp is computed by PostgreSQL from the row (``archive_text_stamp`` etc.: IMMUTABLE SQL
functions of the migration), so an edited text changes the expected stamp and puts the document back in
the queue by itself, without a trigger and without the application remembering to reset anything.

The pending condition is ONE SQL function per worker (migration 0009, decision 0095: ``PENDING_*_SQL``
below name them), called both by the execution (``fetch``) and by ``pending_count``, and the predicate of
the worker's partial index (``ix_documents_pending_<key>``); PostgreSQL inlines it on both sides, so:

* ``pending_count`` is an index-only count of the pending documents: its cost grows with the backlog,
  not with the archive (0 pending = an empty index);
* a batch fetch is ``ORDER BY id LIMIT n`` on the same partial index, keyset-paged by id.

``cleaning`` keeps one stamp per active REWRITE rule in execution_log (the audit trail: DONE/ERROR per
rule), but its queue reads two columns (decision 0027): ``cleaning_text_stamp`` (the four fields' stamp
after cleaning) and ``cleaning_ruleset`` (the rule set's signature, ``archive_cleaning_ruleset()``, at
cleaning time). Pending = governed AND a rule is active AND (text changed since cleaning: the predicate
of ix_documents_pending_cleaning OR cleaning_ruleset < sig OR > sig: range scans on
ix_documents_cleaning_ruleset), the signature an InitPlan over the small rules table. The fetch is a
BitmapOr of those index scans; the count is the same set counted in three index reads without a heap
visit per pending document (``pending_count_sql``). See
``StampQueue.planner_settings`` for why the planner is told which scans to use.

Each written stamp is the value computed at FETCH time (returned by the fetch query), never recomputed
at write time: a document edited between the fetch and the commit keeps a stale stamp and stays pending.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine, text

DONE, ERROR = "DONE", "ERROR"
ERROR_MESSAGE_MAX = 500

#: The composed text of a document (title, scope and content, history, provenance), by PostgreSQL.
COMPOSED_TEXT_SQL = ("archive_composed_text({a}.title, {a}.scope_and_content, {a}.admin_biographical_history, "
                     "{a}.provenance)")
TEXT_STAMP_SQL = "archive_text_stamp({a}.title, {a}.scope_and_content, {a}.admin_biographical_history, {a}.provenance)"
TITLE_STAMP_SQL = "md5({a}.title)"
QUALITY_STAMP_SQL = (
    "archive_quality_stamp({a}.title, {a}.scope_and_content, {a}.admin_biographical_history, {a}.provenance, "
    "{a}.date_text, {a}.date_start, {a}.date_end, {a}.execution_log)"
)
GOVERNED_SQL = "{a}.status <> 'HUMAN_APPROVED'"

# The queues' predicates are SQL functions of migration 0009, each the predicate of a partial index
# (docs/protocol.md, "Stamp queues"): the workers call the very function the index was built on, so the
# planner proves the index's predicate from the query's, and the condition is written once, in SQL.
_FOUR_FIELDS = "{a}.title, {a}.scope_and_content, {a}.admin_biographical_history, {a}.provenance"
PENDING_EMBEDDING_SQL = "archive_pending_embedding({a}.execution_log, " + _FOUR_FIELDS + ")"
PENDING_NER_SQL = "archive_pending_ner({a}.status, {a}.execution_log, " + _FOUR_FIELDS + ")"
PENDING_TYPOLOGY_SQL = "archive_pending_typology({a}.status, {a}.execution_log, {a}.title)"
PENDING_QUALITY_SQL = ("archive_pending_quality({a}.status, {a}.execution_log, " + _FOUR_FIELDS
                       + ", {a}.date_text, {a}.date_start, {a}.date_end)")
#: The cleaning queue's text arm: changed since cleaning (governed), backs ix_documents_pending_cleaning.
PENDING_CLEANING_TEXT_SQL = "archive_pending_cleaning_text({a}.status, {a}.cleaning_text_stamp, " + _FOUR_FIELDS + ")"

#: Rows with at least one ERROR stamp: the predicate of the small partial index ix_documents_stamp_errors.
ANY_ERROR_SQL = "archive_has_stamp_error({a}.execution_log)"

#: The fields a cleaning rule may rewrite (the composed text's fields).
CLEANABLE_FIELDS = ("title", "scope_and_content", "admin_biographical_history", "provenance")


def rule_signature_sql(rule_alias: str = "r") -> str:
    r = rule_alias
    return f"archive_cleaning_rule_signature({r}.field, {r}.pattern, {r}.replacement)"


ACTIVE_REWRITE_RULES_SQL = (
    f"r.kind = 'REWRITE' AND r.active AND r.field IN ({', '.join(repr(f) for f in CLEANABLE_FIELDS)})"
)

#: The stamp of the four cleanable fields as they are (NULL and '' distinct), by PostgreSQL.
CLEANING_TEXT_STAMP_SQL = (
    "archive_cleaning_text_stamp({a}.title, {a}.scope_and_content, {a}.admin_biographical_history, {a}.provenance)"
)
#: The signature of the active REWRITE rule set (NULL when none): ONE SQL function, in the migration.
#: As a scalar subquery it is an InitPlan, evaluated once per statement, usable as an index bound.
CLEANING_RULESET_SQL = "(SELECT archive_cleaning_ruleset())"


@dataclass(frozen=True)
class StampQueue:
    """The queue of one document worker: its stamp key, its stamp expression, governed or not."""

    key: str
    stamp_sql: str | None  # an expression over alias {a}; None for a per-rule queue (cleaning)
    governed: bool
    per_rule: bool = False
    #: The migration's predicate function over alias {a} (``PENDING_*_SQL``): the whole pending condition
    #: of a fixed-expression queue, the text arm of the per-rule one. None (a plug-in's queue without a
    #: migration of its own): ``archive_stamp_pending`` of the key and ``stamp_sql``, with no index.
    pending_sql: str | None = None

    def _cleaning_parts(self, alias: str) -> tuple[str, str, tuple[str, str]]:
        """The per-rule queue's condition as (gate, text arm, rule-set ranges): pending = gate AND (text
        OR below OR above). Nothing is pending while no rule is active (the gate, a one-time filter).
        The text arm (changed since cleaning) is the predicate of ix_documents_pending_cleaning; "cleaned
        with another rule set" is two open ranges, index range scans on ix_documents_cleaning_ruleset.
        "Never cleaned" (cleaning_ruleset IS NULL) needs no arm of its own: ck_documents_cleaning_record
        makes it cleaning_text_stamp IS NULL, which the text arm holds; an IS NULL arm would visit every
        HUMAN_APPROVED row (never cleaned) on each count."""
        sig = CLEANING_RULESET_SQL
        gate = f"{sig} IS NOT NULL"
        text_arm = (self.pending_sql or PENDING_CLEANING_TEXT_SQL).format(a=alias)
        return gate, text_arm, (f"{alias}.cleaning_ruleset < {sig}", f"{alias}.cleaning_ruleset > {sig}")

    def pending(self, alias: str = "d") -> str:
        """The pending condition (SQL over ``alias``): the same for the execution and for the count."""
        if self.pending_sql is not None and not self.per_rule:
            return self.pending_sql.format(a=alias)  # governed or not, as the function says
        if self.per_rule:
            gate, text_arm, (below, above) = self._cleaning_parts(alias)
            cond = f"{gate} AND ({text_arm} OR {below} OR {above})"
        else:
            key = self.key.replace("'", "''")
            cond = f"archive_stamp_pending({alias}.execution_log, '{key}', {self.stamp(alias)})"
        if self.governed:
            cond = f"{GOVERNED_SQL.format(a=alias)} AND {cond}"
        return cond

    def pending_count_sql(self) -> str:
        """A scalar SQL expression: the number of documents ``pending`` holds.

        For the per-rule queue, count(gate AND (text OR below OR above)) is written count(below) +
        count(above) + count(text AND NOT below AND NOT above) (the ranges are disjoint; each term
        governed and gated): the same set, counted without a heap visit per pending document. The ranges
        are index-only range scans of ix_documents_cleaning_ruleset (cleaning_ruleset) INCLUDE (status);
        the text term reads only ix_documents_pending_cleaning (id, cleaning_ruleset), whose entries
        carry the rule set it subtracts (``FILTER``), so the planner has no other index to pick for it.
        """
        if not self.per_rule:
            return f"(SELECT count(*) FROM archive_documents AS d WHERE {self.pending('d')})"
        gate, text_arm, (below, above) = self._cleaning_parts("d")
        where = f"{GOVERNED_SQL.format(a='d')} AND {gate}" if self.governed else gate
        return (
            f"((SELECT count(*) FROM archive_documents AS d WHERE {where} AND {below}) + "
            f"(SELECT count(*) FROM archive_documents AS d WHERE {where} AND {above}) + "
            f"(SELECT count(*) - count(*) FILTER (WHERE {below}) - count(*) FILTER (WHERE {above}) "
            f"FROM archive_documents AS d WHERE {where} AND {text_arm}))"
        )

    def planner_settings(self, fetch: bool = False) -> tuple[str, ...]:
        """``SET LOCAL`` settings for a statement that reads this queue.

        The per-rule queue's condition is an OR whose arms PostgreSQL cannot estimate: ``x IS DISTINCT
        FROM f(row)`` is priced at 99.5% of the rows and ``cleaning_ruleset < $initplan`` at a third, so
        on its own it picks a sequential scan with an md5 per row (~100 ms per 100k documents) for the
        count, and for the fetch a primary-key scan that filters the whole archive when little is
        pending. The BitmapOr of the two indexes is never worse than those by much (~35 ms per 100k
        when everything is pending) and is ~0.5 ms when nothing is, so the statement says so.
        """
        if not self.per_rule:
            return ()
        return ("enable_seqscan = off", "enable_indexscan = off") if fetch else ("enable_seqscan = off",)

    def prepare(self, conn: Connection, fetch: bool = False) -> None:
        """Apply ``planner_settings`` to the current transaction of ``conn``."""
        for setting in self.planner_settings(fetch):
            conn.execute(text(f"SET LOCAL {setting}"))

    def stamp(self, alias: str = "d") -> str:
        return self.stamp_sql.format(a=alias) if self.stamp_sql else "NULL"

    # -- reads ------------------------------------------------------------------------------------

    def fetch_sql(self, columns: str) -> Any:
        """A keyset-paged fetch of pending documents: ``:after`` (last id) and ``:limit``."""
        return text(
            f"""
            SELECT d.id, {self.stamp('d')} AS stamp, {columns}
              FROM archive_documents AS d
             WHERE {self.pending('d')} AND d.id > :after
             ORDER BY d.id
             LIMIT :limit
            """
        )

    def pending_count(self, engine: Engine | Connection) -> int:
        sql = text(f"SELECT {self.pending_count_sql()}")
        return int(_scalar(engine, sql, settings=self.planner_settings()))

    def counts(self, engine: Engine | Connection) -> dict[str, int]:
        """pending (the execution's condition), failed (ERROR and not pending), processed (the rest).

        Every part is index-backed for the fixed-expression keys: pending through the key's partial
        index, failed through ix_documents_stamp_errors (holds only rows with an ERROR stamp), and the
        eligible total through an index-only count.
        """
        eligible = "count(*)" if not self.governed else "count(*) FILTER (WHERE d.status <> 'HUMAN_APPROVED')"
        sql = text(
            f"""
            SELECT {self.pending_count_sql()} AS pending, {self.failed_count_sql()} AS failed,
                   (SELECT {eligible} FROM archive_documents AS d) AS eligible
            """
        )
        row = _one(engine, sql, settings=self.planner_settings())
        pending, failed, eligible_n = int(row.pending), int(row.failed), int(row.eligible)
        return {"pending": pending, "failed": failed, "processed": max(0, eligible_n - pending - failed)}

    def failed_count_sql(self) -> str:
        """A scalar SQL expression: the documents whose stamp is ERROR and that are not pending (read
        through ix_documents_stamp_errors, which holds only rows with an ERROR stamp)."""
        if self.per_rule:
            failed_cond = f"jsonb_path_exists(d.execution_log, '$.{self.key}.*.status ? (@ == \"ERROR\")')"
        else:
            failed_cond = f"(d.execution_log #>> '{{{self.key},status}}') = 'ERROR'"
        governed = f"AND {GOVERNED_SQL.format(a='d')}" if self.governed else ""
        return (f"(SELECT count(*) FROM archive_documents AS d WHERE {ANY_ERROR_SQL.format(a='d')} "
                f"AND {failed_cond} {governed} AND NOT ({self.pending('d')}))")

    def count_columns(self, suffix: str | int) -> list[str]:
        """The pending and failed sub-selects of this queue, for a statement that counts many queues."""
        return [f"{self.pending_count_sql()} AS pending_{suffix}", f"{self.failed_count_sql()} AS failed_{suffix}"]

    # -- writes -----------------------------------------------------------------------------------

    def write_stamps(
        self,
        conn: Connection,
        run_id: Any,
        stamps: Sequence[tuple[int, str | None, str, str | None]],
    ) -> set[int]:
        """Stamp (id, stamp, status, error) rows; returns the ids actually stamped.

        A governed queue skips documents that became HUMAN_APPROVED since the fetch: the caller writes
        its results only for the returned ids.
        """
        if not stamps:
            return set()
        ids, values, statuses, errors = zip(*stamps, strict=True)
        rows = conn.execute(
            _write_stamps_sql(self.governed),
            {
                "key": self.key,
                "run_id": str(run_id),
                "ids": list(ids),
                "stamps": list(values),
                "statuses": list(statuses),
                "errors": [None if e is None else str(e)[:ERROR_MESSAGE_MAX] for e in errors],
            },
        ).all()
        return {r.id for r in rows}


def _write_stamps_sql(governed: bool) -> Any:
    return text(
        f"""
        UPDATE archive_documents AS d
           SET execution_log = jsonb_set(
                   d.execution_log, ARRAY[CAST(:key AS text)],
                   jsonb_strip_nulls(jsonb_build_object(
                       'stamp', v.stamp, 'status', v.status, 'run_id', CAST(:run_id AS text),
                       'at', now(), 'error', v.error)))
          FROM unnest(CAST(:ids AS bigint[]), CAST(:stamps AS text[]), CAST(:statuses AS text[]),
                      CAST(:errors AS text[])) AS v(id, stamp, status, error)
         WHERE d.id = v.id {"AND d.status <> 'HUMAN_APPROVED'" if governed else ""}
        RETURNING d.id
        """
    )


_NO_JIT = text("SET LOCAL jit = off")


def _one(engine: Engine | Connection, sql: Any, params: Mapping[str, Any] | None = None,
         settings: Sequence[str] = ()) -> Any:
    """One row of a count. JIT is off for it: PostgreSQL prices the stamp expressions high enough to
    spend tens of ms compiling a query that reads an empty partial index. ``settings``: more ``SET
    LOCAL`` (a queue's ``planner_settings``)."""
    def run(conn: Connection) -> Any:
        conn.execute(_NO_JIT)
        for setting in settings:
            conn.execute(text(f"SET LOCAL {setting}"))
        return conn.execute(sql, params or {}).one()

    if isinstance(engine, Connection):
        return run(engine)
    with engine.connect() as conn:
        row = run(conn)
        conn.rollback()
        return row


def _scalar(engine: Engine | Connection, sql: Any, params: Mapping[str, Any] | None = None,
            settings: Sequence[str] = ()) -> Any:
    return _one(engine, sql, params, settings)[0]


def error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:ERROR_MESSAGE_MAX]


#: Columns that belong to a stamp key's record besides execution_log (forgotten with it).
_RECORD_COLUMNS = {"cleaning": ("cleaning_ruleset", "cleaning_text_stamp")}


def reset_stamps(engine: Engine, key: str) -> int:
    """Forget a stamp key on every document, so its worker re-processes the whole archive."""
    columns = _RECORD_COLUMNS.get(key, ())
    sets = "".join(f", {c} = NULL" for c in columns)
    where = " OR ".join(["execution_log ? CAST(:key AS text)"] + [f"{c} IS NOT NULL" for c in columns])
    with engine.begin() as conn:
        return conn.execute(
            text(f"UPDATE archive_documents SET execution_log = execution_log - CAST(:key AS text){sets} "
                 f"WHERE {where}"),
            {"key": key},
        ).rowcount


def catalogue_counts(engine: Engine | Connection, specs: Mapping[str, Any]) -> dict[str, dict[str, int] | None]:
    """``{"pending", "processed", "failed"}`` for every worker of ``specs`` with a StampQueue, in ONE
    statement (JIT off: see ``_one``; with the queues' ``planner_settings``); None for a worker without
    a queue. Every part is index-backed: a few ms on 100k documents when little is pending
    (docs/benchmarks.md)."""
    out: dict[str, dict[str, int] | None] = {}
    columns: list[str] = []
    queues: dict[str, tuple[int, StampQueue]] = {}
    for i, (name, spec) in enumerate(specs.items()):
        queue = getattr(spec, "queue", None)
        if not isinstance(queue, StampQueue):
            out[name] = None
            continue
        queues[name] = (i, queue)
        columns += queue.count_columns(i)
    if not queues:
        return out
    settings = sorted({s for _, q in queues.values() for s in q.planner_settings()})
    row = _one(engine, text(
        "SELECT totals.*, " + ", ".join(columns) + " FROM (SELECT count(*) AS total, "
        "count(*) FILTER (WHERE status <> 'HUMAN_APPROVED') AS governed FROM archive_documents) AS totals"),
        settings=settings)
    m = row._mapping
    for name, (i, queue) in queues.items():
        eligible = m["governed"] if queue.governed else m["total"]
        pending, failed = int(m[f"pending_{i}"]), int(m[f"failed_{i}"])
        out[name] = {"pending": pending, "failed": failed, "processed": max(0, int(eligible) - pending - failed)}
    return out
