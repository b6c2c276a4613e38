"""What a runner can see of the model directories its workers are configured with (decision 0145).

A model directory lives on the runner's host, which the API cannot see: a Settings page that saved a
path that exists nowhere let every later run fail ``EngineUnavailable``. So each daemon reports, when it
registers, the directories it sees (``archive_worker_runners.sees``, ``{"model_dirs": [...]}``): the
``path`` options of its workers as their settings and defaults resolve now, and every directory with a
``config.json`` under ``SCRINALIA_MODEL_ROOTS`` (colon-separated, two levels deep). The API's Settings
then says when a path is unknown to every online runner of the worker that reports what it sees.
"""
from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from sqlalchemy import Engine

from scrinalia.domains.archive.workers.sdk import OptionSpec, ResolvedConfig, WorkerSpec

ROOTS_ENV = "SCRINALIA_MODEL_ROOTS"
MAX_REPORTED = 500
MAX_PATH = 4096


def path_values(spec: WorkerSpec, resolved: ResolvedConfig) -> dict[str, str]:
    """field -> directory for every ``path`` option of ``spec`` (and its engine) that ``resolved`` sets."""
    out = _set_paths("options", spec.options, resolved.options)
    engine = spec.engines.get(resolved.engine_name) if resolved.engine_name else None
    if engine is not None:
        out.update(_set_paths("engine_options", engine.options, resolved.engine_options))
    return out


def _set_paths(section: str, declared: Mapping[str, OptionSpec], values: Mapping[str, Any]) -> dict[str, str]:
    """``section.name`` -> value for each declared ``path`` option whose value is a non-empty string."""
    out: dict[str, str] = {}
    for name, ospec in declared.items():
        value = values.get(name)
        if ospec.type == "path" and isinstance(value, str) and value:
            out[f"{section}.{name}"] = value
    return out


def _candidates(catalogue: Mapping[str, WorkerSpec], capabilities: Iterable[str], engine: Engine | None) -> set[str]:
    found: set[str] = set()
    for name in capabilities:
        spec = catalogue.get(name)
        if spec is None:
            continue
        for eng in spec.engines.values():  # every engine's default directory
            found.update(o.default for o in eng.options.values() if o.type == "path" and isinstance(o.default, str))
        try:
            found.update(path_values(spec, spec.resolve(engine, {})).values())
        except Exception:  # unresolvable (a required model unset) or the database away: nothing to look at
            continue
    return found


def _under_roots(roots: Iterable[str]) -> set[str]:
    found: set[str] = set()
    for root in roots:
        base = Path(root)
        for pattern in ("*/config.json", "*/*/config.json"):
            try:
                found.update(str(p.parent) for p in base.glob(pattern))
            except OSError:
                continue
    return found


def seen_model_dirs(catalogue: Mapping[str, WorkerSpec], capabilities: Iterable[str], engine: Engine | None,
                    roots: str | None = None) -> dict[str, Any]:
    """The registry's ``sees``: the directories among the workers' configured paths that exist here,
    and those under ``SCRINALIA_MODEL_ROOTS``; at most ``MAX_REPORTED``."""
    roots = os.environ.get(ROOTS_ENV, "") if roots is None else roots  # never fails a start: best effort
    listed = [r for r in roots.split(":") if r.strip()]
    dirs = {d for d in _candidates(catalogue, capabilities, engine) if len(d) <= MAX_PATH and os.path.isdir(d)}
    dirs |= {d for d in _under_roots(listed) if len(d) <= MAX_PATH}
    return {"model_dirs": sorted(dirs)[:MAX_REPORTED], "model_roots": listed}


def unseen_warnings(spec: WorkerSpec, resolved: ResolvedConfig, runners: Iterable[Any]) -> list[dict[str, str]]:
    """A warning per configured directory that no online runner of ``spec`` reports seeing, among the
    runners that report what they see (an older runner reports nothing and decides nothing)."""
    reporting = [r for r in runners if _reports_for(r, spec.name)]
    if not reporting:
        return []
    seen = _seen_dirs(reporting)
    names = ", ".join(sorted({r.name for r in reporting}))
    return [{"field": field_name, "message": _unseen_message(spec.name, names, directory)}
            for field_name, directory in path_values(spec, resolved).items() if directory not in seen]


def _reports_for(runner: Any, worker: str) -> bool:
    """An online runner of ``worker`` that reports the model directories it sees."""
    return (runner.state == "online" and worker in (runner.capabilities or [])
            and isinstance(runner.sees, dict) and "model_dirs" in runner.sees)


def _seen_dirs(reporting: list[Any]) -> list[Any]:
    """Every directory the reporting runners saw (their reports as they are, JSON)."""
    return [d for r in reporting for d in (r.sees.get("model_dirs") or [])]


def _unseen_message(worker: str, runners: str, directory: str) -> str:
    return (f"no online runner of {worker} ({runners}) saw {directory} when it started: if the directory is "
            "not on the runner's host, every run fails EngineUnavailable. Put the model there (or list its "
            f"parent in {ROOTS_ENV}) and restart the runner, or correct the path.")
