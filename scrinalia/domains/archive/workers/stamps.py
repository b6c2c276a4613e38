"""Stamps: how a document worker knows what is pending, records what it did, and counts both.

Every document carries ``execution_log`` (jsonb): one entry per stamp key,
``{"stamp": <value>, "status": "DONE"|"ERROR", "run_id": ..., "at": ..., "error": ...}``.

A document is *pending* for a worker when its recorded stamp differs from the stamp its current data
would get. The stamp is computed by PostgreSQL from the row (``archive_text_stamp`` etc.: IMMUTABLE SQL
functions of the migration), so an edited text changes the expected stamp and puts the document back in
the queue by itself, without a trigger and without the application remembering to reset anything.

The pending condition is ONE SQL fragment per worker (``StampQueue.pending``), used both by the
execution (``fetch``) and by ``pending_count``. For the stamp keys with a fixed expression the migration
creates a partial index whose predicate is that very condition (``ix_documents_pending_<key>``), so:

* ``pending_count`` is an index-only count of the pending documents: its cost grows with the backlog,
  not with the archive (0 pending = an empty index);
* a batch fetch is ``ORDER BY id LIMIT n`` on the same partial index, keyset-paged by id.

``cleaning`` has one stamp per active REWRITE rule; its condition reads the rules table, which no index
predicate can, so its count is a sequential scan (measured in docs/benchmarks.md).

Each written stamp is the value computed at FETCH time (returned by the fetch query), never recomputed
at write time: a document edited between the fetch and the commit keeps a stale stamp and stays pending.
"""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine, bindparam, text
from sqlalchemy.dialects.postgresql import UUID

DONE, ERROR = "DONE", "ERROR"
ERROR_MESSAGE_MAX = 500

#: The composed text of a document (title, scope and content, history, provenance), by PostgreSQL.
COMPOSED_TEXT_SQL = "archive_composed_text({a}.title, {a}.scope_and_content, {a}.admin_biographical_history, {a}.provenance)"
TEXT_STAMP_SQL = "archive_text_stamp({a}.title, {a}.scope_and_content, {a}.admin_biographical_history, {a}.provenance)"
TITLE_STAMP_SQL = "md5({a}.title)"
QUALITY_STAMP_SQL = (
    "archive_quality_stamp({a}.title, {a}.scope_and_content, {a}.admin_biographical_history, {a}.provenance, "
    "{a}.date_text, {a}.date_start, {a}.date_end, {a}.execution_log)"
)
GOVERNED_SQL = "{a}.status <> 'HUMAN_APPROVED'"

#: Rows with at least one ERROR stamp: the predicate of the small partial index ix_documents_stamp_errors.
ANY_ERROR_SQL = (
    "(jsonb_path_exists({a}.execution_log, '$.*.status ? (@ == \"ERROR\")') "
    "OR jsonb_path_exists({a}.execution_log, '$.cleaning.*.status ? (@ == \"ERROR\")'))"
)

#: The fields a cleaning rule may rewrite (the composed text's fields).
CLEANABLE_FIELDS = ("title", "scope_and_content", "admin_biographical_history", "provenance")


def field_value_sql(alias: str, rule_alias: str = "r") -> str:
    whens = " ".join(f"WHEN '{f}' THEN {alias}.{f}" for f in CLEANABLE_FIELDS)
    return f"(CASE {rule_alias}.field {whens} END)"


def rule_signature_sql(rule_alias: str = "r") -> str:
    r = rule_alias
    return f"md5({r}.field || chr(31) || coalesce({r}.pattern, '') || chr(31) || coalesce({r}.replacement, ''))"


def rule_stamp_sql(alias: str = "d", rule_alias: str = "r") -> str:
    """The stamp of one REWRITE rule on one document: its signature and the field's current value."""
    return f"md5({rule_signature_sql(rule_alias)} || chr(31) || coalesce({field_value_sql(alias, rule_alias)}, ''))"


ACTIVE_REWRITE_RULES_SQL = (
    f"r.kind = 'REWRITE' AND r.active AND r.field IN ({', '.join(repr(f) for f in CLEANABLE_FIELDS)})"
)


