"""What a running run's writes leave behind while something pins the xmin horizon (issue 29; a nightly
pg_dump, an analyst's REPEATABLE READ session): every UPDATE writes a whole new version of the row, and
no version written after the pinned snapshot can be removed. The resolved configuration (decision 0090,
~1 KB for the embedding worker) is written once by ``record_start``; the heartbeat and the progress, which
rewrite the run's row all its life, must not copy it (decision 0394)."""
from __future__ import annotations

import json
import uuid

from sqlalchemy import Engine, text

from scrinalia.api import views
from scrinalia.domains.archive import ledger
from scrinalia.domains.archive.ledger import StartParams
from tests.ledger.helpers import register_runner

#: Shaped like the embedding worker's resolution: under PostgreSQL's ~2 KB TOAST threshold, so stored
#: inline in whichever row holds it, as the real one is.
CONFIG = {"worker": "embedding", "engine": "transformers", "model_dir": "/models/" + "m" * 60,
          "engine_options": {"device": "auto", "dtype": "auto", "batch_size": 32, "max_length": 256},
          "sources": {f"engine_options.option_{i}": "default" for i in range(30)}}
OPTIONS = {"db_batch_size": 64, "engine_options": {"note": "o" * 120}}
BEATS = 20


def _dead_bytes(engine: Engine) -> int:
    """The runs table's dead tuples, after a VACUUM that removes every one it may."""
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("CREATE EXTENSION IF NOT EXISTS pgstattuple"))
        conn.execute(text("VACUUM archive_worker_runs"))
        return int(conn.execute(text("SELECT dead_tuple_len FROM pgstattuple('archive_worker_runs')")).scalar_one())


def _running(engine: Engine) -> tuple[uuid.UUID, ledger.WorkerRun]:
    worker = f"width-{uuid.uuid4().hex[:6]}"
    runner_id = register_runner(engine, [worker])
    ledger.enqueue(engine, worker, {})
    run = ledger.claim_next(engine, runner_id, [worker], 60)
    assert run is not None
    return runner_id, run


def test_a_heartbeat_under_a_pinned_horizon_does_not_copy_the_resolved_configuration(engine):
    assert 900 < len(json.dumps(CONFIG)) < 1800
    runner_id, run = _running(engine)
    assert ledger.record_start(engine, run.run_id, runner_id, StartParams("transformers", None, CONFIG, OPTIONS))
    before = _dead_bytes(engine)
    with engine.connect() as pin:
        pin.execution_options(isolation_level="REPEATABLE READ")
        pin.execute(text("SELECT count(*) FROM archive_worker_runs")).scalar_one()  # the snapshot is taken
        for beat in range(BEATS):
            ledger.heartbeat(engine, runner_id, 60, progress={run.run_id: {"done": beat, "total": BEATS}})
        after = _dead_bytes(engine)
        pin.rollback()
    per_beat = (after - before) / BEATS
    # The run's row without its configuration: ~230 B a version (it was ~1,500 B with it).
    assert per_beat < 500, per_beat
    seen = ledger.get_run(engine, run.run_id)
    assert seen is not None and (seen.engine_name, seen.config, seen.options) == ("transformers", CONFIG, OPTIONS)


def test_record_start_twice_keeps_the_first_configuration_and_still_holds_the_run(engine):
    """A statement retried after its COMMIT's answer was lost finds its configuration already recorded."""
    runner_id, run = _running(engine)
    assert ledger.record_start(engine, run.run_id, runner_id, StartParams("transformers", None, CONFIG, OPTIONS))
    assert ledger.record_start(engine, run.run_id, runner_id, StartParams("transformers", None, CONFIG, OPTIONS))
    assert not ledger.record_start(engine, run.run_id, uuid.uuid4(), StartParams("x", None, {"x": 1}, None))
    seen = ledger.get_run(engine, run.run_id)
    assert seen is not None and seen.config == CONFIG


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
