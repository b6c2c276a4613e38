"""The worker SDK: what a worker declares (``WorkerSpec``) and what it receives (``RunContext``).

Contract between the runner (``runner/``) and the catalogue (``scrinalia.domains.archive.workers``):

* the runner finds workers through the plugin registry (``plugins.load_catalogue``: the entry-point
  group ``scrinalia.workers``, each entry point naming a ``WorkerSpec``);
* at claim the runner's supervisor resolves the request once with ``spec.resolve(engine, request)``
  (explicit > persisted ``archive_worker_settings`` row > signature default; a resolver imports no
  engine: it runs in the supervisor, which never imports torch), the ledger's ``record_start`` writes
  what it returns (``ResolvedConfig``: engine_name, preset, options, config), then the child starts
  with that ``ResolvedConfig`` in its assignment;
* the child builds a ``RunContext(run, config, engine, channel)`` and calls ``spec.run(ctx)``; the
  worker's summary (a JSON object, also kept in ``ctx.result`` after every committed batch) is the run's
  ``result``. ``RunCancelled`` ends the run CANCELLED (``ctx.result`` holds what was committed),
  ``LeaseLost`` ends the child with nothing more written, any other exception ends it FAILED.

A worker never writes to the archive outside ``RunContext.commit``: that is the hard fence (the run's
lease is checked by the database when the batch's transaction commits, so no write lands after the lease
is gone; decision 0100). A batch's transaction holds no lock on the run's row. Its batches
come from ``RunContext.batches``, which checks cancellation once per batch boundary, so a worker cannot
forget to.

Nothing in this module imports torch or transformers: the API validates requests with it.
"""
from __future__ import annotations

import json
import math
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from sqlalchemy import Connection, Engine
from sqlalchemy.exc import DBAPIError

from scrinalia.db.errors import classify_database_error, describe_database_error
from scrinalia.domains.archive.errors import InvalidRunRequest
from scrinalia.domains.archive.ledger import (
    BATCH_SIZE_MAX,
    BATCH_SIZE_MIN,
    WorkerRun,
    is_batch_fence_refusal,
    register_batch_fence,
    validate_request,
)
from scrinalia.domains.archive.queries import QUERIES
from scrinalia.domains.archive.worker_settings import get_settings

T = TypeVar("T")

#: An option by this name is refused everywhere: ``config`` is the run's engine description, written
#: by the resolver; accepting it as an option would let a request forge what the ledger says ran.
REFUSED_OPTION_NAMES = frozenset({"config"})


# --- errors ----------------------------------------------------------------------------------------


class RunCancelled(Exception):
    """Raised at a batch boundary when cancellation was requested; the run ends CANCELLED."""


class LeaseLost(Exception):
    """The run's lease is gone: the batch was rolled back and the child must stop writing."""


class WorkerConfigError(InvalidRunRequest):
    """A request does not fit the worker's signature; ``field`` names the offending part.

    Subclasses ``InvalidRunRequest`` so the API answers it like any other invalid request (422).
    """


class UnknownWorker(WorkerConfigError):
    def __init__(self, name: str, known: list[str] | None = None) -> None:
        hint = f" (known: {', '.join(known)})" if known else ""
        super().__init__("worker_name", f"no worker named {name!r}{hint}")


class UnknownEngine(WorkerConfigError):
    pass


class UnknownPreset(WorkerConfigError):
    pass


class UnknownOption(WorkerConfigError):
    pass


class InvalidOption(WorkerConfigError):
    pass


class RefusedOption(WorkerConfigError):
    pass


class MissingOption(WorkerConfigError):
    """A required option (``OptionSpec.required``: a model directory, say) has no value in any layer."""


class EngineUnavailable(WorkerConfigError):
    """The engine cannot be loaded as configured (no model directory where the options point).

    Raised by an engine's ``load`` in the child: a configuration failure, never retried."""


# --- the channel to the supervisor ------------------------------------------------------------------


class ChildChannel(Protocol):
    """How a RunContext talks to whoever supervises the child (the daemon's parent or the one-shot CLI)."""

    def send_progress(self, progress: Mapping[str, Any]) -> None: ...

    def cancel_requested(self) -> bool: ...


class LocalChannel:
    """A channel for in-process use (scripts, tests): progress is kept, cancellation is a flag."""

    def __init__(self) -> None:
        self.progress: list[dict[str, Any]] = []
        self.cancel = False

    def send_progress(self, progress: Mapping[str, Any]) -> None:
        self.progress.append(dict(progress))

    def cancel_requested(self) -> bool:
        return self.cancel


# --- signatures: options, engines, presets ---------------------------------------------------------

_TYPES: dict[str, tuple[type, ...]] = {
    "int": (int,),
    "float": (float, int),
    "bool": (bool,),
    "str": (str,),
    "path": (str,),
    "list": (list, tuple),
    "dict": (dict,),
}


