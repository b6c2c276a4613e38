"""The API's one seam onto the worker catalogue (``scrinalia.domains.archive.workers``).

Everything the API needs from a ``WorkerSpec`` goes through here: its public description (engines,
presets, options), the validation of a request or of settings (the catalogue's resolver raises typed
errors naming the field), the effective settings, and the unit counts. Attributes the catalogue may or
may not declare (``engines``, ``presets``, ``pending_count``...) are read with ``getattr`` so this file
is the only place to touch when the catalogue's shape moves. Nothing here imports torch, transformers
or ``runner``: a catalogue engine module must import them lazily.
"""
from __future__ import annotations

import dataclasses
import enum
import logging
from collections.abc import Callable, Mapping
from typing import Any

from sqlalchemy import Engine, text

from scrinalia.domains.archive.errors import InvalidRunRequest
from scrinalia.domains.archive.ledger import validate_request
from scrinalia.domains.archive.workers.sdk import WorkerSpec

log = logging.getLogger("scrinalia.api.catalogue")

Catalogue = dict[str, WorkerSpec]


def load() -> Catalogue:
    from scrinalia.domains.archive.workers.plugins import load_catalogue

    return load_catalogue()


# --- description ----------------------------------------------------------------------------------


def _jsonable(value: Any, depth: int = 0) -> Any:
    """A JSON-safe rendering of catalogue metadata (dataclasses, enums, tuples); callables dropped."""
    if depth > 6:
        return None
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, type):
        return value.__name__
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {
            f.name: _jsonable(getattr(value, f.name), depth + 1)
            for f in dataclasses.fields(value)
            if not f.name.startswith("_") and not callable(getattr(value, f.name))
        }
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v, depth + 1) for k, v in value.items() if not callable(v)}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_jsonable(v, depth + 1) for v in value if not callable(v)]
    if callable(value):
        return None
    return str(value)


def _named_list(value: Any) -> list[dict[str, Any]]:
    """Engines / presets / options as a list of objects with a ``name``, whatever container holds them."""
    if not value:
        return []
    out: list[dict[str, Any]] = []
    items = value.items() if isinstance(value, Mapping) else ((None, v) for v in value)
    for key, item in items:
        rendered = _jsonable(item)
        if not isinstance(rendered, dict):
            rendered = {"value": rendered}
        if "name" not in rendered or rendered["name"] is None:
            rendered = {"name": str(key if key is not None else rendered.get("value")), **rendered}
        out.append(rendered)
    return out


def engines_of(spec: WorkerSpec) -> list[dict[str, Any]]:
    return _named_list(getattr(spec, "engines", None))


def presets_of(spec: WorkerSpec) -> list[dict[str, Any]]:
    presets = _named_list(getattr(spec, "presets", None))
    if not presets:  # presets may be declared per engine
        for engine in engines_of(spec):
            for preset in _named_list(engine.get("presets")):
                presets.append({"engine": engine["name"], **preset})
    return presets


def describe(spec: WorkerSpec) -> dict[str, Any]:
    return {
        "name": spec.name,
        "label": spec.label,
        "description": spec.description,
        "unit": spec.unit,
        "governed": spec.governed,
        "engine_source": spec.engine_source,
        "stamp_key": spec.stamp_key,
        "requires": list(spec.requires),
        "default_batch_size": spec.default_batch_size,
        "accepts_extra_options": spec.accepts_extra_options,
        "engines": engines_of(spec),
        "presets": presets_of(spec),
        "options": _named_list(spec.options),
    }


# --- validation -----------------------------------------------------------------------------------


def _field_error(exc: BaseException) -> InvalidRunRequest | None:
    """The catalogue's typed errors carry the field; normalise them to ``InvalidRunRequest``."""
    if isinstance(exc, InvalidRunRequest):
        return exc
    field = getattr(exc, "field", None)
    if isinstance(field, str) and field:
        message = getattr(exc, "message", None) or str(exc)
        return InvalidRunRequest(field, str(message))
    return None


