"""Configuration: precedence (explicit > persisted settings > signature default) and typed errors."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from sqlalchemy import text

from scrinalia.domains.archive.errors import InvalidRunRequest
from scrinalia.domains.archive.workers import embedding, gpu_probe, ner, quality, typology
from scrinalia.domains.archive.workers.catalogue import BUILTIN
from scrinalia.domains.archive.workers.plugins import load_catalogue
from scrinalia.domains.archive.workers.sdk import (
    InvalidOption,
    MissingOption,
    OptionSpec,
    RefusedOption,
    UnknownEngine,
    UnknownOption,
    UnknownPreset,
    WorkerConfigError,
    WorkerSpec,
)


def persist(engine, worker, **values):
    cols = ["worker_name", *values]
    params = {"worker_name": worker, **{k: json.dumps(v) if isinstance(v, dict) else v for k, v in values.items()}}
    vals = ", ".join(f"CAST(:{c} AS jsonb)" if c in ("options", "engine_options") else f":{c}" for c in cols)
    with engine.begin() as conn:
        conn.execute(text(f"INSERT INTO archive_worker_settings ({', '.join(cols)}) VALUES ({vals})"), params)


def test_the_catalogue_is_found_through_the_entry_points():
    catalogue = load_catalogue()
    assert set(catalogue) >= {"embedding", "ner", "typology", "quality-validator", "cleaning", "gpu-probe"}
    assert catalogue["embedding"] is embedding.SPEC
    # the built-in list (workers.catalogue) is what pyproject declares, the same objects
    assert {s.name for s in BUILTIN} == {"embedding", "ner", "typology", "quality-validator", "cleaning", "gpu-probe"}
    assert all(catalogue[s.name] is s for s in BUILTIN)
    for spec in catalogue.values():
        json.dumps(spec.signature())  # the panel's description is plain JSON


def test_defaults_then_persisted_then_explicit(engine):
    spec = embedding.SPEC
    default = spec.resolve(engine, {})
    assert (default.engine_name, default.preset, default.db_batch_size) == ("transformers", None, 128)
    assert default.engine_options["device"] == "auto" and default.engine_options["batch_size"] == 32
    assert default.config["model"] == "all-MiniLM-L6-v2"
    assert default.sources["db_batch_size"] == "default"

    persist(engine, "embedding", preset="cpu", db_batch_size=64, engine_options={"batch_size": 8, "max_length": 64})
    persisted = spec.resolve(engine, {})
    assert (persisted.preset, persisted.db_batch_size) == ("cpu", 64)
    assert persisted.engine_options | {} == {"model": None, "device": "cpu", "dtype": "float32", "batch_size": 8,
                                            "max_length": 64}
    assert persisted.sources["engine_options.batch_size"] == "persisted"
    assert persisted.config["settings_revision"] == 1

    explicit = spec.resolve(engine, {"preset": "cuda", "db_batch_size": 16, "engine_options": {"batch_size": 4}})
    assert (explicit.preset, explicit.db_batch_size) == ("cuda", 16)
    # the explicit preset beats the persisted preset, the explicit option beats the persisted one,
    # and a persisted option the request does not mention still applies
    assert explicit.engine_options["device"] == "cuda" and explicit.engine_options["dtype"] == "float16"
    assert explicit.engine_options["batch_size"] == 4 and explicit.engine_options["max_length"] == 64
    assert explicit.config["device"] == "cuda" and explicit.config["dtype"] == "float16"
    assert explicit.sources["engine_options.device"] == "explicit:preset"


def test_worker_options_precedence(engine):
    assert typology.SPEC.resolve(engine, {}).options["threshold"] == 0.40
    persist(engine, "typology", options={"threshold": 0.6, "multi_label": True})
    assert typology.SPEC.resolve(engine, {}).options["threshold"] == 0.6
    resolved = typology.SPEC.resolve(engine, {"options": {"threshold": 0.7}})
    assert resolved.options["threshold"] == 0.7 and resolved.options["multi_label"] is True
    assert resolved.sources["options.threshold"] == "explicit"
    assert resolved.sources["options.multi_label"] == "persisted"


@pytest.mark.parametrize(
    ("spec", "request_", "error", "field"),
    [
        (embedding.SPEC, {"engine_name": "onnx"}, UnknownEngine, "engine_name"),
        (embedding.SPEC, {"preset": "tpu"}, UnknownPreset, "preset"),
        (embedding.SPEC, {"engine_options": {"temperature": 1}}, UnknownOption, "engine_options.temperature"),
        (embedding.SPEC, {"engine_options": {"batch_size": "many"}}, InvalidOption, "engine_options.batch_size"),
        (embedding.SPEC, {"engine_options": {"batch_size": 0}}, InvalidOption, "engine_options.batch_size"),
        (embedding.SPEC, {"engine_options": {"device": "tpu"}}, InvalidOption, "engine_options.device"),
        (embedding.SPEC, {"options": {"anything": 1}}, UnknownOption, "options.anything"),
        (embedding.SPEC, {"options": {"config": {}}}, RefusedOption, "options.config"),
        (embedding.SPEC, {"engine_options": {"config": {}}}, RefusedOption, "engine_options.config"),
        (typology.SPEC, {"options": {"threshold": 1.5}}, InvalidOption, "options.threshold"),
        (typology.SPEC, {"options": {"multi_label": "perhaps"}}, InvalidOption, "options.multi_label"),
        # Strict JSON types (decision 0140): a string that looks like a number or a boolean is refused.
        (typology.SPEC, {"options": {"threshold": "0.7"}}, InvalidOption, "options.threshold"),
        (typology.SPEC, {"options": {"multi_label": "true"}}, InvalidOption, "options.multi_label"),
        (gpu_probe.SPEC, {"options": {"matmul_size": "64"}}, InvalidOption, "options.matmul_size"),
        (gpu_probe.SPEC, {"options": {"matmul_size": 64.0}}, InvalidOption, "options.matmul_size"),
        (gpu_probe.SPEC, {"engine_name": "transformers"}, UnknownEngine, "engine_name"),
        (gpu_probe.SPEC, {"engine_options": {"device": "cpu"}}, UnknownOption, "engine_options.device"),
        (quality.SPEC, {"engine_name": "nli-check"}, UnknownEngine, "engine_name"),
        (ner.SPEC, {"db_batch_size": 0}, InvalidRunRequest, "db_batch_size"),
        (ner.SPEC, {"bogus": 1}, InvalidRunRequest, "bogus"),
    ],
)
def test_typed_errors_name_the_field(engine, spec, request_, error, field):
    with pytest.raises(error) as caught:
        spec.resolve(engine, request_)
    assert caught.value.field == field
    assert isinstance(caught.value, InvalidRunRequest)  # the API answers all of them the same way
    assert field in str(caught.value)


def test_extra_options_only_where_accepted(engine):
    def run(ctx):
        return {}

    strict = WorkerSpec(name="strict", label="s", description="", run=run, options={"a": OptionSpec("int", 1)})
    loose = WorkerSpec(name="loose", label="l", description="", run=run, options={"a": OptionSpec("int", 1)},
                       accepts_extra_options=True)
    with pytest.raises(UnknownOption):
        strict.resolve(engine, {"options": {"b": 2}})
    assert loose.resolve(engine, {"options": {"b": 2}}).options == {"a": 1, "b": 2}
    with pytest.raises(RefusedOption):
        loose.resolve(engine, {"options": {"config": 2}})
    with pytest.raises(ValueError):
        WorkerSpec(name="bad", label="b", description="", run=run, options={"config": OptionSpec("int", 1)})


def test_persisted_options_of_another_engine_do_not_leak(engine):
    persist(engine, "embedding", engine_name="other-engine", engine_options={"weird": 1})
    with pytest.raises(UnknownEngine) as caught:  # the persisted engine itself is unknown: say where it is
        embedding.SPEC.resolve(engine, {})
    assert caught.value.field == "archive_worker_settings.engine_name"
    resolved = embedding.SPEC.resolve(engine, {"engine_name": "transformers"})
    assert "weird" not in resolved.engine_options


def test_quality_engine_comes_from_the_active_llm_check_rule_at_resolve_time(engine, tmp_path):
    assert quality.SPEC.resolve(engine, {}).engine_name is None
    with engine.begin() as conn:
        conn.execute(text(
            "INSERT INTO archive_cleaning_rules (name, kind, engine_name, engine_options, prompt) "
            "VALUES ('check', 'LLM_CHECK', 'nli-check', CAST(:eo AS jsonb), 'This contains an error.')"),
            {"eo": json.dumps({"model": str(tmp_path), "threshold": 0.7, "preset": "cpu"})})
    resolved = quality.SPEC.resolve(engine, {})
    assert resolved.engine_name == "nli-check" and resolved.preset == "cpu"
    assert resolved.engine_options["threshold"] == 0.7 and resolved.engine_options["device"] == "cpu"
    assert resolved.config["llm_check_rule"]["name"] == "check"
    assert resolved.sources["engine_name"] == "rule"
    # the rule changes after an enqueue: the next resolve (at claim) sees the new one
    with engine.begin() as conn:
        conn.execute(text("UPDATE archive_cleaning_rules SET engine_options = CAST(:eo AS jsonb)"),
                     {"eo": json.dumps({"model": str(tmp_path), "threshold": 0.9})})
    assert quality.SPEC.resolve(engine, {}).engine_options["threshold"] == 0.9
    # a rule that names no model: refused where the run is asked for, saying where to set it
    with engine.begin() as conn:
        conn.execute(text("UPDATE archive_cleaning_rules SET engine_options = '{\"threshold\": 0.9}'"))
    with pytest.raises(MissingOption) as missing:
        quality.SPEC.resolve(engine, {})
    assert missing.value.field == "engine_options.model" and "LLM_CHECK" in missing.value.message
    with engine.begin() as conn:
        conn.execute(text("UPDATE archive_cleaning_rules SET engine_name = 'gpt-9'"))
    with pytest.raises(UnknownEngine) as caught:
        quality.SPEC.resolve(engine, {})
    assert caught.value.field == "llm_check_rule.engine_name"


def test_resolving_describes_the_engine_without_loading_a_model_or_importing_torch():
    code = (
        "import sys, json\n"
        "import scrinalia.domains.archive.workers.catalogue\n"
        "from scrinalia.domains.archive.workers.plugins import load_catalogue\n"
        "c = load_catalogue()\n"
        "for s in c.values():\n"
        "    s.resolve(None, {'engine_options': {'model': '/nowhere'}} if s.name in ('ner', 'typology') else {})\n"
        "d = c['embedding'].resolve(None, {'engine_name': 'transformers', 'preset': 'cuda'}).config\n"
        "print(json.dumps({'torch': 'torch' in sys.modules, 'transformers': 'transformers' in sys.modules, 'd': d}))\n"
    )
    out = json.loads(subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout)
    assert out["torch"] is False and out["transformers"] is False
    assert out["d"]["device"] == "cuda" and out["d"]["dtype"] == "float16" and out["d"]["model_type"] == "bert"


def test_a_worker_config_error_is_an_invalid_request():
    assert issubclass(WorkerConfigError, InvalidRunRequest)
