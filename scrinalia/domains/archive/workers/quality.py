"""``quality-validator``: rule checks, an optional model check, anomalies and the review queue.

Rule checks (codes in ``anomaly_reasons``):
  title_empty, title_all_caps, title_duplicate (another document has the same title), title_repeated_words,
  title_template (a placeholder such as "Untitled" or "[title]"), date_missing, date_future,
  no_entities / no_typology (only once ``ner`` / ``typology`` have stamped the document), and
  validate_rule (an active VALIDATE cleaning rule whose pattern is found in its field).
The model check: the engine of the active LLM_CHECK cleaning rule (resolved at claim, never at
enqueue); a document is flagged ``model_check`` when its field entails the rule's prompt with a
probability of at least the rule's ``threshold``.

An anomalous document gets ``is_anomaly``, its reasons, the status NEEDS_REVIEW (from DRAFT or
PUBLISHED) and one open row in ``archive_review_queue``; a clean one gets ``is_anomaly = false`` and no
reasons (its status and any open review row are left to a human). Governed.

Stamp: ``archive_quality_stamp(...)``: the composed text, the date fields and the run ids of the
``ner`` and ``typology`` stamps, so a document is re-validated when its text or dates change or when
either of those workers re-processes it.
"""
from __future__ import annotations

import json
import re
from typing import Any

from sqlalchemy import Connection, text

from scrinalia.domains.archive.workers.base import commit_batch, pending_batches, per_unit
from scrinalia.domains.archive.workers.engines.nli import nli_engine
from scrinalia.domains.archive.workers.sdk import OptionSpec, RunContext, WorkerSpec
from scrinalia.domains.archive.workers.stamps import (
    CLEANABLE_FIELDS,
    COMPOSED_TEXT_SQL,
    DONE,
    ERROR,
    QUALITY_STAMP_SQL,
    StampQueue,
)

QUEUE = StampQueue(key="quality-validator", stamp_sql=QUALITY_STAMP_SQL, governed=True)
CHECKED_FIELDS = CLEANABLE_FIELDS + ("date_text", "creator")

NLI_CHECK = nli_engine(
    "nli-check",
    "the LLM_CHECK rule's prompt as an NLI hypothesis over the document's field (local NLI model)",
    {"threshold": OptionSpec("float", 0.5, "entailment probability from which a document is flagged",
                             minimum=0.0, maximum=1.0)},
    required_hint="engine_options.model must name a local NLI model directory on the runner's host: set it in the "
                  "active LLM_CHECK cleaning rule's engine_options (docs/workers.md, \"Models\"), or deactivate "
                  "the rule to run the rule-based checks only",
)

DEFAULT_TEMPLATES = [
    r"^\s*(untitled|no title|sem t[ií]tulo|sin t[ií]tulo|sans titre|title|t[ií]tulo|document|documento|"
    r"n/?a|tbd|todo|xxx+|lorem ipsum.*|\?+|-+|\.+)\s*$",
    r"^\s*[\[<{(]\s*[^\]>})]*\s*[\]>})]\s*$",  # [title], <titulo>, {{title}}
]

COLUMNS = ", ".join([
    *(f"d.{f}" for f in CHECKED_FIELDS),
    "d.date_start", "d.date_end",
    f"{COMPOSED_TEXT_SQL.format(a='d')} AS text",
    "(d.date_start > current_date OR d.date_end > current_date) AS date_future",
    "(d.execution_log ? 'ner') AS ner_ran",
    "(d.execution_log ? 'typology') AS typology_ran",
    "EXISTS (SELECT 1 FROM archive_document_entities x WHERE x.document_id = d.id) AS has_entities",
    "EXISTS (SELECT 1 FROM archive_document_typologies x WHERE x.document_id = d.id) AS has_typology",
    "(btrim(d.title) <> '' AND EXISTS (SELECT 1 FROM archive_documents o "
    " WHERE lower(btrim(o.title)) = lower(btrim(d.title)) AND o.id <> d.id)) AS title_duplicate",
])

