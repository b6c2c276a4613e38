"""The API's one seam onto the worker catalogue (``scrinalia.domains.archive.workers``).

Everything the API needs from a ``WorkerSpec`` goes through here: its public description
(``spec.signature()``: engines, presets, options), the validation of a request or of settings (the
catalogue's resolver, ``spec.resolve``, raises ``WorkerConfigError``s naming the field), the effective
settings (the same resolver with an empty request), and the unit counts (the workers' stamp queues, all
in ONE statement). Nothing here imports torch, transformers or ``runner``: engine modules load lazily.
"""
from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, Engine

from scrinalia.domains.archive.workers import validation
from scrinalia.domains.archive.workers.sdk import (
    DatabaseLayer,
    PersistedSettings,
    ResolvedConfig,
    WorkerSpec,
    active_llm_check_rule,
)

log = logging.getLogger("scrinalia.api.catalogue")

Catalogue = dict[str, WorkerSpec]


def load() -> Catalogue:
    from scrinalia.domains.archive.workers.plugins import load_catalogue

    return load_catalogue()


# --- description ----------------------------------------------------------------------------------


def describe(spec: WorkerSpec) -> dict[str, Any]:
    """The worker's declaration, with engines, presets and options as lists (easy to render)."""
    sig = spec.signature()
    engines = []
    presets = []
    for name, engine in (sig.get("engines") or {}).items():
        engine_presets = engine.get("presets") or {}
        engines.append({
            "name": name,
            "description": engine.get("description", ""),
            "default": name == sig.get("default_engine"),
            "default_preset": engine.get("default_preset"),
            "presets": sorted(engine_presets),
            "options": [{"name": k, **v} for k, v in (engine.get("options") or {}).items()],
            "accepts_extra_options": engine.get("accepts_extra_options", False),
        })
        for preset_name, preset in engine_presets.items():
            presets.append({"engine": name, "name": preset_name, **preset})
    return {
        "name": sig["name"],
        "label": sig["label"],
        "description": sig["description"],
        "unit": sig["unit"],
        "governed": sig["governed"],
        "engine_source": sig["engine_source"],
        "stamp_key": sig.get("stamp_key"),
        "requires": list(sig.get("requires") or ()),
        "gpu": sig.get("gpu", True),
        "gpu_memory_bytes": sig.get("gpu_memory_bytes"),
        "default_batch_size": sig["default_batch_size"],
        "accepts_extra_options": sig.get("accepts_extra_options", False),
        "default_engine": sig.get("default_engine"),
        "engines": engines,
        "presets": presets,
        "options": [{"name": k, **v} for k, v in (sig.get("options") or {}).items()],
    }


# --- validation -----------------------------------------------------------------------------------


def validate_run_request(spec: WorkerSpec, engine: Engine, request: Mapping[str, Any]) -> dict[str, Any]:
    """The clean request, or ``InvalidRunRequest`` naming the field: the shared validation of every
    entry point (``workers.validation``), over the persisted settings."""
    return validation.validate_run_request({spec.name: spec}, engine, spec.name, request)


def validate_settings(spec: WorkerSpec, engine: Engine, values: Mapping[str, Any]) -> dict[str, Any]:
    """Settings have a request's shape and rules; validated on their own (no persisted layer under them)."""
    return validation.validate_run_request({spec.name: spec}, None, spec.name,
                                           {k: v for k, v in values.items() if v is not None})


def effective_settings(spec: WorkerSpec, engine: Engine | None, layer: DatabaseLayer | None = None) -> dict[str, Any]:
    """What a run with an empty request would use now (the resolver over persisted settings and
    defaults), with the source of each field. An unresolvable configuration is reported, not raised.
    ``layer``: the persisted settings and LLM_CHECK rule already read (see ``database_layer``)."""
    try:
        resolved = spec.resolve(engine, {}, layer=layer)
    except Exception as exc:  # e.g. no active LLM_CHECK rule: shown to the operator
        return _unresolved(exc)
    return resolved.to_json()


def _unresolved(exc: BaseException) -> dict[str, Any]:
    field_error = validation.as_field_error(exc)
    return {"error": {"field": getattr(field_error, "field", None),
                      "message": field_error.message if field_error else type(exc).__name__}}


def effective_settings_and_warnings(spec: WorkerSpec, engine: Engine) -> tuple[dict[str, Any], list[dict[str, str]]]:
    """``effective_settings`` and ``settings_warnings`` of one resolution (the settings' answer resolves
    them once)."""
    try:
        resolved = spec.resolve(engine, {})
    except Exception as exc:  # shown to the operator; no warnings: the error is the answer
        return _unresolved(exc), []
    return resolved.to_json(), settings_warnings(spec, engine, resolved)


def settings_warnings(spec: WorkerSpec, engine: Engine, resolved: ResolvedConfig) -> list[dict[str, str]]:
    """A warning per model directory of the effective settings (``resolved``) that no online runner of
    ``spec`` saw on its host when it registered (decision 0145); none when no runner reports what it sees."""
    from scrinalia.domains.archive import registry
    from scrinalia.domains.archive.model_dirs import unseen_warnings

    if not any(o.type == "path" for o in spec.options.values()) and not any(
            o.type == "path" for e in spec.engines.values() for o in e.options.values()):
        return []
    return unseen_warnings(spec, resolved, registry.list_runners(engine, stopped_within_hours=0))


