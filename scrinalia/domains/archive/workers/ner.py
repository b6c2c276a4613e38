"""``ner``: named entities (PER, ORG, LOC, MISC) with a token-classification model from a local directory.

Each document's entities replace its previous links; entities are upserted by (label, normalised name).
Stopwords (``archive_entity_stopwords``: never an entity, whatever the label) and exclusions
(``archive_entity_exclusions``: a term, for one label or for all when the label is null) are honoured.
Stamp: md5 of the composed text (an edited text is re-analysed). Governed.
"""
from __future__ import annotations

import re
import unicodedata
from functools import partial
from typing import Any

from sqlalchemy import Connection, text

from scrinalia.db.tables import ENTITY_LABELS
from scrinalia.domains.archive.workers.base import columns, commit_batch, pending_batches, per_unit
from scrinalia.domains.archive.workers.engines.token_classification import TOKEN_CLASSIFICATION
from scrinalia.domains.archive.workers.sdk import OptionSpec, RunContext, WorkerSpec
from scrinalia.domains.archive.workers.stamps import (
    COMPOSED_TEXT_SQL,
    DONE,
    ERROR,
    PENDING_NER_SQL,
    TEXT_STAMP_SQL,
    StampQueue,
)

QUEUE = StampQueue(key="ner", stamp_sql=TEXT_STAMP_SQL, governed=True, pending_sql=PENDING_NER_SQL)

_EDGE_PUNCT = re.compile(r"^[\W_]+|[\W_]+$", re.UNICODE)


def normalize_name(name: str) -> str:
    """Case-folded, NFKC, whitespace collapsed, punctuation trimmed at both ends."""
    collapsed = " ".join(unicodedata.normalize("NFKC", name).split())
    return _EDGE_PUNCT.sub("", collapsed).casefold()


def display_name(name: str) -> str:
    return _EDGE_PUNCT.sub("", " ".join(name.split()))


_UPSERT_ENTITIES = text(
    """
    INSERT INTO archive_entities (label, name, normalized_name)
    SELECT * FROM unnest(CAST(:labels AS text[]), CAST(:names AS text[]), CAST(:norms AS text[]))
    ON CONFLICT (label, normalized_name) DO NOTHING
    """
)
_ENTITY_IDS = text(
    """
    SELECT e.id, e.label, e.normalized_name FROM archive_entities e
      JOIN unnest(CAST(:labels AS text[]), CAST(:norms AS text[])) AS k(label, norm)
        ON e.label = k.label AND e.normalized_name = k.norm
    """
)
_DELETE_LINKS = text("DELETE FROM archive_document_entities WHERE document_id = ANY(CAST(:ids AS bigint[]))")
_INSERT_LINKS = text(
    """
    INSERT INTO archive_document_entities (document_id, entity_id, score, mentions, run_id)
    SELECT d, e, s, m, CAST(:run_id AS uuid)
      FROM unnest(CAST(:docs AS bigint[]), CAST(:entities AS bigint[]), CAST(:scores AS float8[]),
                  CAST(:mentions AS int[])) AS v(d, e, s, m)
    """
)


def load_filters(engine) -> tuple[set[str], set[tuple[str | None, str]]]:
    with engine.connect() as conn:
        stop = {normalize_name(t) for t in conn.execute(text("SELECT term FROM archive_entity_stopwords")).scalars()}
        excl = {(label.upper() if label else None, normalize_name(term))
                for label, term in conn.execute(text("SELECT label, term FROM archive_entity_exclusions")).all()}
    return stop, excl