_UPDATE = text(
    """
    UPDATE archive_documents AS d
       SET is_anomaly = v.anomaly,
           anomaly_reasons = v.reasons,
           status = CASE WHEN v.anomaly AND d.status IN ('DRAFT', 'PUBLISHED')
                         THEN CAST('NEEDS_REVIEW' AS document_status) ELSE d.status END,
           updated_at = CASE WHEN v.anomaly AND d.status IN ('DRAFT', 'PUBLISHED') THEN now() ELSE d.updated_at END
      FROM (SELECT * FROM jsonb_to_recordset(CAST(:rows AS jsonb)) AS x(id bigint, anomaly boolean, reasons jsonb)) AS v
     WHERE d.id = v.id AND d.status <> 'HUMAN_APPROVED'
    RETURNING d.id
    """
)
_REVIEW = text(
    """
    INSERT INTO archive_review_queue (document_id, reason, details, source_run_id)
    SELECT v.id, v.reason, v.details, CAST(:run_id AS uuid)
      FROM jsonb_to_recordset(CAST(:rows AS jsonb)) AS v(id bigint, reason text, details jsonb)
    ON CONFLICT (document_id) WHERE resolved_at IS NULL
    DO UPDATE SET reason = EXCLUDED.reason, details = EXCLUDED.details, source_run_id = EXCLUDED.source_run_id
    """
)


def _reason(code: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"code": code, "message": message, **extra}


def title_checks(title: str, templates: list[re.Pattern[str]], min_caps_letters: int) -> list[dict[str, Any]]:
    reasons = []
    stripped = (title or "").strip()
    if not stripped:
        return [_reason("title_empty", "the title is empty")]
    letters = [c for c in stripped if c.isalpha()]
    if len(letters) >= min_caps_letters and all(c.isupper() for c in letters):
        reasons.append(_reason("title_all_caps", "the title is written in capitals only"))
    words = re.findall(r"\w+", stripped.casefold())
    if any(a == b and len(a) > 1 for a, b in zip(words, words[1:])):
        reasons.append(_reason("title_repeated_words", "the title repeats a word"))
    if any(p.search(stripped) for p in templates):
        reasons.append(_reason("title_template", "the title is a placeholder, not a description"))
    return reasons


def rule_checks(row: Any, options: dict[str, Any], templates: list[re.Pattern[str]],
                validate_rules: list[dict[str, Any]]) -> list[dict[str, Any]]:
    reasons = title_checks(row.title, templates, options["min_caps_letters"])
    if row.title_duplicate:
        reasons.append(_reason("title_duplicate", "another document has the same title"))
    if row.date_start is None and row.date_end is None and not (row.date_text or "").strip():
        reasons.append(_reason("date_missing", "the document has no date"))
    if row.date_future:
        reasons.append(_reason("date_future", "the document is dated in the future"))
    if options["check_entities"] and row.ner_ran and not row.has_entities:
        reasons.append(_reason("no_entities", "no named entity was found"))
    if options["check_typology"] and row.typology_ran and not row.has_typology:
        reasons.append(_reason("no_typology", "no typology was assigned"))
    for rule in validate_rules:
        value = getattr(row, rule["field"], None) or ""
        if rule["regex"].search(value):
            reasons.append(_reason("validate_rule", rule["message"] or f"rule {rule['name']} matched",
                                   rule=rule["name"], field=rule["field"]))
    return reasons


def load_validate_rules(engine) -> tuple[list[dict[str, Any]], dict[str, str]]:
    rules, broken = [], {}
    with engine.connect() as conn:
        rows = conn.execute(text(
            "SELECT id, name, field, pattern, message FROM archive_cleaning_rules "
            "WHERE kind = 'VALIDATE' AND active ORDER BY id")).all()
    for r in rows:
        if r.field not in CHECKED_FIELDS or not r.pattern:
            broken[r.name] = f"field {r.field!r} cannot be checked or the pattern is empty"
            continue
        try:
            rules.append({"name": r.name, "field": r.field, "message": r.message, "regex": re.compile(r.pattern)})
        except re.error as exc:
            broken[r.name] = f"invalid pattern: {exc}"
    return rules, broken


