"""``cleaning``: the active REWRITE cleaning rules (Python regular expressions), one stamp per rule.

A rule rewrites one field of the composed text (title, scope_and_content, admin_biographical_history,
provenance) with ``re.sub(pattern, replacement)``; the active rules apply in id order.

The queue (decision 0027): a cleaned document records the rule set it was cleaned with
(``cleaning_ruleset`` = ``archive_cleaning_ruleset()`` of the rules this run loaded) and its four fields'
stamp after cleaning (``cleaning_text_stamp``). It is pending again when a field changes, or when the
active rule set changes in any way (a rule added, edited, deactivated): every governed document once.
A re-run on an unchanged document is a no-op that only re-stamps.

The audit trail: ``execution_log -> 'cleaning'`` holds one stamp per rule of the set it was cleaned with
(replaced at each cleaning), md5(rule signature || the field's value after cleaning), DONE or ERROR. An
invalid pattern is stamped ERROR for that rule and the queue moves on (fixing the rule changes the set
and re-queues). A document edited between the fetch and the write is left untouched (and stays
pending). Governed.
"""
from __future__ import annotations

import json
import re
from functools import partial
from typing import Any

from sqlalchemy import Connection, text

from scrinalia.domains.archive.workers.base import pending_batches
from scrinalia.domains.archive.workers.sdk import RunContext, WorkerSpec
from scrinalia.domains.archive.workers.stamps import (
    ACTIVE_REWRITE_RULES_SQL,
    CLEANABLE_FIELDS,
    CLEANING_TEXT_STAMP_SQL,
    PENDING_CLEANING_TEXT_SQL,
    StampQueue,
    error_text,
    rule_signature_sql,
)

QUEUE = StampQueue(key="cleaning", stamp_sql=None, governed=True, per_rule=True, pending_sql=PENDING_CLEANING_TEXT_SQL)

# The rules and the signature of the same set, in one statement (one snapshot).
_RULES = text(
    f"""
    SELECT r.id, r.name, r.field, r.pattern, coalesce(r.replacement, '') AS replacement,
           {rule_signature_sql('r')} AS signature, archive_cleaning_ruleset() AS ruleset
      FROM archive_cleaning_rules AS r WHERE {ACTIVE_REWRITE_RULES_SQL} ORDER BY r.id
    """
)

_NEW_VALUES = [f"CAST(:{f} AS text)" for f in CLEANABLE_FIELDS]
_FIELD_CASE = " ".join(f"WHEN '{f}' THEN {v}" for f, v in zip(CLEANABLE_FIELDS, _NEW_VALUES, strict=True))
_WRITE = text(
    f"""
    UPDATE archive_documents AS d
       SET {", ".join(f"{f} = {v}" for f, v in zip(CLEANABLE_FIELDS, _NEW_VALUES, strict=True))},
           updated_at = CASE WHEN CAST(:changed AS boolean) THEN now() ELSE d.updated_at END,
           cleaning_ruleset = CAST(:ruleset AS text),
           cleaning_text_stamp = archive_cleaning_text_stamp({", ".join(_NEW_VALUES)}),
           execution_log = jsonb_set(d.execution_log, '{{cleaning}}', (
                 SELECT coalesce(jsonb_object_agg(x.rule_id, jsonb_strip_nulls(jsonb_build_object(
                          'stamp', md5((x.v ->> 'signature') || chr(31) ||
                                       coalesce(CASE x.v ->> 'field' {_FIELD_CASE} END, '')),
                          'status', CASE WHEN x.v ->> 'error' IS NULL THEN 'DONE' ELSE 'ERROR' END,
                          'error', x.v ->> 'error',
                          'run_id', CAST(:run_id AS text),
                          'at', now()))), '{{}}'::jsonb)
                   FROM jsonb_each(CAST(:rules AS jsonb)) AS x(rule_id, v)))
     WHERE d.id = :id AND d.status <> 'HUMAN_APPROVED' AND {CLEANING_TEXT_STAMP_SQL.format(a='d')} = :text_stamp
    RETURNING d.id
    """
)


def load_rules(engine) -> tuple[list[dict[str, Any]], str | None]:
    """The active REWRITE rules in id order, and the signature of that set (None when there is none)."""
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
    return rules, (rows[0].ruleset if rows else None)


def apply_rules(values: dict[str, str | None],
                rules: list[dict[str, Any]]) -> tuple[dict[str, str | None], dict[int, str]]:
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
    rules, ruleset = load_rules(ctx.engine)
    ctx.result["rules"] = [r["name"] for r in rules]
    broken = {r["name"]: r["error"] for r in rules if r["error"]}
    if broken:
        ctx.result["broken_rules"] = broken
    if not rules:
        return ctx.result
    rule_json = {str(r["id"]): {"signature": r["signature"], "field": r["field"]} for r in rules}
    columns = ", ".join(f"d.{f}" for f in CLEANABLE_FIELDS) + f", {CLEANING_TEXT_STAMP_SQL.format(a='d')} AS text_stamp"
    for batch in pending_batches(ctx, QUEUE, columns):
        params = [cleaned(row, rules, rule_json, ruleset, ctx.run_id) for row in batch]
        written, changed = ctx.commit(partial(write_cleaned, params))
        ctx.tally(len(batch), rewritten=changed, skipped=len(batch) - written)
    return ctx.result


def cleaned(row: Any, rules: list[dict[str, Any]], rule_json: dict[str, dict[str, Any]], ruleset: str | None,
            run_id: Any) -> dict[str, Any]:
    """One document's write: its fields after the rules, the text stamp fetched with it, one stamp per rule."""
    before = {f: getattr(row, f) for f in CLEANABLE_FIELDS}
    after, errors = apply_rules(before, rules)
    stamps = {rid: {**v, "error": errors.get(int(rid))} for rid, v in rule_json.items()}
    return {"id": row.id, "text_stamp": row.text_stamp, "changed": after != before, "ruleset": ruleset,
            "run_id": str(run_id), "rules": json.dumps(stamps), **after}


def write_cleaned(params: list[dict[str, Any]], conn: Connection) -> tuple[int, int]:
    """The batch's cleaned fields and per-rule stamps: (documents written, documents changed). Bound with
    ``partial``: a function of the batch it is given, not a closure over the loop's variables."""
    written = changed = 0
    for p in params:
        if conn.execute(_WRITE, p).first() is not None:
            written += 1
            changed += int(p["changed"])
    return written, changed


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
    gpu=False,  # regular expressions: no device slot on a GPU host
    queue=QUEUE,
)
