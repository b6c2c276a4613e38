"""The plugin registry of workers.

Workers are found through the entry-point group ``scrinalia.workers`` (each entry point names a
``WorkerSpec``, or a list of them), so an institution adds its own by installing a package. The
environment variable ``SCRINALIA_WORKER_PLUGINS`` (comma-separated ``module:attribute``) adds more
without packaging, which is how the tests register their test workers in real runner processes.
"""
from __future__ import annotations

import importlib
import os
from collections.abc import Iterable
from importlib.metadata import entry_points

from scrinalia.domains.archive.workers.sdk import WorkerSpec

ENTRY_POINT_GROUP = "scrinalia.workers"
ENV_VAR = "SCRINALIA_WORKER_PLUGINS"


class PluginError(RuntimeError):
    pass


def _specs_from(obj: object, origin: str) -> list[WorkerSpec]:
    if callable(obj) and not isinstance(obj, WorkerSpec):
        obj = obj()
    if isinstance(obj, WorkerSpec):
        return [obj]
    if isinstance(obj, Iterable):
        specs = list(obj)
        if all(isinstance(s, WorkerSpec) for s in specs):
            return specs
    raise PluginError(f"{origin} does not name a WorkerSpec or a list of them")


def _load_reference(reference: str) -> object:
    module_name, _, attribute = reference.strip().partition(":")
    if not module_name or not attribute:
        raise PluginError(f"{ENV_VAR} entry {reference!r} must look like module:attribute")
    module = importlib.import_module(module_name)
    try:
        return getattr(module, attribute)
    except AttributeError:
        raise PluginError(f"{reference!r}: module {module_name} has no attribute {attribute}") from None


def load_catalogue(extra: str | None = None) -> dict[str, WorkerSpec]:
    """Every worker, by name. A name declared twice is an error (it would be ambiguous to claim)."""
    catalogue: dict[str, WorkerSpec] = {}

    def add(specs: list[WorkerSpec], origin: str) -> None:
        for spec in specs:
            if spec.name in catalogue and catalogue[spec.name] is not spec:
                raise PluginError(f"worker {spec.name!r} is declared twice (again by {origin})")
            catalogue[spec.name] = spec

    for ep in entry_points(group=ENTRY_POINT_GROUP):
        add(_specs_from(ep.load(), f"entry point {ep.name}"), f"entry point {ep.name}")
    references = extra if extra is not None else os.environ.get(ENV_VAR, "")
    for reference in filter(None, (r.strip() for r in references.split(","))):
        add(_specs_from(_load_reference(reference), reference), reference)
    return dict(sorted(catalogue.items()))