def _generic_checks(spec: WorkerSpec, request: Mapping[str, Any]) -> None:
    engine_names = {e["name"] for e in engines_of(spec)}
    engine_name = request.get("engine_name")
    if engine_name is not None:
        if spec.engine_source == "none" and not engine_names:
            raise InvalidRunRequest("engine_name", f"worker {spec.name!r} has no engine to choose")
        if spec.engine_source == "llm_check_rule":
            raise InvalidRunRequest("engine_name", "is taken from the active LLM_CHECK rule, not from the request")
        if engine_names and engine_name not in engine_names:
            raise InvalidRunRequest(
                "engine_name", f"unknown engine {engine_name!r} (expected one of {', '.join(sorted(engine_names))})"
            )
    preset = request.get("preset")
    if preset is not None:
        preset_names = {p["name"] for p in presets_of(spec) if engine_name is None or p.get("engine") in (None, engine_name)}
        if preset not in preset_names:
            expected = ", ".join(sorted(preset_names)) or "none"
            raise InvalidRunRequest("preset", f"unknown preset {preset!r} (expected one of {expected})")
    options = request.get("options") or {}
    if not spec.accepts_extra_options:
        unknown = sorted(set(options) - set(spec.options))
        if unknown:
            expected = ", ".join(sorted(spec.options)) or "none"
            raise InvalidRunRequest(f"options.{unknown[0]}", f"is not an option of {spec.name} (expected one of {expected})")
    for name, value in options.items():
        option = spec.options.get(name)
        checker: Callable[[Any], Any] | None = getattr(option, "validate", None) or getattr(option, "coerce", None)
        if checker is not None:
            try:
                checker(value)
            except Exception as exc:  # noqa: BLE001 - the option's own message, attached to its field
                raise InvalidRunRequest(f"options.{name}", getattr(exc, "message", None) or str(exc)) from None


def validate_run_request(spec: WorkerSpec, engine: Engine, request: Mapping[str, Any]) -> dict[str, Any]:
    """The clean request, or ``InvalidRunRequest`` naming the field. Uses the catalogue's resolver
    (explicit > persisted > default) when the worker has one, so what the API accepts is what runs."""
    clean = validate_request(request)
    _generic_checks(spec, clean)
    if spec.resolver is not None:
        try:
            spec.resolve(engine, clean)
        except Exception as exc:  # noqa: BLE001
            field_error = _field_error(exc)
            if field_error is not None:
                raise field_error from None
            raise
    return clean


def validate_settings(spec: WorkerSpec, engine: Engine, values: Mapping[str, Any]) -> dict[str, Any]:
    """Settings have a request's shape and rules."""
    return validate_run_request(spec, engine, {k: v for k, v in values.items() if v is not None})


def effective_settings(spec: WorkerSpec, persisted: Mapping[str, Any] | None) -> dict[str, Any]:
    """What a run with an empty request would use: persisted settings over the signature defaults.

    Computed from data already read (no statement per worker); the runner's resolver, at claim, is the
    truth and writes it on the run.
    """
    persisted = persisted or {}
    default_engine = getattr(spec, "default_engine", None)
    if default_engine is None:
        engines = engines_of(spec)
        flagged = [e["name"] for e in engines if e.get("default")]
        default_engine = flagged[0] if flagged else (engines[0]["name"] if engines else None)
    options = {name: _jsonable(getattr(opt, "default", None)) for name, opt in spec.options.items()
               if getattr(opt, "default", None) is not None}
    options.update(persisted.get("options") or {})
    return {
        "engine_name": persisted.get("engine_name") or (None if spec.engine_source == "llm_check_rule" else default_engine),
        "preset": persisted.get("preset") or getattr(spec, "default_preset", None),
        "db_batch_size": persisted.get("db_batch_size") or spec.default_batch_size,
        "options": options,
        "engine_options": dict(persisted.get("engine_options") or {}),
        "source": "settings" if persisted else "defaults",
    }


# --- counts ---------------------------------------------------------------------------------------

_STAMP_COUNTS = text(
    "SELECT stamp_key, status, sum(n) AS n FROM archive_stamp_counts WHERE n <> 0 GROUP BY stamp_key, status"
)


def unit_counts(engine: Engine, catalogue: Catalogue) -> dict[str, dict[str, int | None]]:
    """pending / processed / failed per worker, from ``archive_stamp_counts`` (ONE statement, a few rows,
    kept by triggers on archive_documents). processed = units stamped DONE, failed = stamped ERROR,
    pending = documents not DONE. A worker whose pending is narrower than "every document" declares
    ``pending_count(engine)`` and that is used instead (at its own cost)."""
    with engine.connect() as conn:
        rows = conn.execute(_STAMP_COUNTS).all()
    by_key: dict[str, dict[str, int]] = {}
    for row in rows:
        by_key.setdefault(row.stamp_key, {})[row.status] = int(row.n)
    total = by_key.get("", {}).get("", 0)
    out: dict[str, dict[str, int | None]] = {}
    for name, spec in catalogue.items():
        key = spec.stamp_key
        if key is None:
            out[name] = {"pending": None, "processed": None, "failed": None}
            continue
        stamps = by_key.get(key, {})
        processed = stamps.get("DONE", 0)
        failed = stamps.get("ERROR", 0)
        pending: int | None = max(0, total - processed)
        counter = getattr(spec, "pending_count", None)
        if callable(counter):
            try:
                pending = int(counter(engine))
            except Exception:  # noqa: BLE001 - a worker's counter must not take the screen down
                log.exception("pending_count of worker %s failed", name)
                pending = None
        out[name] = {"pending": pending, "processed": processed, "failed": failed}
    return out