def aggregate(entities: list[dict[str, Any]], *, min_score: float, min_length: int, labels: set[str],
              stopwords: set[str], exclusions: set[tuple[str | None, str]]) -> dict[tuple[str, str], dict[str, Any]]:
    """(label, normalised name) -> {name, score (max), mentions}, after the filters."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for ent in entities:
        label, norm = ent["label"], normalize_name(ent["text"])
        if label not in labels or ent["score"] < min_score or len(norm) < min_length:
            continue
        if norm in stopwords or (None, norm) in exclusions or (label, norm) in exclusions:
            continue
        slot = out.setdefault((label, norm), {"name": display_name(ent["text"]), "score": 0.0, "mentions": 0})
        slot["score"] = max(slot["score"], ent["score"])
        slot["mentions"] += 1
    return out


def run(ctx: RunContext) -> dict[str, Any]:
    model = ctx.get_engine(SPEC)
    options = ctx.options
    labels = {str(label).upper() for label in options["labels"]}
    stopwords, exclusions = load_filters(ctx.engine)
    ctx.result.update(model=model.model_name, stopwords=len(stopwords), exclusions=len(exclusions))
    for batch in pending_batches(ctx, QUEUE, f"{COMPOSED_TEXT_SQL.format(a='d')} AS text"):
        results = per_unit([r.text for r in batch], model.extract)
        found: dict[int, dict[tuple[str, str], dict[str, Any]]] = {}
        stamps = []
        for row, (entities, error) in zip(batch, results, strict=True):
            stamps.append((row.id, row.stamp, ERROR if error else DONE, error))
            if error is None:
                found[row.id] = aggregate(entities or [], min_score=options["min_score"],
                                          min_length=options["min_length"], labels=labels,
                                          stopwords=stopwords, exclusions=exclusions)

        commit_batch(ctx, QUEUE, len(batch), stamps, partial(write_links, found, ctx.run_id))
    return ctx.result


def write_links(found: dict[int, dict[tuple[str, str], dict[str, Any]]], run_id: Any, conn: Connection,
                stamped: set[int]) -> dict[str, int]:
    """The batch's entities and links, for the documents actually stamped (bound with ``partial``: a
    function of the batch it is given, never of the loop's later variables)."""
    docs = [d for d in found if d in stamped]
    if not docs:
        return {"links": 0}
    conn.execute(_DELETE_LINKS, {"ids": docs})
    unique = {key: v["name"] for d in docs for key, v in found[d].items()}
    if not unique:
        return {"links": 0}
    ids = _entity_ids(conn, unique)
    links = [(d, ids[key], v["score"], v["mentions"]) for d in docs for key, v in found[d].items()]
    doc_ids, entities, scores, mentions = columns(links, 4)
    conn.execute(_INSERT_LINKS, {"run_id": str(run_id), "docs": doc_ids, "entities": entities, "scores": scores,
                                 "mentions": mentions})
    return {"links": len(links)}


def _entity_ids(conn: Connection, names: dict[tuple[str, str], str]) -> dict[tuple[str, str], int]:
    """Upsert the batch's entities (``names``: display name by (label, normalized name)); their ids."""
    keys = sorted(names)
    labels, norms = [k[0] for k in keys], [k[1] for k in keys]
    conn.execute(_UPSERT_ENTITIES, {"labels": labels, "names": [names[k] for k in keys], "norms": norms})
    rows = conn.execute(_ENTITY_IDS, {"labels": labels, "norms": norms})
    return {(r.label, r.normalized_name): r.id for r in rows}


SPEC = WorkerSpec(
    name="ner",
    label="Named entities",
    description="Persons, organisations, places and other names found in each document's text "
                "(token classification with aggregation); honours stopwords and exclusions.",
    run=run,
    unit="document",
    governed=True,
    engine_source="settings",
    stamp_key=QUEUE.key,
    default_batch_size=32,
    options={
        "min_score": OptionSpec("float", 0.5, "entities scored below this are dropped", minimum=0.0, maximum=1.0),
        "min_length": OptionSpec("int", 2, "entities whose normalised name is shorter are dropped", minimum=1),
        "labels": OptionSpec("list", list(ENTITY_LABELS), "labels kept (subset of PER, ORG, LOC, MISC)"),
    },
    engines={TOKEN_CLASSIFICATION.name: TOKEN_CLASSIFICATION},
    default_engine=TOKEN_CLASSIFICATION.name,
    requires=("torch", "transformers"),
    queue=QUEUE,
)
