"""What the heartbeat leaves behind while something pins the xmin horizon (issue 29; a nightly pg_dump, an
analyst's REPEATABLE READ session): every UPDATE writes a whole new version of the row, and no version
written after the pinned snapshot can be removed. So the two rows the heartbeat rewrites must not copy
what does not change: the run's resolved configuration (decision 0090, ~1 KB for the embedding worker,
written once by ``record_start``: decision 0394), and what a runner reports of its host (its devices, the
model directories it sees, its warm models: ~900 B on a GPU host, decision 0395)."""
from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from typing import Any

from sqlalchemy import Engine, text

from scrinalia.api import views
from scrinalia.domains.archive import ledger, registry
from scrinalia.domains.archive.ledger import StartParams
from tests.ledger.helpers import register_runner

#: Shaped like the embedding worker's resolution: under PostgreSQL's ~2 KB TOAST threshold, so stored
#: inline in whichever row holds it, as the real one is.
CONFIG = {"worker": "embedding", "engine": "transformers", "model_dir": "/models/" + "m" * 60,
          "engine_options": {"device": "auto", "dtype": "auto", "batch_size": 32, "max_length": 256},
          "sources": {f"engine_options.option_{i}": "default" for i in range(30)}}
OPTIONS = {"db_batch_size": 64, "engine_options": {"note": "o" * 120}}
BEATS = 20


def _dead_bytes(engine: Engine, table: str = "archive_worker_runs") -> int:
    """A table's dead tuples, after a VACUUM that removes every one it may."""
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("CREATE EXTENSION IF NOT EXISTS pgstattuple"))
        conn.execute(text(f"VACUUM {table}"))
        return int(conn.execute(text("SELECT dead_tuple_len FROM pgstattuple(:t)"), {"t": table}).scalar_one())


def _pinned_beats(engine: Engine, table: str, beat: Callable[[int], object]) -> float:
    """The dead bytes per heartbeat that ``table`` keeps for a REPEATABLE READ snapshot held over ``BEATS``."""
    before = _dead_bytes(engine, table)
    with engine.connect() as pin:
        pin.execution_options(isolation_level="REPEATABLE READ")
        pin.execute(text("SELECT count(*) FROM archive_worker_runs")).scalar_one()  # the snapshot is taken
        for n in range(BEATS):
            beat(n)
        after = _dead_bytes(engine, table)
        pin.rollback()
    return (after - before) / BEATS


def _running(engine: Engine, **registration: Any) -> tuple[uuid.UUID, ledger.WorkerRun]:
    worker = f"width-{uuid.uuid4().hex[:6]}"
    runner_id = register_runner(engine, [worker], **registration)
    ledger.enqueue(engine, worker, {})
    run = ledger.claim_next(engine, runner_id, [worker], 60)
    assert run is not None
    return runner_id, run


def test_a_heartbeat_under_a_pinned_horizon_does_not_copy_the_resolved_configuration(engine):
    assert 900 < len(json.dumps(CONFIG)) < 1800
    runner_id, run = _running(engine)
    assert ledger.record_start(engine, run.run_id, runner_id, StartParams("transformers", None, CONFIG, OPTIONS))
    per_beat = _pinned_beats(engine, "archive_worker_runs", lambda n: ledger.heartbeat(
        engine, runner_id, 60, progress={run.run_id: {"done": n, "total": BEATS}}))
    # The run's row without its configuration: ~230 B a version (1,835 B with it, measured).
    assert per_beat < 500, per_beat
    seen = ledger.get_run(engine, run.run_id)
    assert seen is not None and (seen.engine_name, seen.config, seen.options) == ("transformers", CONFIG, OPTIONS)


def test_a_configuration_the_previous_release_wrote_into_the_run_row_is_read_as_it_was(engine):
    """The previous release's ``record_start`` writes the configuration into the run's row (and its
    runners run on this schema through an upgrade): every reader still finds it there."""
    runner_id, run = _running(engine)
    with engine.begin() as conn:
        conn.execute(text("UPDATE archive_worker_runs SET engine_name = 'transformers', preset = NULL, "
                          "config = CAST(:config AS jsonb), options = CAST(:options AS jsonb) WHERE run_id = :run_id"),
                     {"config": json.dumps(CONFIG), "options": json.dumps(OPTIONS), "run_id": run.run_id})
    seen = ledger.get_run(engine, run.run_id)
    assert seen is not None and (seen.config, seen.options) == (CONFIG, OPTIONS)
    listed, _ = views.list_runs(engine, worker=run.worker_name)
    assert [(r["config"], r["options"]) for r in listed] == [(CONFIG, OPTIONS)]


#: What a daemon on a GPU host reports (``runner.devices``, ``model_dirs.seen_model_dirs``, the fork server's
#: warm models): written at registration and when the warm models change, not at a heartbeat.
DEVICES = [{"index": 0, "uuid": "GPU-8f3c2a1e-5b7d-4c9a-a1e2-3f4b5c6d7e8f", "name": "NVIDIA H100 80GB HBM3",
            "memory_total_bytes": 85520809984, "driver": "550.54.15", "slots": 1}]
SEES = {"model_dirs": ["/srv/models/all-MiniLM-L6-v2", "/srv/models/nli-deberta-v3-base",
                       "/srv/models/ner-camembert-base"], "model_roots": ["/srv/models"]}
WARM = {"models": [{"model_class": "AutoModel", "model_dir": "/srv/models/all-MiniLM-L6-v2", "dtype": "float32",
                    "bytes": 90868224, "load_seconds": 1.42, "workers": ["embedding", "typology"]}],
        "bytes": 90868224, "limit_bytes": 4294967296, "errors": []}


def test_a_heartbeat_under_a_pinned_horizon_does_not_copy_what_the_runner_reports_of_its_host(engine):
    runner_id, run = _running(engine, devices=DEVICES, sees=SEES)
    ledger.heartbeat(engine, runner_id, 60, warm=WARM)

    def beat(n: int) -> None:  # the child's snapshot changes at every beat (its elapsed time, its memory)
        child = {"pid": 4242, "run_id": str(run.run_id), "worker": run.worker_name, "elapsed_seconds": n * 15.0,
                 "rss_bytes": 734003200 + n * 4096}
        ledger.heartbeat(engine, runner_id, 60, children=[child])

    per_beat = _pinned_beats(engine, "archive_worker_runners", beat)
    # The registry's row without its host's report: ~300 B a version here (1,020 B with it, measured).
    assert per_beat < 600, per_beat
    seen = registry.get_runner(engine, runner_id)
    assert seen is not None and (seen.devices, seen.sees, seen.warm) == (DEVICES, SEES, WARM)
