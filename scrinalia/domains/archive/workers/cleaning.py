"""``cleaning``: the active REWRITE cleaning rules (Python regular expressions), one stamp per rule.

A rule rewrites one field of the composed text (title, scope_and_content, admin_biographical_history,
provenance) with ``re.sub(pattern, replacement)``; the active rules apply in id order. Each rule's stamp
is md5(rule signature || the field's value after cleaning), computed by PostgreSQL, under
``execution_log -> 'cleaning' -> '<rule id>'``: a document is pending when any active rule's stamp
differs, so a new or edited rule, or an edited field, puts it back in the queue. An invalid pattern is
stamped ERROR for that rule (the queue moves on; fixing the rule changes its signature and re-queues).
A document edited between the fetch and the write is left untouched (and stays pending). Governed.
"""
from __future__ import annotations

import json
import re
from typing import Any

from sqlalchemy import Connection, text

from scrinalia.domains.archive.workers.base import pending_batches
from scrinalia.domains.archive.workers.sdk import RunContext, WorkerSpec
from scrinalia.domains.archive.workers.stamps import (
    ACTIVE_REWRITE_RULES_SQL,
    CLEANABLE_FIELDS,
    TEXT_STAMP_SQL,
    StampQueue,
    error_text,
    rule_signature_sql,
)

QUEUE = StampQueue(key="cleaning", stamp_sql=None, governed=True, per_rule=True)

_RULES = text(
    f"""
    SELECT r.id, r.name, r.field, r.pattern, coalesce(r.replacement, '') AS replacement,
           {rule_signature_sql('r')} AS signature
      FROM archive_cleaning_rules AS r WHERE {ACTIVE_REWRITE_RULES_SQL} ORDER BY r.id
    """
)

_FIELD_CASE = " ".join(f"WHEN '{f}' THEN CAST(:{f} AS text)" for f in CLEANABLE_FIELDS)
_WRITE = text(
    f"""
    UPDATE archive_documents AS d
       SET {", ".join(f"{f} = CAST(:{f} AS text)" for f in CLEANABLE_FIELDS)},
           updated_at = CASE WHEN CAST(:changed AS boolean) THEN now() ELSE d.updated_at END,
           execution_log = jsonb_set(d.execution_log, '{{cleaning}}',
               coalesce(d.execution_log -> 'cleaning', '{{}}'::jsonb) || (
                 SELECT coalesce(jsonb_object_agg(x.rule_id, jsonb_strip_nulls(jsonb_build_object(
                          'stamp', md5((x.v ->> 'signature') || chr(31) ||
                                       coalesce(CASE x.v ->> 'field' {_FIELD_CASE} END, '')),
                          'status', CASE WHEN x.v ->> 'error' IS NULL THEN 'DONE' ELSE 'ERROR' END,
                          'error', x.v ->> 'error',
                          'run_id', CAST(:run_id AS text),
                          'at', now()))), '{{}}'::jsonb)
                   FROM jsonb_each(CAST(:rules AS jsonb)) AS x(rule_id, v)))
     WHERE d.id = :id AND d.status <> 'HUMAN_APPROVED' AND {TEXT_STAMP_SQL.format(a='d')} = :text_stamp
    RETURNING d.id
    """
)


def load_rules(engine) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        rows = conn.execute(_RULES).all()
    rules = []
    for r in rows:
        rule = {"id": r.id, "name": r.name, "field": r.field, "replacement": r.replacement,
                "signature": r.signature, "regex": None, "error": None}
        try:
            rule["regex"] = re.compile(r.pattern or "")
            if not r.pattern:
                raise re.error("the pattern is empty")
        except re.error as exc:
            rule["error"] = f"invalid pattern: {exc}"
        rules.append(rule)
    return rules


def apply_rules(values: dict[str, str | None], rules: list[dict[str, Any]]) -> tuple[dict[str, str | None], dict[int, str]]:
    """The cleaned values and, per rule id, the error of a rule that could not run."""
    out, errors = dict(values), {}
    for rule in rules:
        if rule["error"]:
            errors[rule["id"]] = rule["error"]
            continue
        value = out.get(rule["field"])
        if value is None:
            continue
        try:
            out[rule["field"]] = rule["regex"].sub(rule["replacement"], value)
        except (re.error, IndexError) as exc:
            errors[rule["id"]] = error_text(exc)
    return out, errors


def run(ctx: RunContext) -> dict[str, Any]:
    rules = load_rules(ctx.engine)
    ctx.result["rules"] = [r["name"] for r in rules]
    broken = {r["name"]: r["error"] for r in rules if r["error"]}
    if broken:
        ctx.result["broken_rules"] = broken
    if not rules:
        return ctx.result
    columns = ", ".join(f"d.{f}" for f in CLEANABLE_FIELDS) + f", {TEXT_STAMP_SQL.format(a='d')} AS text_stamp"
    for batch in pending_batches(ctx, QUEUE, columns):
        params = []
        for row in batch:
            before = {f: getattr(row, f) for f in CLEANABLE_FIELDS}
            after, errors = apply_rules(before, rules)
            rule_json = {str(r["id"]): {"signature": r["signature"], "field": r["field"],
                                        "error": errors.get(r["id"])} for r in rules}
            params.append({"id": row.id, "text_stamp": row.text_stamp, "changed": after != before,
                           "run_id": str(ctx.run_id), "rules": json.dumps(rule_json), **after})

        def write(conn: Connection) -> tuple[int, int]:
            written = changed = 0
            for p in params:
                if conn.execute(_WRITE, p).first() is not None:
                    written += 1
                    changed += int(p["changed"])
            return written, changed

        written, changed = ctx.commit(write)
        ctx.tally(len(batch), rewritten=changed, skipped=len(batch) - written)
    return ctx.result


SPEC = WorkerSpec(
    name="cleaning",
    label="Cleaning",
    description="Applies the active REWRITE cleaning rules (regular expressions) to the descriptive text, "
                "with one stamp per rule.",
    run=run,
    unit="document",
    governed=True,
    engine_source="none",
    stamp_key=QUEUE.key,
    default_batch_size=100,
    queue=QUEUE,
)
