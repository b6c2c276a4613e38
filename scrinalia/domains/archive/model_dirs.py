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

from scrinalia.domains.archive.workers.sdk import ResolvedConfig, WorkerSpec

ROOTS_ENV = "SCRINALIA_MODEL_ROOTS"
MAX_REPORTED = 500
MAX_PATH = 4096


def path_values(spec: WorkerSpec, resolved: ResolvedConfig) -> dict[str, str]:
    """field -> directory for every ``path`` option of ``spec`` (and its engine) that ``resolved`` sets."""
    out: dict[str, str] = {}
    for name, ospec in spec.options.items():
        value = resolved.options.get(name)
        if ospec.type == "path" and isinstance(value, str) and value:
            out[f"options.{name}"] = value
    engine = spec.engines.get(resolved.engine_name or "") if resolved.engine_name else None
    for name, ospec in (engine.options.items() if engine is not None else ()):
        value = resolved.engine_options.get(name)
        if ospec.type == "path" and isinstance(value, str) and value:
            out[f"engine_options.{name}"] = value
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
    reporting = [r for r in runners if r.state == "online" and spec.name in (r.capabilities or [])
                 and isinstance(r.sees, dict) and "model_dirs" in r.sees]
    if not reporting:
        return []
    names = ", ".join(sorted({r.name for r in reporting}))
    out = []
    for field_name, directory in path_values(spec, resolved).items():
        if any(directory in (r.sees.get("model_dirs") or []) for r in reporting):
            continue
        out.append({"field": field_name, "message": (
            f"no online runner of {spec.name} ({names}) saw {directory} when it started: if the directory is "
            "not on the runner's host, every run fails EngineUnavailable. Put the model there (or list its "
            f"parent in {ROOTS_ENV}) and restart the runner, or correct the path.")})
    return out