@dataclass(frozen=True, slots=True)
class OptionSpec:
    """One option of a worker's or an engine's signature: a type, a default and its bounds."""

    type: str  # int | float | bool | str | path | list | dict
    default: Any = None
    description: str = ""
    choices: tuple[Any, ...] | None = None
    minimum: float | None = None
    maximum: float | None = None
    nullable: bool = False
    #: No layer (request, settings, default) gave a value: the run is refused where it is asked for,
    #: with ``required_hint`` (what to set, and where) instead of failing once claimed.
    required: bool = False
    required_hint: str = ""

    def __post_init__(self) -> None:
        if self.type not in _TYPES:
            raise ValueError(f"unknown option type {self.type!r}")

    def coerce(self, value: Any, field_name: str) -> Any:
        """Validate ``value`` as it came in JSON; raise ``InvalidOption``. Strict, everywhere (the API,
        the CLIs, the scheduler, the child at claim): an int is a JSON integer and a bool a JSON
        boolean, never a string that looks like one (decision 0140). A command line's text is read by
        ``from_text`` first."""
        if value is None:
            if self.nullable or self.default is None:
                return None
            raise InvalidOption(field_name, "must not be null")
        value = self._typed(value, field_name)
        self._check_bounds(value, field_name)
        return value

    def from_text(self, text: str, field_name: str) -> Any:
        """A command line's ``KEY=VALUE`` text as this option's JSON value (``"64"`` -> 64 for an int,
        ``true``/``false`` for a bool, JSON for a list or dict, the text itself for a string or path);
        ``coerce`` then validates it like any request."""
        if self.type in _PARSED_FROM_STRING:
            return _parse_string(text, self.type, field_name)
        return text

    def _typed(self, value: Any, field_name: str) -> Any:
        """``value`` as this option's type: a tuple as a list, an int where a float is asked; never a
        string as a number or a boolean, never a boolean as a number, never a float as an int."""
        if not isinstance(value, _TYPES[self.type]) or (self.type in ("int", "float") and isinstance(value, bool)):
            raise InvalidOption(field_name, type_mismatch(self.type, value))
        normalise = _NORMALISE.get(self.type)
        return normalise(value, field_name) if normalise else value

    def _check_bounds(self, value: Any, field_name: str) -> None:
        if self.choices is not None and value not in self.choices:
            raise InvalidOption(field_name, f"must be one of {', '.join(map(str, self.choices))}, got {value!r}")
        if self.minimum is not None and value < self.minimum:
            raise InvalidOption(field_name, f"must be >= {self.minimum}, got {value!r}")
        if self.maximum is not None and value > self.maximum:
            raise InvalidOption(field_name, f"must be <= {self.maximum}, got {value!r}")

    def describe(self) -> dict[str, Any]:
        out: dict[str, Any] = {"type": self.type, "default": self.default, "description": self.description}
        if self.choices is not None:
            out["choices"] = list(self.choices)
        if self.minimum is not None:
            out["minimum"] = self.minimum
        if self.maximum is not None:
            out["maximum"] = self.maximum
        if self.required:
            out["required"] = True
        return out


_PARSED_FROM_STRING = ("int", "float", "bool", "list", "dict")


_TYPE_WORDS = {"int": "an integer", "float": "a number", "bool": "a boolean (true or false)", "str": "a string",
               "path": "a string (a path)", "list": "a list", "dict": "an object"}


