"""``typology``: zero-shot classification of each title against the active typologies.

Two engines: ``embedding-similarity`` (the default: the title against each typology's name and
description, embedded with the bundled all-MiniLM-L6-v2, so it runs with no extra model) and
``transformers-zero-shot`` (a local NLI model, chosen in the worker's settings). A typology is linked
when its score reaches ``threshold`` (0.40 by default); both engines' scores sum to 1 over the typologies
unless ``multi_label``. The document's previous
typology links are replaced. Stamp: md5 of the title (an edited title is re-classified); a run with no
active typology stamps nothing (adding typologies later must find the documents still pending).
Governed.
"""
from __future__ import annotations

from functools import partial
from typing import Any

from sqlalchemy import Connection, text

from scrinalia.domains.archive.workers.base import Stamp, columns, commit_batch, pending_batches, per_unit
from scrinalia.domains.archive.workers.engines.embedding import SIMILARITY
from scrinalia.domains.archive.workers.engines.nli import ZERO_SHOT
from scrinalia.domains.archive.workers.sdk import OptionSpec, RunContext, WorkerSpec
from scrinalia.domains.archive.workers.stamps import DONE, ERROR, PENDING_TYPOLOGY_SQL, TITLE_STAMP_SQL, StampQueue

QUEUE = StampQueue(key="typology", stamp_sql=TITLE_STAMP_SQL, governed=True, pending_sql=PENDING_TYPOLOGY_SQL)
THRESHOLD = 0.40

_DELETE = text("DELETE FROM archive_document_typologies WHERE document_id = ANY(CAST(:ids AS bigint[]))")
_INSERT = text(
    """
    INSERT INTO archive_document_typologies (document_id, typology_id, score, run_id)
    SELECT d, t, s, CAST(:run_id AS uuid)
      FROM unnest(CAST(:docs AS bigint[]), CAST(:typologies AS bigint[]), CAST(:scores AS float8[])) AS v(d, t, s)
    """
)


def select_labels(scores: dict[str, float], threshold: float) -> dict[str, float]:
    return {label: score for label, score in scores.items() if score >= threshold}


def run(ctx: RunContext) -> dict[str, Any]:
    options = ctx.options
    if "{}" not in options["hypothesis_template"]:
        raise ValueError("options.hypothesis_template must contain {} (where the typology goes)")
    with ctx.engine.connect() as conn:
        rows = conn.execute(text("SELECT id, name, description FROM archive_typologies WHERE active ORDER BY id")).all()
    typologies = {r.name: r.id for r in rows}
    descriptions = {r.name: r.description for r in rows}
    ctx.result["typologies"] = len(typologies)
    if not typologies:
        ctx.result["skipped"] = "no active typology: nothing stamped"
        return ctx.result
    model = ctx.get_engine(SPEC)
    ctx.result["model"] = model.model_name
    labels = list(typologies)

    def classify(titles: list[str]) -> list[dict[str, float]]:
        return model.classify(titles, labels, options["hypothesis_template"], options["multi_label"],
                              descriptions=descriptions)

    for batch in pending_batches(ctx, QUEUE, "d.title"):
        todo = [r for r in batch if r.title.strip()]
        classified = per_unit([r.title for r in todo], classify)
        scored = dict(zip((r.id for r in todo), classified, strict=True))
        stamps, links = judge_batch(batch, scored, typologies, options["threshold"])
        commit_batch(ctx, QUEUE, len(batch), stamps, partial(write_links, stamps, links, ctx.run_id))
    return ctx.result


def judge_batch(batch: list[Any], scored: dict[int, tuple[dict[str, float] | None, str | None]],
                typologies: dict[str, int], threshold: float) -> tuple[list[Stamp], list[tuple[int, int, float]]]:
    """Each document's stamp (an empty title is DONE with no link) and its (document, typology, score)
    links above ``threshold``."""
    stamps: list[Stamp] = []
    links: list[tuple[int, int, float]] = []
    for row in batch:
        scores, error = scored.get(row.id, ({}, None))
        stamps.append((row.id, row.stamp, ERROR if error else DONE, error))
        if error is None:
            links += [(row.id, typologies[label], score)
                      for label, score in select_labels(scores or {}, threshold).items()]
    return stamps, links


def write_links(stamps: list[Stamp], links: list[tuple[int, int, float]], run_id: Any, conn: Connection,
                stamped: set[int]) -> dict[str, int]:
    """The batch's typology links, for the documents actually stamped: a DONE document's old links are
    replaced. Bound with ``partial``: a function of the batch it is given, not of the loop's variables."""
    ok = [s[0] for s in stamps if s[0] in stamped and s[2] == DONE]
    if ok:
        conn.execute(_DELETE, {"ids": ok})
    keep = [link for link in links if link[0] in stamped]
    if keep:
        docs, typology_ids, scores = columns(keep, 3)
        conn.execute(_INSERT, {"run_id": str(run_id), "docs": docs, "typologies": typology_ids, "scores": scores})
    return {"links": len(keep)}


SPEC = WorkerSpec(
    name="typology",
    label="Typology",
    description="Zero-shot classification of each title against the active typologies (by embedding "
                "similarity with the bundled model, or with a local NLI model set in its settings); a "
                "typology is linked when its score reaches the threshold (0.40).",
    run=run,
    unit="document",
    governed=True,
    engine_source="settings",
    stamp_key=QUEUE.key,
    default_batch_size=32,
    options={
        "threshold": OptionSpec("float", THRESHOLD, "minimum score of a linked typology", minimum=0.0, maximum=1.0),
        "hypothesis_template": OptionSpec("str", "This document is {}.", "the NLI hypothesis; {} is the typology"),
        "multi_label": OptionSpec("bool", False, "score each typology on its own instead of a softmax over them"),
    },
    engines={SIMILARITY.name: SIMILARITY, ZERO_SHOT.name: ZERO_SHOT},
    default_engine=SIMILARITY.name,
    requires=("torch", "transformers"),
    queue=QUEUE,
)
