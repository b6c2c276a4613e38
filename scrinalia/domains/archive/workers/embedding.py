"""``embedding``: mean-pooled, normalised sentence embeddings of each document's composed text.

Stamp: ``archive_text_stamp(...)`` = md5 of the composed text (title, scope and content, history,
provenance), computed by PostgreSQL. Editing any of those fields changes the expected stamp, so the
document is pending again by itself. Not governed: an embedding is a search aid, not curated data, so
HUMAN_APPROVED documents are embedded too.
"""
from __future__ import annotations

from functools import partial
from typing import Any

from sqlalchemy import Connection, func
from sqlalchemy.dialects.postgresql import insert as pg_insert

from scrinalia.db.tables import archive_document_embeddings
from scrinalia.domains.archive.workers.base import commit_batch, pending_batches, per_unit
from scrinalia.domains.archive.workers.engines.embedding import TRANSFORMERS
from scrinalia.domains.archive.workers.sdk import RunContext, WorkerSpec
from scrinalia.domains.archive.workers.stamps import (
    COMPOSED_TEXT_SQL,
    DONE,
    ERROR,
    PENDING_EMBEDDING_SQL,
    TEXT_STAMP_SQL,
    StampQueue,
)

QUEUE = StampQueue(key="embedding", stamp_sql=TEXT_STAMP_SQL, governed=False, pending_sql=PENDING_EMBEDDING_SQL)

_upsert = pg_insert(archive_document_embeddings)
UPSERT = _upsert.on_conflict_do_update(
    index_elements=[archive_document_embeddings.c.document_id],
    set_={**{c: _upsert.excluded[c] for c in ("model", "dimensions", "vector", "text_md5", "run_id")},
          "updated_at": func.now()},
)


def run(ctx: RunContext) -> dict[str, Any]:
    embedder = ctx.get_engine(SPEC)
    ctx.result.update(embedder.describe_loaded())
    for batch in pending_batches(ctx, QUEUE, f"{COMPOSED_TEXT_SQL.format(a='d')} AS text"):
        todo = [row for row in batch if row.text.strip()]
        vectors = dict(zip((r.id for r in todo), per_unit([r.text for r in todo], embedder.embed), strict=True))
        stamps, rows = [], []
        for row in batch:
            vector, error = vectors.get(row.id, (None, None))
            if row.id not in vectors:
                error = "EmptyText: the document has no text to embed"
            stamps.append((row.id, row.stamp, ERROR if error else DONE, error))
            if vector is not None:
                rows.append({"document_id": row.id, "model": embedder.model_name, "dimensions": len(vector),
                             "vector": vector, "text_md5": row.stamp, "run_id": ctx.run_id})

        commit_batch(ctx, QUEUE, len(batch), stamps, partial(write_embeddings, rows), empty=len(batch) - len(todo))
    return ctx.result


def write_embeddings(rows: list[dict[str, Any]], conn: Connection, stamped: set[int]) -> dict[str, int]:
    """The batch's vectors, for the documents actually stamped. A function of its arguments (bound with
    ``partial``), not a closure over the loop's variables: what it writes is the batch it was given."""
    keep = [r for r in rows if r["document_id"] in stamped]
    if keep:
        conn.execute(UPSERT, keep)
    return {"embedded": len(keep)}


SPEC = WorkerSpec(
    name="embedding",
    label="Embeddings",
    description="Mean-pooled, normalised sentence embeddings of each document's composed text "
                "(title, scope and content, history, provenance).",
    run=run,
    unit="document",
    governed=False,
    engine_source="settings",
    stamp_key=QUEUE.key,
    default_batch_size=128,
    engines={TRANSFORMERS.name: TRANSFORMERS},
    default_engine=TRANSFORMERS.name,
    requires=("torch", "transformers"),
    queue=QUEUE,
)
