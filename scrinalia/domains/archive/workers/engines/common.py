"""What the transformers engines share: the device and dtype options, their presets, the model directory.

``describe`` helpers read at most a model directory's ``config.json``: they never import torch, so the
API (which has no torch) can describe a request, and they never fail on a directory that exists only on
the GPU host: they say whether it exists *here*.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from scrinalia.domains.archive.workers.engines import warm
from scrinalia.domains.archive.workers.sdk import EngineUnavailable, InvalidOption, OptionSpec, Preset

DEVICE = OptionSpec(
    "str", "auto",
    "auto (cuda when the child sees a GPU, else cpu), cpu, cuda or cuda:N",
)
DTYPE = OptionSpec(
    "str", "auto", "auto (float16 on cuda, float32 on cpu), float32, float16 or bfloat16",
    choices=("auto", "float32", "float16", "bfloat16"),
)

DEVICE_PRESETS = {
    "cpu": Preset("cpu", "CPU, float32", {"device": "cpu", "dtype": "float32"}),
    "cuda": Preset("cuda", "the first CUDA device, float16", {"device": "cuda", "dtype": "float16"}),
}


def model_hint(worker: str, kind: str) -> str:
    """What to set, and where, for a model directory that no layer gives (docs/workers.md, "Models")."""
    return (f"engine_options.model must name a local {kind} model directory on the runner's host: set it in "
            f"the panel (Workers > {worker} > Settings), with PUT /api/v1/system/workers/{worker}/settings, "
            f"or in the run request (scrinalia-runner run {worker} --engine-option model=DIR); docs/workers.md "
            f"(\"Models\") says where models come from")


def model_dir_option(description: str, default: str | None = None, *, required_hint: str | None = None) -> OptionSpec:
    """A model directory option; with ``required_hint`` a run without one is refused where it is asked."""
    return OptionSpec("path", default, description, nullable=default is None,
                      required=required_hint is not None, required_hint=required_hint or "")


def describe_model_dir(path: str | None) -> dict[str, Any]:
    """What a model directory holds, read from its config.json; never loads weights."""
    if path is None:
        return {"model_dir": None, "model_dir_exists_here": False}
    directory = Path(path).expanduser()
    out: dict[str, Any] = {"model_dir": str(directory), "model_dir_exists_here": directory.is_dir()}
    config_file = directory / "config.json"
    if config_file.is_file():
        try:
            config = json.loads(config_file.read_text())
        except (OSError, ValueError):
            return out
        out["model_type"] = config.get("model_type")
        if config.get("architectures"):
            out["architecture"] = config["architectures"][0]
        if isinstance(config.get("id2label"), dict):
            out["labels"] = sorted(set(config["id2label"].values()))
    return out


def describe_device(options: dict[str, Any]) -> dict[str, Any]:
    device, dtype = options.get("device", "auto"), options.get("dtype", "auto")
    if dtype == "auto":
        dtype = "float32" if device == "cpu" else ("float16" if str(device).startswith("cuda") else
                                                      "float16 on cuda, float32 on cpu")
    return {"device": device, "dtype": dtype}


def validate_device(value: str) -> None:
    if value not in ("auto", "cpu", "cuda") and not (value.startswith("cuda:") and value[5:].isdigit()):
        raise InvalidOption("engine_options.device", f"must be auto, cpu, cuda or cuda:N, got {value!r}")


def describe_local_model(options: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """``describe`` of an engine whose ``model`` option is a local directory: the directory, the device."""
    validate_device(options["device"])
    return {**describe_model_dir(options.get("model")), **describe_device(options), **extra}


# --- load-time helpers (import torch) -------------------------------------------------------------


def torch_device(name: str):
    import torch

    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"device {name!r} was asked for but this process sees no CUDA device")
    return torch.device(name)


def torch_dtype(name: str, device):
    import torch

    if name == "auto":
        return torch.float16 if device.type == "cuda" else torch.float32
    return {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}[name]


def require_model_dir(path: str | None, what: str) -> Path:
    if not path:
        raise EngineUnavailable("engine_options.model", f"{what}: names no local model directory")
    directory = Path(path).expanduser()
    if not (directory / "config.json").is_file():
        raise EngineUnavailable("engine_options.model",
                                f"{what}: {directory} is not a local model directory on this host (no config.json)")
    return directory


def load_pretrained(model_class: Any, directory: Path, options: dict[str, Any]) -> tuple[Any, Any, Any, Any]:
    """(tokenizer, model in eval mode on its device, device, dtype) from a local model directory, with
    the ``device`` and ``dtype`` options. ``model_class``: a transformers Auto class (AutoModel...)."""
    device = torch_device(options["device"])
    dtype = torch_dtype(options["dtype"], device)
    key = warm.WarmKey.of(model_class, directory, str(dtype).replace("torch.", ""))
    started = time.monotonic()
    held = warm.take(key)
    if held is not None:
        # Inherited from the fork server (engines.warm): on the CPU the very tensors, shared copy-on-write
        # (``to`` returns the module itself); on a GPU this child's own copy on its device.
        tokenizer, model = held.tokenizer, held.model.to(device)
    else:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(str(directory))
        model = model_class.from_pretrained(str(directory), dtype=dtype).to(device).eval()
    warm.record_load(key, held is not None, time.monotonic() - started)
    return tokenizer, model, device, dtype
