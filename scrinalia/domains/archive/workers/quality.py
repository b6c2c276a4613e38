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
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from sqlalchemy import Connection, text

from scrinalia.domains.archive.workers.base import Stamp, commit_batch, pending_batches, per_unit
from scrinalia.domains.archive.workers.engines.nli import nli_engine
from scrinalia.domains.archive.workers.sdk import OptionSpec, RunContext, WorkerSpec
from scrinalia.domains.archive.workers.stamps import (
    CLEANABLE_FIELDS,
    COMPOSED_TEXT_SQL,
    DONE,
    ERROR,
    PENDING_QUALITY_SQL,
    QUALITY_STAMP_SQL,
    StampQueue,
)

QUEUE = StampQueue(key="quality-validator", stamp_sql=QUALITY_STAMP_SQL, governed=True, pending_sql=PENDING_QUALITY_SQL)
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


def _all_capitals(title: str, min_caps_letters: int) -> bool:
    letters = [c for c in title if c.isalpha()]
    return len(letters) >= min_caps_letters and all(c.isupper() for c in letters)


def _repeats_a_word(title: str) -> bool:
    words = re.findall(r"\w+", title.casefold())
    return any(a == b and len(a) > 1 for a, b in zip(words, words[1:], strict=False))


def title_checks(title: str, templates: list[re.Pattern[str]], min_caps_letters: int) -> list[dict[str, Any]]:
    stripped = (title or "").strip()
    if not stripped:
        return [_reason("title_empty", "the title is empty")]
    checks = (
        ("title_all_caps", "the title is written in capitals only", _all_capitals(stripped, min_caps_letters)),
        ("title_repeated_words", "the title repeats a word", _repeats_a_word(stripped)),
        ("title_template", "the title is a placeholder, not a description",
         any(p.search(stripped) for p in templates)),
    )
    return [_reason(code, message) for code, message, found in checks if found]


def _record_checks(row: Any, options: dict[str, Any]) -> list[dict[str, Any]]:
    """The checks of the fetched row's other columns (dates, duplicates, the other workers' results)."""
    undated = row.date_start is None and row.date_end is None and not (row.date_text or "").strip()
    checks = (
        ("title_duplicate", "another document has the same title", bool(row.title_duplicate)),
        ("date_missing", "the document has no date", undated),
        ("date_future", "the document is dated in the future", bool(row.date_future)),
        ("no_entities", "no named entity was found",
         options["check_entities"] and row.ner_ran and not row.has_entities),
        ("no_typology", "no typology was assigned",
         options["check_typology"] and row.typology_ran and not row.has_typology),
    )
    return [_reason(code, message) for code, message, found in checks if found]


def rule_checks(row: Any, options: dict[str, Any], templates: list[re.Pattern[str]],
                validate_rules: list[dict[str, Any]]) -> list[dict[str, Any]]:
    reasons = title_checks(row.title, templates, options["min_caps_letters"]) + _record_checks(row, options)
    for rule in validate_rules:
        if rule["regex"].search(getattr(row, rule["field"], None) or ""):
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


@dataclass(frozen=True)
class ModelCheck:
    """The active LLM_CHECK rule's model check: the rule, its engine, the score from which it flags."""

    rule: dict[str, Any]
    model: Any
    threshold: float
    field: str
    hypothesis: str

    def scores(self, batch: list[Any]) -> dict[int, tuple[float | None, str | None]]:
        """Each document's entailment score (or the error that stopped it), by document id."""
        premises = [(row.text if self.field == "text" else getattr(row, self.field, None)) or "" for row in batch]
        scored = per_unit(premises, lambda p: self.model.entailment(p, self.hypothesis))
        return dict(zip((r.id for r in batch), scored, strict=True))

    def reason(self, score: float | None) -> dict[str, Any] | None:
        if score is None or score < self.threshold:
            return None
        return _reason("model_check", f"the model check {self.rule['name']!r} flagged it",
                       rule=self.rule["name"], score=round(score, 4))


def model_check(ctx: RunContext) -> ModelCheck | None:
    """The run's model check, or None when no LLM_CHECK rule resolved to an engine."""
    rule = ctx.config.config.get("llm_check_rule")
    if not ctx.config.engine_name or not rule:
        return None
    model = ctx.get_engine(SPEC)
    return ModelCheck(rule=rule, model=model, threshold=float(ctx.config.engine_options.get("threshold", 0.5)),
                      field=rule.get("field") or "title",
                      hypothesis=rule.get("prompt") or "This description contains an error.")


@dataclass
class Findings:
    """One batch's stamps, anomaly flags and review-queue entries."""

    stamps: list[Stamp] = field(default_factory=list)
    updates: list[dict[str, Any]] = field(default_factory=list)
    reviews: list[dict[str, Any]] = field(default_factory=list)

    def add(self, row: Any, reasons: list[dict[str, Any]]) -> None:
        self.stamps.append((row.id, row.stamp, DONE, None))
        self.updates.append({"id": row.id, "anomaly": bool(reasons), "reasons": reasons})
        if reasons:
            self.reviews.append({"id": row.id, "reason": "quality: " + ", ".join(sorted({r["code"] for r in reasons})),
                                 "details": {"reasons": reasons}})


def write_findings(findings: Findings, run_id: Any, conn: Connection, stamped: set[int]) -> dict[str, int]:
    """The batch's flags and reviews, for the documents actually stamped. Bound with ``partial``: a
    function of the batch it is given, not a closure over the loop's variables."""
    rows = [u for u in findings.updates if u["id"] in stamped]
    if rows:
        conn.execute(_UPDATE, {"rows": json.dumps(rows, default=str)})
    flagged = [r for r in findings.reviews if r["id"] in stamped]
    if flagged:
        conn.execute(_REVIEW, {"run_id": str(run_id), "rows": json.dumps(flagged, default=str)})
    return {"anomalies": len(flagged)}


def run(ctx: RunContext) -> dict[str, Any]:
    options = ctx.options
    templates = [re.compile(p, re.IGNORECASE) for p in options["template_titles"]]
    validate_rules, broken = load_validate_rules(ctx.engine)
    check = model_check(ctx)
    ctx.result.update(validate_rules=len(validate_rules), model_check=check.rule["name"] if check else None)
    if broken:
        ctx.result["broken_rules"] = broken
    for batch in pending_batches(ctx, QUEUE, COLUMNS):
        model_scores = check.scores(batch) if check else {}
        findings = Findings()
        for row in batch:
            score, error = model_scores.get(row.id, (None, None))
            if error is not None:
                findings.stamps.append((row.id, row.stamp, ERROR, error))
                continue
            reasons = rule_checks(row, options, templates, validate_rules)
            flagged = check.reason(score) if check else None
            findings.add(row, reasons + [flagged] if flagged else reasons)
        commit_batch(ctx, QUEUE, len(batch), findings.stamps, partial(write_findings, findings, ctx.run_id))
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