def database_layer(engine: Engine | Connection, specs: Mapping[str, WorkerSpec],
                   persisted: Mapping[str, Mapping[str, Any]]) -> DatabaseLayer:
    """The resolver's database part for many workers at once: ``persisted`` (every worker's settings
    row, already read by the caller) and, only when one of ``specs`` needs it, the LLM_CHECK rule."""
    needs_rule = any(spec.engine_source == "llm_check_rule" for spec in specs.values())
    return DatabaseLayer(
        settings={name: PersistedSettings.from_row(row) for name, row in persisted.items()},
        llm_check_rule=active_llm_check_rule(engine) if needs_rule else None,
    )


# --- counts ---------------------------------------------------------------------------------------

_EMPTY = {"pending": None, "processed": None, "failed": None}


def unit_counts(engine: Engine, catalogue: Catalogue,
                conn: Connection | None = None) -> dict[str, dict[str, int | None]]:
    """pending / processed / failed per worker, by the catalogue's own definitions. The stamp queues
    that the triggers of ``archive_documents`` keep (``stamp_summary.summarised``: all of the catalogue's)
    are read from ``archive_stamp_counts`` in one statement of a few dozen rows (decision 0075); any
    other queue is counted live (``live_unit_counts``, on its own connection: its planner settings are
    ``SET LOCAL``). ``conn``: a connection to read the summary on (the caller's)."""
    from scrinalia.domains.archive.workers import stamp_summary

    kept = {name: spec.queue for name, spec in catalogue.items()
            if stamp_summary.summarised(getattr(spec, "queue", None))}
    rest = {name: spec for name, spec in catalogue.items() if name not in kept}
    out: dict[str, dict[str, int | None]] = {}
    if kept:
        summary = stamp_summary.summary_counts(conn if conn is not None else engine, kept)
        out.update({name: dict(c) for name, c in summary.items()})
    if rest:
        out.update(live_unit_counts(engine, rest))
    return {name: out[name] for name in catalogue}


def live_unit_counts(engine: Engine, catalogue: Catalogue) -> dict[str, dict[str, int | None]]:
    """The same counts computed from the documents: every stamp queue in ONE statement
    (``stamps.catalogue_counts``: each pending count reads its partial index, failed reads
    ix_documents_stamp_errors); a worker with another kind of queue answers ``spec.counts``. For the
    queues the summary does not keep, and to check the summary (``scrinalia db counts``)."""
    from scrinalia.domains.archive.workers.stamps import catalogue_counts

    out: dict[str, dict[str, int | None]] = {}
    for name, counts in catalogue_counts(engine, catalogue).items():
        if counts is not None:
            out[name] = dict(counts)
            continue
        spec = catalogue[name]
        try:
            out[name] = dict(spec.counts(engine) or _EMPTY) if getattr(spec, "queue", None) else dict(_EMPTY)
        except Exception:  # one worker's counter must not take the screen down
            log.exception("counts of worker %s failed", name)
            out[name] = dict(_EMPTY)
    return out


class CountsCache:
    """Stale-while-revalidate for ``unit_counts``, per process.

    Live, the counts were the one part of GET /system/workers whose cost grows with the backlog (~30 ms
    on 100k documents with large backlogs); read from the summary (decision 0075) they cost a few dozen
    rows, so by default (``max_age`` 0) they are read on every request. With ``max_age`` > 0 (an opt-in
    for much larger archives) an
    answer older than ``max_age`` seconds is still served (with ``counts_as_of``) while ONE background
    thread of this process recomputes it; the first request of a process computes them inline. Nothing
    is shared between processes: the cache only saves work, it never decides anything.
    """

    def __init__(self, max_age_seconds: float) -> None:
        self.max_age = max_age_seconds
        self._lock = threading.Lock()
        self._value: dict[str, dict[str, int | None]] | None = None
        self._as_of: datetime | None = None
        self._computed_at = 0.0
        self._refreshing = False

    def _compute(self, engine: Engine, catalogue: Catalogue) -> None:
        try:
            value = unit_counts(engine, catalogue)
        except Exception:  # keep the last value; log the class only
            log.exception("unit counts failed")
            with self._lock:
                self._refreshing = False
            return
        with self._lock:
            self._value, self._as_of, self._computed_at = value, datetime.now(UTC), time.monotonic()
            self._refreshing = False

    def _snapshot(self, refresh: bool = True) -> tuple[Any, datetime | None, bool]:
        """The cached value, when it was computed, and whether this caller starts its refresh (it is
        stale and no refresh runs: the caller's flag is set under the lock, so one thread starts it)."""
        with self._lock:
            stale = time.monotonic() - self._computed_at > self.max_age
            start = refresh and self._value is not None and stale and not self._refreshing
            if start:
                self._refreshing = True
            return self._value, self._as_of, start

    def get(self, engine: Engine, catalogue: Catalogue, names: list[str] | None = None,
            conn: Connection | None = None) -> tuple[dict[str, dict[str, int | None]], datetime | None]:
        """The counts of ``names`` (default: the whole catalogue) and when they were computed. Uncached
        (``max_age`` 0), only those are counted (the summary read on ``conn`` when given); cached, the
        whole catalogue is, for the next request."""
        names = list(catalogue) if names is None else names
        if self.max_age <= 0:
            return unit_counts(engine, {n: catalogue[n] for n in names}, conn=conn), datetime.now(UTC)
        value, as_of, start = self._snapshot()
        if value is None:
            self._compute(engine, catalogue)
            value, as_of, _ = self._snapshot(refresh=False)
            if value is None:
                return {name: dict(_EMPTY) for name in names}, None
        elif start:
            threading.Thread(target=self._compute, args=(engine, catalogue), daemon=True,
                             name="scrinalia-counts").start()
        return {name: value.get(name, dict(_EMPTY)) for name in names}, as_of