@dataclass(frozen=True)
class StampQueue:
    """The queue of one document worker: its stamp key, its stamp expression, governed or not."""

    key: str
    stamp_sql: str | None  # an expression over alias {a}; None for a per-rule queue (cleaning)
    governed: bool
    per_rule: bool = False

    def pending(self, alias: str = "d") -> str:
        """The pending condition (SQL over ``alias``): the same for the execution and for the count."""
        if self.per_rule:
            # The active rules' signatures are computed once per statement (OFFSET 0 keeps the planner
            # from flattening the subquery into a per-document md5), then one md5 per document and rule.
            cond = (
                f"EXISTS (SELECT 1 FROM (SELECT r.id::text AS rid, r.field, {rule_signature_sql('r')} AS sig "
                f"FROM archive_cleaning_rules AS r WHERE {ACTIVE_REWRITE_RULES_SQL} OFFSET 0) AS rs "
                f"WHERE ({alias}.execution_log -> '{self.key}' -> rs.rid ->> 'stamp') IS DISTINCT FROM "
                f"md5(rs.sig || chr(31) || coalesce({field_value_sql(alias, 'rs')}, '')))"
            )
        else:
            cond = (
                f"({alias}.execution_log #>> '{{{self.key},stamp}}') "
                f"IS DISTINCT FROM {self.stamp_sql.format(a=alias)}"
            )
        if self.governed:
            cond = f"{GOVERNED_SQL.format(a=alias)} AND {cond}"
        return cond

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
        sql = text(f"SELECT count(*) FROM archive_documents AS d WHERE {self.pending('d')}")
        return int(_scalar(engine, sql))

    def counts(self, engine: Engine | Connection) -> dict[str, int]:
        """pending (the execution's condition), failed (ERROR and not pending), processed (the rest).

        Every part is index-backed for the fixed-expression keys: pending through the key's partial
        index, failed through ix_documents_stamp_errors (holds only rows with an ERROR stamp), and the
        eligible total through an index-only count.
        """
        if self.per_rule:
            failed_cond = f"jsonb_path_exists(d.execution_log, '$.{self.key}.*.status ? (@ == \"ERROR\")')"
        else:
            failed_cond = f"(d.execution_log #>> '{{{self.key},status}}') = 'ERROR'"
        eligible = "count(*)" if not self.governed else "count(*) FILTER (WHERE d.status <> 'HUMAN_APPROVED')"
        sql = text(
            f"""
            SELECT (SELECT count(*) FROM archive_documents AS d WHERE {self.pending('d')}) AS pending,
                   (SELECT count(*) FROM archive_documents AS d
                     WHERE {ANY_ERROR_SQL.format(a='d')} AND {failed_cond}
                       {"AND d.status <> 'HUMAN_APPROVED'" if self.governed else ""}
                       AND NOT ({self.pending('d')})) AS failed,
                   (SELECT {eligible} FROM archive_documents AS d) AS eligible
            """
        )
        row = _one(engine, sql)
        pending, failed, eligible_n = int(row.pending), int(row.failed), int(row.eligible)
        return {"pending": pending, "failed": failed, "processed": max(0, eligible_n - pending - failed)}

    def count_columns(self, suffix: str | int) -> list[str]:
        """The pending and failed sub-selects of this queue, for a statement that counts many queues."""
        pending = self.pending("d")
        if self.per_rule:
            failed_cond = f"jsonb_path_exists(d.execution_log, '$.{self.key}.*.status ? (@ == \"ERROR\")')"
        else:
            failed_cond = f"(d.execution_log #>> '{{{self.key},status}}') = 'ERROR'"
        governed = "AND d.status <> 'HUMAN_APPROVED'" if self.governed else ""
        return [
            f"(SELECT count(*) FROM archive_documents AS d WHERE {pending}) AS pending_{suffix}",
            f"(SELECT count(*) FROM archive_documents AS d WHERE {ANY_ERROR_SQL.format(a='d')} "
            f"AND {failed_cond} {governed} AND NOT ({pending})) AS failed_{suffix}",
        ]

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
        ids, values, statuses, errors = zip(*stamps)
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


def _one(engine: Engine | Connection, sql: Any, params: Mapping[str, Any] | None = None) -> Any:
    """One row of a count. JIT is off for it: the planner prices the per-rule subplan so high that
    PostgreSQL would spend ~100 ms compiling a query that reads an empty partial index."""
    if isinstance(engine, Connection):
        engine.execute(_NO_JIT)
        return engine.execute(sql, params or {}).one()
    with engine.connect() as conn:
        conn.execute(_NO_JIT)
        row = conn.execute(sql, params or {}).one()
        conn.rollback()
        return row


def _scalar(engine: Engine | Connection, sql: Any, params: Mapping[str, Any] | None = None) -> Any:
    return _one(engine, sql, params)[0]


def error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:ERROR_MESSAGE_MAX]


def reset_stamps(engine: Engine, key: str) -> int:
    """Forget a stamp key on every document, so its worker re-processes the whole archive."""
    with engine.begin() as conn:
        return conn.execute(
            text("UPDATE archive_documents SET execution_log = execution_log - CAST(:key AS text) "
                 "WHERE execution_log ? CAST(:key AS text)"),
            {"key": key},
        ).rowcount


def dumps(value: Any) -> str:
    return json.dumps(value, default=str, ensure_ascii=False)


RUN_ID_PARAM = bindparam("run_id", type_=UUID(as_uuid=True))


def catalogue_counts(engine: Engine | Connection, specs: Mapping[str, Any]) -> dict[str, dict[str, int] | None]:
    """``{"pending", "processed", "failed"}`` for every worker of ``specs`` with a StampQueue, in ONE
    statement (JIT off: see ``_one``); None for a worker without a queue. On 100k documents: a few ms for
    the indexed queues, plus ~0.1-0.2 s when ``cleaning`` (a sequential scan) is among them."""
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
    row = _one(engine, text(
        "SELECT totals.*, " + ", ".join(columns) + " FROM (SELECT count(*) AS total, "
        "count(*) FILTER (WHERE status <> 'HUMAN_APPROVED') AS governed FROM archive_documents) AS totals"))
    m = row._mapping
    for name, (i, queue) in queues.items():
        eligible = m["governed"] if queue.governed else m["total"]
        pending, failed = int(m[f"pending_{i}"]), int(m[f"failed_{i}"])
        out[name] = {"pending": pending, "failed": failed, "processed": max(0, int(eligible) - pending - failed)}
    return out
