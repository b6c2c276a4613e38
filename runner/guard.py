"""The supervisor never imports torch: an import hook that makes that a rule, not a hope.

CUDA must never be initialised in the supervisor (a CUDA context does not survive a fork, and a CUDA
fault in the parent would take every run down), and the supervisor's memory must stay small. The
catalogue is import-light by contract (``WorkerSpec`` never imports an engine at module level), so the
supervisor installs this hook before loading it: a plugin that imports torch at import time fails with a
message that says what to move, and an optional ``try: import torch`` simply sees torch as absent.
"""
from __future__ import annotations

import importlib.abc
import sys

FORBIDDEN = ("torch", "transformers", "tensorflow", "jax", "sentence_transformers")


class HeavyImportForbidden(ImportError):
    pass


class _Guard(importlib.abc.MetaPathFinder):
    def __init__(self, names: tuple[str, ...]) -> None:
        self.names = names

    def find_spec(self, fullname, path=None, target=None):  # importlib protocol
        top = fullname.partition(".")[0]
        if top in self.names:
            raise HeavyImportForbidden(
                f"the runner's supervisor must never import {top!r} (CUDA must not be initialised in it): "
                f"import it inside the worker's engine loader, which runs in the child",
                name=fullname,
            )
        return None


def forbid_heavy_imports(names: tuple[str, ...] = FORBIDDEN) -> None:
    """Install the hook (idempotent). Raises if one of ``names`` is already imported."""
    already = heavy_modules_loaded(names)
    if already:
        raise HeavyImportForbidden(f"already imported in the supervisor: {', '.join(already)}")
    if not any(isinstance(f, _Guard) for f in sys.meta_path):
        sys.meta_path.insert(0, _Guard(names))


def heavy_modules_loaded(names: tuple[str, ...] = FORBIDDEN) -> list[str]:
    return sorted(n for n in names if n in sys.modules)
