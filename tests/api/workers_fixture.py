"""Test workers for the API tests (also loaded by a real uvicorn through SCRINALIA_WORKER_PLUGINS).

Built with the real SDK (OptionSpec, EngineSpec, Preset, StampQueue), so the API validates through the
catalogue's own resolver, exactly as in production.
"""
from __future__ import annotations

from scrinalia.domains.archive.workers.sdk import EngineSpec, OptionSpec, Preset, WorkerSpec
from scrinalia.domains.archive.workers.stamps import TITLE_STAMP_SQL, StampQueue


def _noop(ctx):  # never called by the API
    return {}


def _load(options):  # never called by the API
    raise AssertionError("the API must never load an engine")


_ENGINE_OPTIONS = {"device": OptionSpec("str", "cpu", choices=("cpu", "cuda")),
                   "api_token": OptionSpec("str", None, nullable=True)}
_PRESETS = {"fast": Preset("fast", "cpu, small batches", {"device": "cpu"}),
            "gpu": Preset("gpu", "cuda", {"device": "cuda"})}

ALPHA = WorkerSpec(
    name="alpha",
    label="Alpha",
    description="A worker with engines, presets and an option",
    run=_noop,
    stamp_key="alpha",
    engine_source="settings",
    options={"threshold": OptionSpec("float", 0.5, minimum=0.0, maximum=1.0)},
    engines={
        "small": EngineSpec("small", "a small model", _load, options=_ENGINE_OPTIONS, presets=_PRESETS),
        "large": EngineSpec("large", "a large model", _load, options=_ENGINE_OPTIONS, presets=_PRESETS),
    },
    default_engine="small",
    queue=StampQueue("alpha", TITLE_STAMP_SQL, governed=False),
)
BETA = WorkerSpec(name="beta", label="Beta", description="A governed worker without engine", run=_noop,
                  stamp_key="beta", governed=True, queue=StampQueue("beta", TITLE_STAMP_SQL, governed=True))
GAMMA = WorkerSpec(name="gamma", label="Gamma", description="No queue", run=_noop)

WORKERS = [ALPHA, BETA, GAMMA]
