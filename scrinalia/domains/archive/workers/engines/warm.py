"""Warm models: weights loaded once on the CPU by the runner's fork server, inherited by its children.

Why: every child used to pay ``from_pretrained`` (the bundled model: ~3.4 s in a fresh child, transformers'
lazy imports then the weights). The fork server (which never initialises CUDA) loads the models of the
workers kept warm, on the CPU, before it forks; a child forked after inherits the tensors copy-on-write
(reading a weight never copies its page) and builds its engine from them: on the CPU it uses them as
they are, on a GPU it moves them to its own device. Nothing else is shared: the tokenizer and the model
objects are the fork server's, each child holds its own copy-on-write view of them.

A child whose run asks for something not warm (another model directory, another dtype) loads it from
disk (a *cold* load) as before and says so in its metrics (``model_loads``); the supervisor then asks the
fork server to warm that one instead, so the next run is warm again (decision 0340).

This module never imports torch at import time: the API imports the engines' modules to describe them.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DTYPES = ("float32", "float16", "bfloat16")


@dataclass(frozen=True, slots=True)
class WarmKey:
    """What a warm model is: its transformers Auto class, its directory (resolved), its dtype's name."""

    model_class: str
    model_dir: str
    dtype: str

    @classmethod
    def of(cls, model_class: Any, directory: Path | str, dtype: str) -> WarmKey:
        name = model_class if isinstance(model_class, str) else model_class.__name__
        return cls(name, str(Path(directory).expanduser().resolve()), dtype)

    def to_json(self) -> dict[str, str]:
        return {"model_class": self.model_class, "model_dir": self.model_dir, "dtype": self.dtype}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> WarmKey:
        return cls(str(data["model_class"]), str(data["model_dir"]), str(data["dtype"]))


@dataclass(slots=True)
class WarmModel:
    key: WarmKey
    tokenizer: Any
    model: Any
    nbytes: int
    load_seconds: float
    workers: set[str] = field(default_factory=set)

    def describe(self) -> dict[str, Any]:
        return {**self.key.to_json(), "bytes": self.nbytes, "load_seconds": self.load_seconds,
                "workers": sorted(self.workers)}


# This process's warm models (the fork server's; a child's inherited copy-on-write view of them).
_WARM: dict[WarmKey, WarmModel] = {}
# What this process's engines loaded, warm or cold (a child reports it in its run's metrics).
LOADS: list[dict[str, Any]] = []


def model_bytes(model: Any) -> int:
    """The bytes of a model's parameters and buffers (what the fork server holds for it)."""
    tensors = list(model.parameters()) + list(model.buffers())
    return int(sum(t.numel() * t.element_size() for t in tensors))


def auto_class(name: str) -> Any:
    import transformers

    cls = getattr(transformers, name, None)
    if cls is None or not name.startswith("Auto"):
        raise ValueError(f"not a transformers Auto class: {name!r}")
    return cls


def warm(key: WarmKey) -> WarmModel:
    """Load ``key`` on the CPU into this process's warm models (the fork server calls it); already
    warm: returned as it is."""
    held = _WARM.get(key)
    if held is not None:
        return held
    import torch
    from transformers import AutoTokenizer

    if key.dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {key.dtype!r}")
    started = time.monotonic()
    tokenizer = AutoTokenizer.from_pretrained(key.model_dir)
    model = auto_class(key.model_class).from_pretrained(key.model_dir, dtype=getattr(torch, key.dtype)).eval()
    entry = WarmModel(key, tokenizer, model, model_bytes(model), round(time.monotonic() - started, 3))
    _WARM[key] = entry
    return entry


def drop(key: WarmKey) -> bool:
    """Forget a warm model (its memory returns when no child still maps its pages)."""
    return _WARM.pop(key, None) is not None


def held() -> list[WarmModel]:
    return list(_WARM.values())


def take(key: WarmKey) -> WarmModel | None:
    """The warm model for ``key`` in this process, if the fork server had it when this child was forked."""
    return _WARM.get(key)


def record_load(key: WarmKey, warm_hit: bool, seconds: float) -> None:
    LOADS.append({**key.to_json(), "warm": warm_hit, "seconds": round(seconds, 4)})