def run(ctx: RunContext) -> dict[str, Any]:
    options = ctx.options
    templates = [re.compile(p, re.IGNORECASE) for p in options["template_titles"]]
    validate_rules, broken = load_validate_rules(ctx.engine)
    rule = ctx.config.config.get("llm_check_rule")
    model = ctx.get_engine(SPEC) if ctx.config.engine_name else None
    ctx.result.update(validate_rules=len(validate_rules), model_check=rule["name"] if (rule and model) else None)
    if broken:
        ctx.result["broken_rules"] = broken
    threshold = float(ctx.config.engine_options.get("threshold", 0.5)) if model else None
    field = (rule or {}).get("field") or "title"
    hypothesis = (rule or {}).get("prompt") or "This description contains an error."

    for batch in pending_batches(ctx, QUEUE, COLUMNS):
        model_scores: dict[int, tuple[float | None, str | None]] = {}
        if model is not None:
            premises = [(row.text if field == "text" else getattr(row, field, None)) or "" for row in batch]
            model_scores = dict(zip((r.id for r in batch),
                                    per_unit(premises, lambda p: model.entailment(p, hypothesis))))
        stamps, updates, reviews = [], [], []
        for row in batch:
            score, error = model_scores.get(row.id, (None, None))
            if error is not None:
                stamps.append((row.id, row.stamp, ERROR, error))
                continue
            reasons = rule_checks(row, options, templates, validate_rules)
            if score is not None and score >= threshold:
                reasons.append(_reason("model_check", f"the model check {rule['name']!r} flagged it",
                                       rule=rule["name"], score=round(score, 4)))
            stamps.append((row.id, row.stamp, DONE, None))
            updates.append({"id": row.id, "anomaly": bool(reasons), "reasons": reasons})
            if reasons:
                reviews.append({"id": row.id, "reason": "quality: " + ", ".join(sorted({r["code"] for r in reasons})),
                                "details": {"reasons": reasons}})

        def write(conn: Connection, stamped: set[int]) -> dict[str, int]:
            rows = [u for u in updates if u["id"] in stamped]
            if rows:
                conn.execute(_UPDATE, {"rows": json.dumps(rows, default=str)})
            flagged = [r for r in reviews if r["id"] in stamped]
            if flagged:
                conn.execute(_REVIEW, {"run_id": str(ctx.run_id), "rows": json.dumps(flagged, default=str)})
            return {"anomalies": len(flagged)}

        commit_batch(ctx, QUEUE, len(batch), stamps, write)
    return ctx.result


SPEC = WorkerSpec(
    name="quality-validator",
    label="Quality validator",
    description="Rule checks (empty, all-caps, duplicate or placeholder titles, missing or future dates, "
                "no entities or typology, VALIDATE rules) and the active LLM_CHECK rule's model check; "
                "flags anomalies and sends them to the review queue.",
    run=run,
    unit="document",
    governed=True,
    engine_source="llm_check_rule",
    stamp_key=QUEUE.key,
    default_batch_size=64,
    options={
        "check_entities": OptionSpec("bool", True, "flag documents in which ner found no entity"),
        "check_typology": OptionSpec("bool", True, "flag documents to which typology assigned nothing"),
        "min_caps_letters": OptionSpec("int", 4, "letters from which an all-capitals title is flagged", minimum=1),
        "template_titles": OptionSpec("list", DEFAULT_TEMPLATES, "regular expressions of placeholder titles"),
    },
    engines={NLI_CHECK.name: NLI_CHECK},
    default_engine=None,
    requires=(),
    queue=QUEUE,
)
