"""Test workers for the panel's browser tests, registered with
``SCRINALIA_WORKER_PLUGINS=tests.panel.panel_workers:WORKERS`` in the API and the runner processes.

* ``panel-slow``: synthetic units in slow batches, reporting progress after each, so a browser can see
  RUNNING with a moving progress bar; the SDK's batch loop honours cancellation between batches.
* ``panel-crash``: writes a line to stderr and then dies of SIGSEGV (a real segfault through ctypes),
  the way a CUDA crash kills a child: the parent records FAILED with exit fields and a fingerprint.
* ``panel-flaky``: raises ``RuntimeError(<its "message" option>)``: a failure whose words the test chooses
  (the crash-loop test gives each retry chain other words, so other fingerprints).
* ``panel-model``: an engine whose ``model`` option is required (as ``ner``'s is): refused until a model
  directory is set in its Settings. No runner claims it.
"""
from __future__ import annotations

import ctypes
import dataclasses
import sys
import time
from typing import Any

from scrinalia.domains.archive.workers.sdk import EngineSpec, OptionSpec, RunContext, WorkerSpec


def run_slow(ctx: RunContext) -> dict[str, Any]:
    units = int(ctx.config.options.get("units", 24))
    delay = float(ctx.config.options.get("delay", 0.5))
    done = 0
    # "load": seconds before the first report, as a model's loading takes (the heartbeat samples memory
    # meanwhile, so the run's chart has points before it has a unit).
    time.sleep(float(ctx.config.options.get("load", 0.0)))
    ctx.report_progress(0, units, "item")

    def fetch(_conn, size: int) -> list[int]:
        return list(range(done, min(units, done + size)))

    for batch in ctx.batches(fetch):
        time.sleep(delay)
        ctx.commit(lambda _conn: None)  # the fenced commit every real worker makes per batch
        done += len(batch)
        ctx.report_progress(done, units, "item")
    return {"items": done}


def run_crash(ctx: RunContext) -> dict[str, Any]:
    ctx.report_progress(1, 10, "item")
    time.sleep(float(ctx.config.options.get("delay", 0.3)))
    sys.stderr.write("panel-crash: the device fell over while reading unit 2\n")
    sys.stderr.flush()
    ctypes.string_at(0)  # SIGSEGV
    return {}


SLOW = WorkerSpec(
    name="panel-slow",
    label="Slow batches (test)",
    description="Synthetic items in slow batches, for the panel's browser tests.",
    run=run_slow,
    unit="item",
    default_batch_size=2,
    options={
        "units": OptionSpec("int", 24, "How many items to process", minimum=1, maximum=100_000),
        "delay": OptionSpec("float", 0.5, "Seconds per batch", minimum=0.0, maximum=60.0),
        "load": OptionSpec("float", 0.0, "Seconds before the first progress (a model's loading)",
                           minimum=0.0, maximum=60.0),
    },
)

CRASH = WorkerSpec(
    name="panel-crash",
    label="Crashing worker (test)",
    description="Dies of SIGSEGV after a moment, as a CUDA crash would.",
    run=run_crash,
    unit="item",
    default_batch_size=1,
    options={"delay": OptionSpec("float", 0.3, "Seconds before the crash", minimum=0.0, maximum=60.0)},
)

def run_flaky(ctx: RunContext) -> dict[str, Any]:
    ctx.report_progress(0, 1, "item")
    raise RuntimeError(str(ctx.config.options.get("message", "flaky")))


FLAKY = WorkerSpec(
    name="panel-flaky",
    label="Flaky worker (test)",
    description="Fails with the message its request names.",
    run=run_flaky,
    unit="item",
    default_batch_size=1,
    options={"message": OptionSpec("str", "flaky", "The error message")},
)


def run_model(ctx: RunContext) -> dict[str, Any]:
    return {"model": ctx.config.engine_options["model"]}


def _never_loaded(options):
    raise AssertionError("the panel's tests never load an engine")


MODEL = WorkerSpec(
    name="panel-model",
    label="Needs a model (test)",
    description="An engine with a required model directory, like ner's.",
    run=run_model,
    unit="item",
    engine_source="settings",
    engines={"tiny": EngineSpec("tiny", "a model from a local directory", _never_loaded, options={
        "model": OptionSpec("path", None, "a local model directory", nullable=True, required=True,
                            required_hint="engine_options.model must name a local model directory: set it in the "
                                          "panel (Workers > panel-model > Settings)"),
        "device": OptionSpec("str", "cpu", "cpu or cuda", choices=("cpu", "cuda")),
    })},
    default_engine="tiny",
)

# Two GPU workers (the default) for the device test: only its runner (--devices 0) advertises them.
GPU_A = dataclasses.replace(SLOW, name="panel-gpu-a", label="GPU worker A (test)")
GPU_B = dataclasses.replace(SLOW, name="panel-gpu-b", label="GPU worker B (test)")

WORKERS = [SLOW, CRASH, MODEL, GPU_A, GPU_B, FLAKY]
