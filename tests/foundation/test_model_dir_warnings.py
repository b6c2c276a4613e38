"""What the Settings page warns of a model directory (decision 0145), from a worker's ``path`` options
and the runners' reports: which fields count, which runners decide, what one warning says. Pure: the
runners are plain rows, the worker a declared spec; no database, no browser (tests/panel has that)."""
from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from scrinalia.domains.archive.model_dirs import ROOTS_ENV, path_values, unseen_warnings
from scrinalia.domains.archive.workers.sdk import EngineSpec, OptionSpec, ResolvedConfig, WorkerSpec

ENGINE = EngineSpec(name="hf", description="", load=lambda options: None,
                    options={"model_dir": OptionSpec("path"), "dtype": OptionSpec("str")})
SPEC = WorkerSpec(name="tag", label="tag", description="", run=lambda ctx: None, engine_source="settings",
                  options={"vocab": OptionSpec("path"), "limit": OptionSpec("int"), "extra": OptionSpec("path")},
                  engines={"hf": ENGINE}, default_engine="hf")


def _resolved(engine_name: str | None = "hf", **values: Any) -> ResolvedConfig:
    options = {k: v for k, v in values.items() if k in SPEC.options}
    engine_options = {k: v for k, v in values.items() if k in ENGINE.options}
    return ResolvedConfig(engine_name=engine_name, preset=None, db_batch_size=1, options=options,
                          engine_options=engine_options, config={})


def _runner(name: str, sees: Any, state: str = "online", capabilities: Any = ("tag",)) -> SimpleNamespace:
    return SimpleNamespace(name=name, state=state, capabilities=capabilities, sees=sees)


def test_only_set_path_options_of_the_worker_and_its_chosen_engine_count():
    resolved = _resolved(vocab="/v", limit="/not-a-path", extra="", model_dir="/m", dtype="/not-a-path")
    assert path_values(SPEC, resolved) == {"options.vocab": "/v", "engine_options.model_dir": "/m"}
    assert path_values(SPEC, _resolved(engine_name=None, vocab="/v", model_dir="/m")) == {"options.vocab": "/v"}
    assert path_values(SPEC, _resolved(engine_name="gone", model_dir="/m")) == {}
    assert path_values(SPEC, _resolved(vocab=3, model_dir=None)) == {}


def test_a_directory_no_reporting_runner_saw_is_warned_of_once_naming_the_runners():
    resolved = _resolved(vocab="/v", model_dir="/m")
    runners = [
        _runner("b", {"model_dirs": ["/v"]}),
        _runner("a", {"model_dirs": None}),
        _runner("old", None),                                    # reports nothing: decides nothing
        _runner("off", {"model_dirs": ["/m"]}, state="offline"),
        _runner("other", {"model_dirs": ["/m"]}, capabilities=["else"]),
        _runner("none", {"model_dirs": ["/m"]}, capabilities=None),
        _runner("nokey", {"model_roots": []}),
    ]
    warnings = unseen_warnings(SPEC, resolved, runners)
    assert [w["field"] for w in warnings] == ["engine_options.model_dir"]
    assert warnings[0]["message"] == (
        "no online runner of tag (a, b) saw /m when it started: if the directory is not on the runner's "
        "host, every run fails EngineUnavailable. Put the model there (or list its parent in "
        f"{ROOTS_ENV}) and restart the runner, or correct the path.")


def test_without_a_reporting_runner_nothing_is_warned():
    resolved = _resolved(vocab="/v", model_dir="/m")
    assert unseen_warnings(SPEC, resolved, []) == []
    assert unseen_warnings(SPEC, resolved, [_runner("old", None), _runner("s", [], state="online")]) == []
    assert unseen_warnings(SPEC, resolved, [_runner("x", {"model_dirs": ["/v", "/m"]})]) == []
