"""Which models the fork server keeps warm at its start (``--warm-models``, decision 0340).

The supervisor never imports torch: this reads the catalogue and a directory's existence only; the fork
server loads what it names (``scrinalia.domains.archive.workers.engines.warm``).

* ``auto`` (the default): the bundled all-MiniLM-L6-v2, float32 (a child on the CPU: the dtype ``auto``
  resolves to there), for the served workers whose default engine uses it (``embedding``, ``typology``
  by similarity); only when transformers is preloaded (a fork server without transformers would spend
  its start importing it: ``--preload none`` keeps the fork server light, and the tests use it).
* ``none``: nothing; the children load from disk, as before.
* ``DIR[:DTYPE],...``: these directories (AutoModel, float32 unless a dtype is given), for every worker.

A run whose settings name something else (another directory, another dtype, float16 on a GPU) loads it
cold once; the supervisor then asks the fork server to warm it (``runner.tending.Exits``).
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from runner.options import OptionsError, RunnerOptions

log = logging.getLogger("scrinalia.runner")

# The engines that load the bundled model through ``engines.common.load_pretrained`` with AutoModel.
BUNDLED_ENGINES = ("transformers", "embedding-similarity")
DTYPES = ("float32", "float16", "bfloat16")
FLAG_WORKERS = ("--warm-models",)  # what a directory named by the flag is kept for (never replaced)

WarmStart = tuple[tuple[dict[str, str], tuple[str, ...]], ...]


def warm_start(options: RunnerOptions, catalogue: Any, capabilities: list[str]) -> WarmStart:
    """The (key, workers) pairs the fork server loads before it says "ready"."""
    value = (options.warm_models or "auto").strip()
    if value == "none" or options.warm_limit_mb <= 0:
        return ()
    if value == "auto":
        return _auto(options, catalogue, capabilities)
    return tuple((_key(d), FLAG_WORKERS) for d in _flag_dirs(value))


def _key(directory_and_dtype: tuple[str, str]) -> dict[str, str]:
    directory, dtype = directory_and_dtype
    return {"model_class": "AutoModel", "model_dir": str(Path(directory).expanduser().resolve()), "dtype": dtype}


def _flag_dirs(value: str) -> list[tuple[str, str]]:
    out = []
    for item in (part.strip() for part in value.split(",")):
        if not item:
            continue
        directory, _, dtype = item.partition(":")
        dtype = dtype or "float32"
        if dtype not in DTYPES:
            raise OptionsError(f"--warm-models: {item!r}: the dtype must be one of {', '.join(DTYPES)}")
        if not (Path(directory).expanduser() / "config.json").is_file():
            log.warning("--warm-models: %s is not a model directory here (no config.json); not kept warm", directory)
            continue
        out.append((directory, dtype))
    return out


def _auto(options: RunnerOptions, catalogue: Any, capabilities: list[str]) -> WarmStart:
    if "transformers" not in options.preload:
        return ()
    workers = tuple(sorted(name for name in capabilities
                           if getattr(catalogue.get(name), "default_engine", None) in BUNDLED_ENGINES))
    if not workers:
        return ()
    from scrinalia.domains.archive.workers.engines.embedding import bundled_model_dir

    bundled = bundled_model_dir()
    if bundled is None or not (bundled / "config.json").is_file():
        return ()
    return ((_key((str(bundled), "float32")), workers),)


def registry_view(info: Any) -> dict[str, Any] | None:
    """What the heartbeat writes into the registry row (``warm``, decision 0381) from the launcher's warm
    models (``ForkServerLauncher.warm_info``): each model's class, directory, dtype, bytes and workers,
    the total and the limit. None: the launcher keeps no warm models (plain spawn), nothing is written."""
    if not isinstance(info, dict) or not info:
        return None
    models = [{k: m.get(k) for k in ("model_class", "model_dir", "dtype", "bytes", "workers")}
              for m in info.get("models") or [] if isinstance(m, dict)]
    return {"models": models, "bytes": int(info.get("bytes") or 0), "limit_bytes": int(info.get("limit_bytes") or 0)}
