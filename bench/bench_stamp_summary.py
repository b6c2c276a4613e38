"""What the queue-count triggers (migration 0010) cost the writes that fire them.

On 100,000 documents seeded as ``bench_api.py`` seeds them (backlogs per worker), each write is timed
with the four triggers of ``archive_documents`` enabled and disabled (``ALTER TABLE ... DISABLE
TRIGGER``), interleaved so the machine's load falls on both sides alike:

* an import of N documents through ``importer.import_records`` (one transaction, one INSERT);
* a worker's batch: 128 pending documents of the embedding queue stamped by ``StampQueue.write_stamps``
  in its own transaction (the statement a worker commits per batch; its vectors and lease fence are
  other statements the triggers do not touch);
* a one-document write (the cleaning worker writes one statement per document): one ner stamp.

Per write: client wall time (statement + commit, fsync on) and WAL bytes (``pg_current_wal_lsn()``
delta). At the end the summary is rebuilt (``archive_stamp_counts_recompute()``) and checked against
the live counts. Run:
    .venv/bin/python bench/bench_stamp_summary.py [--documents 100000] [--import-docs 10000] [--rounds 5]
        [--batches 30] [--singles 200]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sqlalchemy import text

from bench._pg import bench_database, percentile
from bench.bench_api import seed_documents
from scrinalia.db.engine import create_engine_from_url

TRIGGERS = ("archive_stamp_counts_insert", "archive_stamp_counts_update", "archive_stamp_counts_delete",
            "archive_stamp_counts_truncate")
_LSN = text("SELECT pg_current_wal_lsn()")
_LSN_DIFF = text("SELECT pg_wal_lsn_diff(CAST(:b AS pg_lsn), CAST(:a AS pg_lsn))")


def set_triggers(engine, on: bool) -> None:
    with engine.begin() as conn:
        for name in TRIGGERS:
            conn.execute(text(f"ALTER TABLE archive_documents {'ENABLE' if on else 'DISABLE'} TRIGGER {name}"))


def seed(engine, n_docs: int) -> float:
    t0 = time.perf_counter()
    with engine.begin() as conn:
        seed_documents(conn, n_docs)
    seconds = time.perf_counter() - t0
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE"))
    return seconds


class Meter:
    """Wall ms and WAL bytes of one write."""

    def __init__(self, engine) -> None:
        self.engine = engine

    def __enter__(self) -> Meter:
        with self.engine.connect() as conn:
            self.lsn = conn.execute(_LSN).scalar_one()
        self.t = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        self.ms = (time.perf_counter() - self.t) * 1000
        with self.engine.connect() as conn:
            end = conn.execute(_LSN).scalar_one()
            self.wal = int(conn.execute(_LSN_DIFF, {"a": str(self.lsn), "b": str(end)}).scalar_one())


def _records(n: int, round_: int) -> list[tuple[int, dict, None]]:
    statuses = ("DRAFT", "PUBLISHED", "NEEDS_REVIEW", "HUMAN_APPROVED")
    return [(i + 1, {"reference_code": f"IMP/{round_}/{i}", "title": f"Carta {i} da remessa {round_}",
                     "scope_and_content": f"Ambito e conteudo {i}. " * 6, "provenance": f"Proveniencia {i % 50}",
                     "date_text": str(1700 + i % 200), "status": statuses[i % 4]}, None) for i in range(n)]


def bench_import(engine, n: int, rounds: int) -> dict[str, list[tuple[float, int]]]:
    from scrinalia.domains.archive.importer import import_records

    out: dict[str, list[tuple[float, int]]] = {"on": [], "off": []}
    for r in range(rounds):
        for side in (("on", "off") if r % 2 == 0 else ("off", "on")):
            set_triggers(engine, side == "on")
            records = _records(n, r * 2 + (side == "on"))
            with Meter(engine) as m:
                assert import_records(engine, records).inserted == n
            out[side].append((m.ms, m.wal))
            with engine.begin() as conn:  # untimed, with the same triggers
                conn.execute(text("DELETE FROM archive_documents WHERE reference_code LIKE 'IMP/%'"))
            with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                conn.execute(text("VACUUM archive_documents"))
    return out


def bench_batches(engine, key: str, size: int, count: int) -> dict[str, list[tuple[float, int]]]:
    from scrinalia.domains.archive.workers.plugins import load_catalogue

    queue = load_catalogue()[key].queue
    fetch = queue.fetch_sql("d.title")
    run_id = uuid.uuid4()
    out: dict[str, list[tuple[float, int]]] = {"on": [], "off": []}
    for i in range(count * 2):
        side = "on" if i % 2 == 0 else "off"
        set_triggers(engine, side == "on")
        with engine.connect() as conn:
            rows = conn.execute(fetch, {"after": 0, "limit": size}).all()
        assert len(rows) == size, f"the {key} backlog ran out"
        stamps = [(r.id, r.stamp, "DONE", None) for r in rows]
        with Meter(engine) as m, engine.begin() as conn:
            assert len(queue.write_stamps(conn, run_id, stamps)) == size
        out[side].append((m.ms, m.wal))
    return out


def stats(samples: list[tuple[float, int]]) -> dict[str, float]:
    ms = [s[0] for s in samples]
    wal = [float(s[1]) for s in samples]
    return {"p50_ms": round(percentile(ms, 0.5), 2), "p95_ms": round(percentile(ms, 0.95), 2),
            "wal_p50_bytes": round(percentile(wal, 0.5))}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--documents", type=int, default=100_000)
    parser.add_argument("--import-docs", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batches", type=int, default=30)
    parser.add_argument("--singles", type=int, default=200)
    args = parser.parse_args()

    from scrinalia.api.catalogue_view import live_unit_counts, unit_counts
    from scrinalia.domains.archive.workers import stamp_summary
    from scrinalia.domains.archive.workers.plugins import load_catalogue

    with bench_database("bench_summary") as url:
        engine = create_engine_from_url(url, pool_size=5, max_overflow=5)
        seed_s = seed(engine, args.documents)
        imports = bench_import(engine, args.import_docs, args.rounds)
        batches = bench_batches(engine, "embedding", 128, args.batches)
        singles = bench_batches(engine, "ner", 1, args.singles)
        set_triggers(engine, True)
        t = time.perf_counter()
        groups = stamp_summary.recompute(engine)
        recompute_ms = (time.perf_counter() - t) * 1000
        catalogue = load_catalogue()
        assert unit_counts(engine, catalogue) == live_unit_counts(engine, catalogue)
        engine.dispose()

    def side_by_side(samples: dict[str, list[tuple[float, int]]]) -> dict[str, object]:
        on, off = stats(samples["on"]), stats(samples["off"])
        return {"triggers_on": on, "triggers_off": off,
                "added_p50_ms": round(on["p50_ms"] - off["p50_ms"], 2),
                "ratio_p50": round(on["p50_ms"] / off["p50_ms"], 3) if off["p50_ms"] else None,
                "added_wal_bytes": on["wal_p50_bytes"] - off["wal_p50_bytes"]}

    print(json.dumps({
        "documents": args.documents, "seed_seconds_with_triggers": round(seed_s, 1),
        f"import_{args.import_docs}_documents": side_by_side(imports),
        "worker_batch_128_stamps": side_by_side(batches),
        "one_document_stamp": side_by_side(singles),
        "recompute_ms": round(recompute_ms, 1), "summary_groups": groups,
    }, indent=2))


if __name__ == "__main__":
    main()