def _json_kind(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a number with a fraction" if not value.is_integer() else "a number written with a decimal point"
    if isinstance(value, str):
        return f"a string ({value[:40]!r})"
    if isinstance(value, list | tuple):
        return "a list"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def type_mismatch(type_: str, value: Any) -> str:
    """The one message for a value of the wrong JSON type, the same from every entry point."""
    return f"must be {_TYPE_WORDS[type_]}, not {_json_kind(value)}"


def _finite_float(value: Any, field_name: str) -> float:
    number = float(value)
    if not math.isfinite(number):
        raise InvalidOption(field_name, "must be a finite number")
    return number


def _non_empty(value: Any, field_name: str) -> str:
    if not value.strip():
        raise InvalidOption(field_name, "must be a non-empty string")
    return str(value)


#: The last step of ``OptionSpec.coerce`` for the types that have one.
_NORMALISE: dict[str, Callable[[Any, str], Any]] = {
    "float": _finite_float,
    "list": lambda value, _field: list(value),
    "str": _non_empty,
    "path": _non_empty,
}


def _parse_string(value: str, type_: str, field_name: str) -> Any:
    raw = value.strip()
    try:
        if type_ == "int":
            return int(raw)
        if type_ == "float":
            return float(raw)
        if type_ == "bool":
            lowered = raw.lower()
            if lowered in ("1", "true", "yes", "on"):
                return True
            if lowered in ("0", "false", "no", "off"):
                return False
            raise ValueError(raw)
        return json.loads(raw)
    except ValueError:
        raise InvalidOption(field_name, f"cannot read {value!r} as {type_}") from None


@dataclass(frozen=True, slots=True)
class Preset:
    """A named bundle of engine options (for example ``cuda`` = device cuda, dtype float16)."""

    name: str
    description: str
    engine_options: Mapping[str, Any]
    gpu_memory_bytes: int | None = None  # GPU memory a run with this preset may need (memory-aware claims)


@dataclass(frozen=True, slots=True)
class EngineSpec:
    """An engine a worker can use.

    ``describe(options)`` says what would be loaded (model directory, device, dtype...) WITHOUT loading
    anything heavy: the API calls it to validate and show a request, so it must not import torch.
    ``load(options)`` loads it (in the runner's child only) and returns the engine object.
    """

    name: str
    description: str
    load: Callable[[dict[str, Any]], Any]
    describe: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    options: Mapping[str, OptionSpec] = field(default_factory=dict)
    presets: Mapping[str, Preset] = field(default_factory=dict)
    default_preset: str | None = None
    accepts_extra_options: bool = False
    gpu_memory_bytes: int | None = None  # GPU memory a run of this engine may need (memory-aware claims)

    def gpu_memory_needed(self) -> int | None:
        """The largest GPU memory this engine or one of its presets declares; None: nothing declared."""
        declared = [m for m in (self.gpu_memory_bytes, *(p.gpu_memory_bytes for p in self.presets.values()))
                    if m is not None]
        return max(declared) if declared else None

    def signature(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "default_preset": self.default_preset,
            "gpu_memory_bytes": self.gpu_memory_needed(),
            "presets": {p.name: {"description": p.description, "engine_options": dict(p.engine_options),
                                 "gpu_memory_bytes": p.gpu_memory_bytes}
                        for p in self.presets.values()},
            "options": {k: o.describe() for k, o in self.options.items()},
            "accepts_extra_options": self.accepts_extra_options,
        }


# --- the resolved configuration -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ResolvedConfig:
    """The effective configuration of one run: what record_start writes as the truth."""

    engine_name: str | None
    preset: str | None
    db_batch_size: int
    options: dict[str, Any]
    engine_options: dict[str, Any]
    config: dict[str, Any]  # the engine's describe(): what would be loaded, made without loading it
    sources: dict[str, str] = field(default_factory=dict)  # field -> explicit | persisted | default | rule

    def to_json(self) -> dict[str, Any]:
        return {
            "engine_name": self.engine_name,
            "preset": self.preset,
            "db_batch_size": self.db_batch_size,
            "options": self.options,
            "engine_options": self.engine_options,
            "config": self.config,
            "sources": self.sources,
        }


@dataclass(frozen=True, slots=True)
class PersistedSettings:
    """The ``archive_worker_settings`` row of one worker (all fields optional)."""

    engine_name: str | None = None
    preset: str | None = None
    db_batch_size: int | None = None
    options: Mapping[str, Any] = field(default_factory=dict)
    engine_options: Mapping[str, Any] = field(default_factory=dict)
    revision: int | None = None

    @classmethod
    def from_row(cls, row: Mapping[str, Any] | None) -> PersistedSettings:
        """From an ``archive_worker_settings`` row as a mapping (``worker_settings.all_settings``)."""
        if not row:
            return cls()
        return cls(engine_name=row.get("engine_name"), preset=row.get("preset"),
                   db_batch_size=row.get("db_batch_size"), options=dict(row.get("options") or {}),
                   engine_options=dict(row.get("engine_options") or {}), revision=row.get("revision"))


@dataclass(frozen=True)
class DatabaseLayer:
    """What the default resolver reads from the database, read ONCE for many workers (the API's worker
    list resolves every worker's effective settings): every worker's persisted settings and the active
    LLM_CHECK rule. Without it, ``resolve_config`` reads them itself, one worker at a time."""

    settings: Mapping[str, PersistedSettings] = field(default_factory=dict)
    llm_check_rule: Mapping[str, Any] | None = None


_LLM_CHECK_RULE = QUERIES["llm_check_rule"].text()


def load_persisted(engine: Engine | None, worker_name: str) -> PersistedSettings:
    if engine is None:
        return PersistedSettings()
    return PersistedSettings.from_row(get_settings(engine, worker_name))


def active_llm_check_rule(engine: Engine | Connection) -> dict[str, Any] | None:
    """The active LLM_CHECK cleaning rule (at most one, by a partial unique index), read now."""
    if isinstance(engine, Connection):
        row = engine.execute(_LLM_CHECK_RULE).one_or_none()
    else:
        with engine.connect() as conn:
            row = conn.execute(_LLM_CHECK_RULE).one_or_none()
    if row is None:
        return None
    out = dict(row._mapping)
    out["updated_at"] = out["updated_at"].isoformat()
    out["engine_options"] = dict(out["engine_options"] or {})
    return out


# --- the worker spec ------------------------------------------------------------------------------

ENGINE_SOURCES = ("none", "settings", "llm_check_rule")


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """A worker's declaration. ``run`` must be a module-level function so a fork server can import it.

    * ``governed``: the worker changes curated data and never touches HUMAN_APPROVED documents;
    * ``engine_source``: ``none`` (no model), ``settings`` (request > persisted settings > default engine)
      or ``llm_check_rule`` (the engine is the active LLM_CHECK cleaning rule's, read at claim);
    * ``stamp_key``: its key in ``archive_documents.execution_log``;
    * ``options``: the worker's option signature (name -> OptionSpec);
    * ``pending``: the SQL condition of a pending unit (``archive.stamps.StampQueue``), the same for the
      execution and for ``pending_count``;
    * ``requires``: what it needs to run, e.g. ``("torch",)``; informative for the panel;
    * ``gpu``: True (the default: nothing shares a GPU by accident) when a run may use a GPU; on a runner
      that owns devices (``--devices``) such a run takes a device slot. False: a CPU-only worker, which
      takes no slot and whose child sees no GPU (``CUDA_VISIBLE_DEVICES=""``);
    * ``gpu_memory_bytes``: the GPU memory a run needs; a runner claims the run only when NVML reports
      that much free on a device with a free slot (see ``gpu_memory_needed`` for engines and presets);
    * ``stall_timeout``: seconds a run may go without a message or CPU work before the runner dumps its
      stack and stops it (FAILED ``stalled``); None: the runner's ``--stall-timeout``; 0: never
      (``runner.stall``, decision 0111).
    """

    name: str
    label: str
    description: str
    run: Callable[[RunContext], Mapping[str, Any] | None]
    unit: str = "document"
    governed: bool = False
    engine_source: str = "none"  # "none" | "settings" | "llm_check_rule"
    stamp_key: str | None = None
    default_batch_size: int = 32
    options: Mapping[str, OptionSpec] = field(default_factory=dict)  # name -> OptionSpec
    accepts_extra_options: bool = False
    requires: tuple[str, ...] = ()
    gpu: bool = True
    gpu_memory_bytes: int | None = None
    stall_timeout: float | None = None
    engines: Mapping[str, EngineSpec] = field(default_factory=dict)
    default_engine: str | None = None
    queue: Any = None  # a StampQueue (scrinalia.domains.archive.stamps) for document workers
    resolver: Callable[..., ResolvedConfig] | None = None  # (spec, engine, request, layer) -> ResolvedConfig

    def __post_init__(self) -> None:
        if self.engine_source not in ENGINE_SOURCES:
            raise ValueError(f"{self.name}: engine_source must be one of {ENGINE_SOURCES}")
        refused = REFUSED_OPTION_NAMES & set(self.options)
        if refused:
            raise ValueError(f"{self.name}: option name(s) {sorted(refused)} are reserved")
        if self.default_engine is not None and self.default_engine not in self.engines:
            raise ValueError(f"{self.name}: default engine {self.default_engine!r} is not declared")

    def gpu_memory_needed(self) -> int | None:
        """The GPU memory a run of this worker may need, decided before the claim (the run's engine and
        preset are resolved only in its child, after it): the worker's own declaration, else the largest
        of its engines' and their presets' (the safe side). None: nothing declared, or a CPU-only worker."""
        if not self.gpu:
            return None
        if self.gpu_memory_bytes is not None:
            return self.gpu_memory_bytes
        declared = [m for m in (e.gpu_memory_needed() for e in self.engines.values()) if m is not None]
        return max(declared) if declared else None

    # -- configuration --------------------------------------------------------------------------

    def resolve(self, engine: Engine | None, request: Mapping[str, Any],
                layer: DatabaseLayer | None = None) -> ResolvedConfig:
        """Re-resolve the request against persisted settings and defaults (explicit > persisted > default).

        ``engine`` is the database (None: no persisted layer, used by offline validation, or the runner's
        claim, which reads the layer through its ledger port). ``layer``: the database's part already read
        (``DatabaseLayer``). A custom resolver is called ``resolver(spec, engine, request, layer)`` and
        reads the layer when one is given (decision 0351). Raises a ``WorkerConfigError`` subclass that
        names the offending field.
        """
        if self.resolver is not None:
            return self.resolver(self, engine, request, layer)
        return resolve_config(self, engine, request, layer=layer)

    def get_engine(self, config: ResolvedConfig) -> Any:
        """Load the run's engine (heavy: only a runner's child calls this)."""
        if config.engine_name is None:
            return None
        return self._engine(config.engine_name, "engine_name").load(dict(config.engine_options))

    def signature(self) -> dict[str, Any]:
        """The worker's declaration as JSON, for the panel and the API."""
        return {
            "name": self.name,
            "label": self.label,
            "description": self.description,
            "unit": self.unit,
            "governed": self.governed,
            "engine_source": self.engine_source,
            "stamp_key": self.stamp_key,
            "default_batch_size": self.default_batch_size,
            "options": {k: o.describe() for k, o in self.options.items()},
            "accepts_extra_options": self.accepts_extra_options,
            "requires": list(self.requires),
            "gpu": self.gpu,
            "gpu_memory_bytes": self.gpu_memory_needed(),
            "default_engine": self.default_engine,
            "engines": {k: e.signature() for k, e in self.engines.items()},
        }

    # -- queue ------------------------------------------------------------------------------------

    def pending_count(self, engine: Engine) -> int | None:
        """Units still to do, by the same condition as the execution; None for a worker with no queue."""
        if self.queue is None:
            return None
        return self.queue.pending_count(engine)

    def counts(self, engine: Engine) -> dict[str, int] | None:
        """``{"pending", "processed", "failed"}`` for the panel; None for a worker with no queue."""
        if self.queue is None:
            return None
        return self.queue.counts(engine)

    def _engine(self, name: str, field_name: str) -> EngineSpec:
        try:
            return self.engines[name]
        except KeyError:
            known = ", ".join(self.engines) or "none"
            raise UnknownEngine(field_name, f"worker {self.name!r} has no engine {name!r} (known: {known})") from None


# --- the resolver ---------------------------------------------------------------------------------


def _check_refused(values: Mapping[str, Any], prefix: str) -> None:
    for key in values:
        if key in REFUSED_OPTION_NAMES:
            raise RefusedOption(f"{prefix}.{key}", "is refused: the run's config is written by the resolver")


def _refuse_engine_choice(clean: Mapping[str, Any], engine_why: str, options_why: str) -> None:
    """For a worker whose engine the request may not choose: refuse ``engine_name``, ``preset`` and any
    ``engine_options`` (a refused option name first, as everywhere)."""
    for key in ("engine_name", "preset"):
        if clean.get(key) is not None:
            raise UnknownEngine(key, engine_why)
    engine_options = clean.get("engine_options") or {}
    _check_refused(engine_options, "engine_options")
    if engine_options:
        raise UnknownOption(f"engine_options.{sorted(engine_options)[0]}", options_why)


def _merge_engine_options(
    espec: EngineSpec, layers: list[tuple[str, str | None, Mapping[str, Any]]]
) -> tuple[dict[str, Any], dict[str, str]]:
    """Defaults, then each layer (lowest precedence first): its preset's values, then its own options."""
    values = {k: o.default for k, o in espec.options.items()}
    sources = {k: "default" for k in values}
    for source, preset, options in layers:
        if preset is not None:
            if preset not in espec.presets:
                known = ", ".join(espec.presets) or "none"
                raise UnknownPreset("preset", f"engine {espec.name!r} has no preset {preset!r} (known: {known})")
            for k, v in espec.presets[preset].engine_options.items():
                values[k], sources[k] = v, f"{source}:preset"
        _check_refused(options, "engine_options")
        for k, v in options.items():
            values[k], sources[k] = v, source
    return _coerce_options(values, espec.options, espec.accepts_extra_options, "engine_options",
                           f"engine {espec.name!r}"), sources


def _describe(espec: EngineSpec, preset: str | None, options: dict[str, Any]) -> dict[str, Any]:
    described = espec.describe(dict(options)) if espec.describe is not None else {}
    return {"engine": espec.name, "preset": preset, "engine_options": dict(options), **described}


def _merge_options(
    spec: WorkerSpec, persisted: Mapping[str, Any], explicit: Mapping[str, Any]
) -> tuple[dict[str, Any], dict[str, str]]:
    values = {k: o.default for k, o in spec.options.items()}
    sources = {k: "default" for k in values}
    for source, layer in (("persisted", persisted), ("explicit", explicit)):
        _check_refused(layer, "options")
        for k, v in layer.items():
            values[k], sources[k] = v, source
    return _coerce_options(values, spec.options, spec.accepts_extra_options, "options",
                           f"worker {spec.name!r}"), sources


def _coerce_options(values: Mapping[str, Any], declared: Mapping[str, OptionSpec], accepts_extra: bool,
                    prefix: str, owner: str) -> dict[str, Any]:
    """Each value coerced by its declaration; an undeclared one kept only where ``accepts_extra``."""
    clean: dict[str, Any] = {}
    for k, v in values.items():
        ospec = declared.get(k)
        if ospec is not None:
            clean[k] = ospec.coerce(v, f"{prefix}.{k}")
            if ospec.required and clean[k] is None:
                hint = ospec.required_hint or ospec.description
                raise MissingOption(f"{prefix}.{k}", f"is required and not set: {hint}")
        elif accepts_extra:
            clean[k] = v
        else:
            known = ", ".join(declared) or "none"
            raise UnknownOption(f"{prefix}.{k}", f"is not an option of {owner} (known: {known})")
    return clean


@dataclass(frozen=True, slots=True)
class _EngineChoice:
    """The engine part of a resolution: which engine, its preset and options, and what it describes."""

    engine_name: str | None = None
    preset: str | None = None
    engine_options: dict[str, Any] = field(default_factory=dict)
    config: dict[str, Any] = field(default_factory=lambda: {"engine": None})


def _first_set(*candidates: tuple[Any, str]) -> tuple[Any, str]:
    """The first (value, source) whose value is set; the last one (the default) otherwise."""
    for value, source in candidates[:-1]:
        if value is not None:
            return value, source
    return candidates[-1]


def resolve_config(spec: WorkerSpec, engine: Engine | None, request: Mapping[str, Any],
                   layer: DatabaseLayer | None = None) -> ResolvedConfig:
    """The default resolver. Precedence, field by field: explicit request > persisted settings > default.

    * the engine: explicit ``engine_name`` > persisted > ``spec.default_engine``. The persisted preset and
      engine options apply only when the persisted row is about the same engine (another engine's options
      would be meaningless);
    * engine options: the option defaults, then the persisted layer (its preset, then its engine_options),
      then the explicit layer (its preset, then its engine_options); a preset is shorthand for a set of
      options of its own layer, so an explicit preset beats a persisted option;
    * worker options: defaults < persisted < explicit, key by key;
    * ``db_batch_size``: explicit > persisted > ``spec.default_batch_size``;
    * an ``llm_check_rule`` worker takes its engine from the active LLM_CHECK rule, read now (at claim),
      and refuses an explicit engine (it would disagree with the rule).
    """
    clean = validate_request(request)
    if layer is not None:
        persisted = layer.settings.get(spec.name) or PersistedSettings()
    else:
        persisted = load_persisted(engine, spec.name)
    sources: dict[str, str] = {}
    batch, sources["db_batch_size"] = _first_set((clean.get("db_batch_size"), "explicit"),
                                                 (persisted.db_batch_size, "persisted"),
                                                 (spec.default_batch_size, "default"))
    if not BATCH_SIZE_MIN <= int(batch) <= BATCH_SIZE_MAX:
        raise InvalidOption("db_batch_size", f"must be between {BATCH_SIZE_MIN} and {BATCH_SIZE_MAX}")
    options, option_sources = _merge_options(spec, persisted.options, clean.get("options") or {})
    sources.update({f"options.{k}": v for k, v in option_sources.items()})
    if spec.engine_source == "none":
        why = f"worker {spec.name!r} uses no engine"
        _refuse_engine_choice(clean, why, why)
        choice = _EngineChoice()
    elif spec.engine_source == "llm_check_rule":
        choice = _rule_engine(spec, clean, engine, layer, sources)
    else:
        choice = _settings_engine(spec, clean, persisted, sources)
    config = {"worker": spec.name, **choice.config}
    if persisted.revision is not None:
        config["settings_revision"] = persisted.revision
    return ResolvedConfig(
        engine_name=choice.engine_name,
        preset=choice.preset,
        db_batch_size=int(batch),
        options=options,
        engine_options=choice.engine_options,
        config=config,
        sources=sources,
    )


def _rule_engine(spec: WorkerSpec, clean: Mapping[str, Any], engine: Engine | None, layer: DatabaseLayer | None,
                 sources: dict[str, str]) -> _EngineChoice:
    """The engine of the active LLM_CHECK rule, read now (at claim); an explicit engine is refused."""
    _refuse_engine_choice(clean, f"worker {spec.name!r} takes its engine from the active LLM_CHECK rule",
                          f"worker {spec.name!r} takes its engine options from the LLM_CHECK rule")
    if layer is not None:
        rule = dict(layer.llm_check_rule) if layer.llm_check_rule is not None else None
    else:
        rule = active_llm_check_rule(engine) if engine is not None else None
    if rule is None or not rule["engine_name"]:
        return _EngineChoice(config={"engine": None, "llm_check_rule": None})
    espec = spec._engine(rule["engine_name"], "llm_check_rule.engine_name")
    rule_options = dict(rule["engine_options"])
    rule_preset = rule_options.pop("preset", None)
    engine_options, eo_sources = _merge_engine_options(espec, [("rule", rule_preset, rule_options)])
    preset = rule_preset or espec.default_preset
    config = _describe(espec, preset, engine_options)
    config["llm_check_rule"] = {k: rule[k] for k in ("id", "name", "field", "prompt", "updated_at")}
    sources["engine_name"] = "rule"
    sources.update({f"engine_options.{k}": v for k, v in eo_sources.items()})
    return _EngineChoice(espec.name, preset, engine_options, config)


def _settings_engine(spec: WorkerSpec, clean: Mapping[str, Any], persisted: PersistedSettings,
                     sources: dict[str, str]) -> _EngineChoice:
    """The engine named by the request, else the persisted settings, else the worker's default. The
    persisted preset and engine options apply only to the engine they were persisted for."""
    engine_name, sources["engine_name"] = _first_set((clean.get("engine_name"), "explicit"),
                                                     (persisted.engine_name, "persisted"),
                                                     (spec.default_engine, "default"))
    if engine_name is None:
        raise UnknownEngine("engine_name", f"worker {spec.name!r} has no default engine; name one")
    espec = spec._engine(engine_name, "engine_name" if sources["engine_name"] != "persisted"
                         else "archive_worker_settings.engine_name")
    same_engine = persisted.engine_name in (None, engine_name)
    layers: list[tuple[str, str | None, Mapping[str, Any]]] = []
    if same_engine:
        layers.append(("persisted", persisted.preset, persisted.engine_options))
    layers.append(("explicit", clean.get("preset"), clean.get("engine_options") or {}))
    engine_options, eo_sources = _merge_engine_options(espec, layers)
    preset, sources["preset"] = _first_set((clean.get("preset"), "explicit"),
                                           (persisted.preset if same_engine else None, "persisted"),
                                           (espec.default_preset, "default"))
    if sources["preset"] == "default" and preset is not None:
        # the default preset is the lowest layer: re-merge under it
        engine_options, eo_sources = _merge_engine_options(espec, [("default", preset, {})] + layers)
    sources.update({f"engine_options.{k}": v for k, v in eo_sources.items()})
    return _EngineChoice(engine_name, preset, engine_options, _describe(espec, preset, engine_options))


# --- the run context ------------------------------------------------------------------------------

#: Pauses between two tries of a batch (or a fetch) while the database is away: a restart or a failover
#: shorter than the run's lease fails nothing (decision 0104).
RETRY_PAUSES = (0.1, 0.25, 0.5, 1.0)
DEFAULT_LEASE_SECONDS = 60.0


class DatabaseOutage(RuntimeError):
    """The database stayed unreachable (or blocked) for longer than the run's lease: the run fails."""


class BatchHeldOpen(DatabaseOutage):
    """The worker's own batch transaction stayed idle past ``idle_in_transaction_session_timeout``
    (lease / 2, decision 0101), so the server ended it: the worker computes inside ``ctx.commit``. Not
    the database's fault, and trying again would hold it again (decision 0145)."""


#: The server ended a transaction left idle past ``idle_in_transaction_session_timeout``.
IDLE_IN_TRANSACTION_SQLSTATE = "25P03"


def lease_of(run: WorkerRun) -> float:
    """A claimed run's lease, as its claim set it (``lease_expires_at - heartbeat_at``, one ``now()``)."""
    if run.lease_expires_at is not None and run.heartbeat_at is not None:
        seconds = (run.lease_expires_at - run.heartbeat_at).total_seconds()
        if seconds > 0:
            return seconds
    return DEFAULT_LEASE_SECONDS


def _held_open(what: str, bound_seconds: float, exc: BaseException) -> BatchHeldOpen:
    return BatchHeldOpen(
        f"the worker held its batch transaction open longer than lease/2 ({bound_seconds / 2:g} s, the "
        f"database's idle_in_transaction_session_timeout) during {what}: compute before ctx.commit, not "
        f"inside it ({describe_database_error(exc)})")


def retry_database(what: str, attempt: Callable[[], T], bound_seconds: float) -> T:
    """``attempt()``, tried again on a new connection while the database is ``unreachable`` or
    ``blocked`` (decision 0103), for at most ``bound_seconds`` after the first failure (decision 0104);
    then ``DatabaseOutage``. The batch fence's refusal is ``LeaseLost``; any other error is raised.

    A transaction the server ended for idling (25P03) is tried once more (a child that was frozen and
    resumed deserves it: the fence then decides); twice in a row, the attempt itself holds it open, and
    ``BatchHeldOpen`` names that cause at once instead of "the database stayed blocked"."""
    retries = _Retries(what, bound_seconds)
    while True:
        try:
            return attempt()
        except DBAPIError as exc:
            if is_batch_fence_refusal(exc):
                first = (str(getattr(exc, "orig", exc)).strip().splitlines() or ["LeaseLost"])[0]
                raise LeaseLost(first.removeprefix("LeaseLost: ")) from None
            state = classify_database_error(exc)
            if state not in ("unreachable", "blocked"):
                raise
            retries.wait_after(exc, state)


@dataclass
class _Retries:
    """Where one ``retry_database`` stands: its deadline (set by the first failure), the tries so far
    (they pick the pause) and the idle-transaction ends in a row (two name ``BatchHeldOpen``)."""

    what: str
    bound_seconds: float
    deadline: float | None = None
    tries: int = 0
    idled: int = 0

    def wait_after(self, exc: DBAPIError, state: str) -> None:
        """Pause before the next try, or raise what ends the retries: ``BatchHeldOpen`` or ``DatabaseOutage``."""
        sqlstate = getattr(getattr(exc, "orig", None), "sqlstate", None)
        self.idled = self.idled + 1 if sqlstate == IDLE_IN_TRANSACTION_SQLSTATE else 0
        if self.idled >= 2:
            raise _held_open(self.what, self.bound_seconds, exc) from None
        now = time.monotonic()
        self.deadline = self.deadline if self.deadline is not None else now + self.bound_seconds
        if now >= self.deadline:
            raise self._gave_up(exc, state) from None
        pause = RETRY_PAUSES[min(self.tries, len(RETRY_PAUSES) - 1)]
        self.tries += 1
        print(f"database {state} during {self.what} (try {self.tries}): {describe_database_error(exc)}; "
              f"trying again in {pause:g} s", file=sys.stderr, flush=True)
        time.sleep(min(pause, max(0.0, self.deadline - now)))

    def _gave_up(self, exc: DBAPIError, state: str) -> DatabaseOutage:
        """The bound is out: an idle end is still the attempt's own doing, anything else the database's."""
        if self.idled:
            return _held_open(self.what, self.bound_seconds, exc)
        return DatabaseOutage(
            f"the database stayed {state} for longer than the run's lease ({self.bound_seconds:g} s) "
            f"during {self.what}: {describe_database_error(exc)}")


class RunContext:
    """Everything a worker receives: the run, its effective config, the database, progress and the fence."""

    def __init__(
        self,
        run: WorkerRun,
        config: ResolvedConfig,
        engine: Engine,
        channel: ChildChannel,
        *,
        spec: WorkerSpec | None = None,
    ) -> None:
        if run.runner_id is None:
            raise ValueError("a RunContext needs a claimed run (runner_id is set)")
        self.run = run
        self.config = config
        self.engine = engine
        self.channel = channel
        self.spec = spec
        self.runner_id: uuid.UUID = run.runner_id
        self.result: dict[str, Any] = {}
        self.done = 0
        self.total: int | None = None
        self.batch_index = 0
        self.unit = spec.unit if spec is not None else "unit"
        self._started = time.monotonic()
        self._model: Any = None
        self._model_loaded = False

    @property
    def options(self) -> dict[str, Any]:
        return self.config.options

    @property
    def run_id(self) -> uuid.UUID:
        return self.run.run_id

    def cancelled(self) -> bool:
        return self.channel.cancel_requested()

    def report_progress(self, done: int, total: int | None = None, unit: str | None = None, **extra: Any) -> None:
        self.done, self.total = done, total if total is not None else self.total
        elapsed = max(time.monotonic() - self._started, 1e-9)
        self.channel.send_progress(
            {"done": done, "total": self.total, "unit": unit or self.unit,
             "batch": self.batch_index, "rate": round(done / elapsed, 3), **extra}
        )

    def get_engine(self, spec: WorkerSpec | None = None) -> Any:
        """Load (once) the run's engine, as resolved; None for a worker without one.

        The runner's child builds the context with the worker's spec (``RunContext(..., spec=spec)``);
        a worker passes its own ``spec`` here so that a context built without one (a test harness) can
        still load it.
        """
        if spec is not None and self.spec is None:
            self.spec = spec
            self.unit = spec.unit
        if not self._model_loaded:
            if self.spec is None:
                raise RuntimeError("get_engine needs the worker's spec")
            self._model = self.spec.get_engine(self.config)
            self._model_loaded = True
        return self._model

    @property
    def lease_seconds(self) -> float:
        """The run's lease, as its claim set it."""
        return lease_of(self.run)

    def commit(self, write: Callable[[Connection], T]) -> T:
        """Run ``write`` in one transaction fenced by the run's lease *at COMMIT* (decision 0100).

        The transaction's first statement registers the fence (``ledger.register_batch_fence``: refused
        at once when the lease is already gone); the database checks it again when the transaction
        commits, so a batch whose COMMIT comes after the lease has ended (a child frozen or cut off
        mid-batch) is rolled back whole, and no row lock is held while ``write`` runs. Either refusal
        raises ``LeaseLost``: the child must write nothing more.

        A database restart or failover shorter than the lease fails nothing: the batch is tried again on
        a new connection (the stamps make it idempotent) until one lease has passed since the first
        failure; then ``DatabaseOutage``.
        """
        def attempt() -> T:
            with self.engine.begin() as conn:
                if not register_batch_fence(conn, self.run.run_id, self.runner_id):
                    raise LeaseLost(f"run {self.run.run_id} is no longer held by runner {self.runner_id}")
                return write(conn)

        return self._retrying(f"batch {self.batch_index}", attempt)

    def _retrying(self, what: str, attempt: Callable[[], T]) -> T:
        """``attempt()``, tried again while the database is unreachable or blocked, for at most one lease."""
        return retry_database(what, attempt, self.lease_seconds)

    def batches(self, fetch: Callable[[Connection, int], list[T]]) -> Iterator[list[T]]:
        """Yield batches of at most ``db_batch_size`` pending units until ``fetch`` returns none.

        The cancellation check lives here, once per batch boundary, so no worker can forget it.
        """
        size = self.config.db_batch_size
        while True:
            if self.cancelled():
                raise RunCancelled(f"cancelled after {self.done} units")
            batch = self._retrying(f"the fetch of batch {self.batch_index + 1}",
                                   lambda: self._fetch(fetch, size))
            if not batch:
                return
            self.batch_index += 1
            yield batch

    def _fetch(self, fetch: Callable[[Connection, int], list[T]], size: int) -> list[T]:
        with self.engine.connect() as conn:
            return fetch(conn, size)

    def tally(self, units: int = 0, **counters: int) -> None:
        """Add a committed batch to the summary (``ctx.result``) and report progress.

        Call it only after the batch's ``commit`` returned: the summary then holds exactly what was
        committed, which is what a cancelled run reports.
        """
        for key, value in counters.items():
            self.result[key] = self.result.get(key, 0) + value
        self.result["batches"] = self.batch_index
        self.report_progress(self.done + units)
        self.result["units"] = self.done
