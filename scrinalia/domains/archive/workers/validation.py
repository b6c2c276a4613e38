"""The one validation of a run request, shared by every entry point that writes one.

The API (enqueue, schedules, retry), ``scrinalia-runner run``, ``scrinalia scheduler add`` and the
scheduler's own tick call ``validate_run_request`` once before anything is written (decision 0135), so
they refuse the same requests with the same message: an unknown worker, option, engine or preset, an
out-of-range value, a required option (a model directory) that no layer sets. It runs the catalogue's
resolver (explicit > persisted settings > default), which is what the runner's supervisor runs again at
claim, so what is accepted here is what a runner can resolve. Nothing here imports torch: engines are
described, never loaded.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine

from scrinalia.domains.archive.errors import InvalidRunRequest
from scrinalia.domains.archive.ledger import ValidRequest, validate_request
from scrinalia.domains.archive.workers.sdk import OptionSpec, ResolvedConfig, UnknownWorker, WorkerSpec

Catalogue = Mapping[str, WorkerSpec]


def as_field_error(exc: BaseException) -> InvalidRunRequest | None:
    """The catalogue's typed errors carry the field; normalise anything else that does too (a plugin's
    resolver may raise its own class with ``field`` and ``message``)."""
    if isinstance(exc, InvalidRunRequest):
        return exc
    field = getattr(exc, "field", None)
    if isinstance(field, str) and field:
        return InvalidRunRequest(field, str(getattr(exc, "message", None) or exc))
    return None


def resolve_or_raise(spec: WorkerSpec, engine: Engine | None, clean: ValidRequest) -> ResolvedConfig:
    """Resolve ``clean`` as a runner would; a resolver error that names a field is ``InvalidRunRequest``."""
    try:
        return spec.resolve(engine, clean)
    except Exception as exc:  # an error naming a field is the request's fault, else re-raised
        field_error = as_field_error(exc)
        if field_error is not None:
            raise field_error from None
        raise


@dataclass(frozen=True, slots=True)
class ValidatedRun:
    """What the validation of one entry point found: the clean request, and its resolution now."""

    request: ValidRequest
    resolved: ResolvedConfig


def validated_run(catalogue: Catalogue, engine: Engine | None, worker_name: str,
                  request: Mapping[str, Any] | None) -> ValidatedRun:
    """The one validation of a run request (decision 0135): its shape once (``ledger.validate_request``),
    then the catalogue's resolver once; ``InvalidRunRequest`` naming the offending field
    (``UnknownWorker``'s field is ``worker_name``). ``engine``: the database whose persisted settings
    are layered under the request (None: the request alone)."""
    spec = catalogue.get(worker_name)
    if spec is None:
        raise UnknownWorker(worker_name, sorted(catalogue))
    clean = validate_request(request or {})
    return ValidatedRun(clean, resolve_or_raise(spec, engine, clean))


def validate_run_request(catalogue: Catalogue, engine: Engine | None, worker_name: str,
                         request: Mapping[str, Any] | None) -> ValidRequest:
    """The clean request of ``validated_run``. Its resolution is a check only: a run that a runner claims
    later is resolved again at claim, against the settings of that moment (decision 0090); only the
    one-shot CLI, which starts its run at once, keeps it (``validated_run``)."""
    return validated_run(catalogue, engine, worker_name, request).request


def option_from_text(spec: WorkerSpec | None, section: str, key: str, text: str,
                     engine_name: str | None = None) -> Any:
    """A command line's ``KEY=VALUE`` (``section``: options | engine_options) as the JSON value a
    request carries: read by the option's declared type where the catalogue declares it (the engine's
    options: of ``engine_name``, else of the worker's default engine, else of any engine that declares
    ``key``); an undeclared key as a JSON scalar, else the text. ``validate_run_request`` then judges it
    as it judges the API's JSON, with the same messages (decision 0140)."""
    declared = _declared_option(spec, section, key, engine_name) if spec is not None else None
    if declared is not None:
        return declared.from_text(text, f"{section}.{key}")
    try:
        value = json.loads(text)
    except ValueError:
        return text
    return text if isinstance(value, dict | list) else value


def _declared_option(spec: WorkerSpec, section: str, key: str, engine_name: str | None) -> OptionSpec | None:
    if section == "options":
        return spec.options.get(key)
    names = [n for n in (engine_name, spec.default_engine) if n] + list(spec.engines)
    for name in names:
        engine = spec.engines.get(name)
        if engine is not None and key in engine.options:
            return engine.options[key]
    return None
