"""The NER engine: a transformers token-classification model from a local directory, with aggregation."""
from __future__ import annotations

from typing import Any

from scrinalia.domains.archive.workers.engines.common import (
    DEVICE,
    DEVICE_PRESETS,
    DTYPE,
    describe_local_model,
    load_pretrained,
    model_dir_option,
    model_hint,
    require_model_dir,
)
from scrinalia.domains.archive.workers.sdk import EngineSpec, OptionSpec

#: Labels other models use for the four the archive keeps.
LABEL_ALIASES = {
    "PER": "PER", "PERSON": "PER", "PERS": "PER",
    "ORG": "ORG", "ORGANIZATION": "ORG", "ORGANISATION": "ORG",
    "LOC": "LOC", "LOCATION": "LOC", "GPE": "LOC", "PLACE": "LOC",
    "MISC": "MISC", "MISCELLANEOUS": "MISC",
}

OPTIONS = {
    "model": model_dir_option("a local token-classification model directory (required)",
                              required_hint=model_hint("ner", "token-classification (NER)")),
    "device": DEVICE,
    "dtype": DTYPE,
    "batch_size": OptionSpec("int", 16, "texts per forward pass", minimum=1, maximum=1024),
    "aggregation": OptionSpec("str", "simple", "how word pieces are grouped into entities",
                              choices=("simple", "first", "average", "max")),
    "stride": OptionSpec("int", 32, "token overlap when a long text is split into windows", minimum=0,
                         maximum=256),
}


def describe(options: dict[str, Any]) -> dict[str, Any]:
    return describe_local_model(options, task="token-classification", aggregation=options["aggregation"])


class TokenClassifier:
    def __init__(self, options: dict[str, Any]) -> None:
        directory = require_model_dir(options.get("model"), "ner")
        from transformers import AutoModelForTokenClassification, pipeline

        tokenizer, model, device, _ = load_pretrained(AutoModelForTokenClassification, directory, options)
        self.model_name = directory.name
        self.batch_size = int(options["batch_size"])
        self.pipe = pipeline("token-classification", model=model, tokenizer=tokenizer, device=device,
                             aggregation_strategy=options["aggregation"])
        self.stride = None
        max_len = getattr(tokenizer, "model_max_length", None) or 0
        if getattr(tokenizer, "is_fast", False) and options["stride"] and 0 < max_len < 100_000:
            self.stride = min(int(options["stride"]), max_len // 4)

    def extract(self, texts: list[str]) -> list[list[dict[str, Any]]]:
        """Per text: entities as {label, text, start, end, score}, label mapped to PER/ORG/LOC/MISC."""
        kwargs: dict[str, Any] = {"batch_size": self.batch_size}
        if self.stride:
            kwargs["stride"] = self.stride
        raw = self.pipe(list(texts), **kwargs)
        if texts and raw and isinstance(raw[0], dict):
            raw = [raw]
        out = []
        for text, entities in zip(texts, raw, strict=True):
            found = (_entity(text, ent) for ent in entities)
            out.append([e for e in found if e is not None])
        return out


def _entity(text: str, ent: dict[str, Any]) -> dict[str, Any] | None:
    """One pipeline entity as {label, text, start, end, score}; None for a label outside PER/ORG/LOC/MISC."""
    group = str(ent.get("entity_group") or ent.get("entity") or "").upper()
    group = group.split("-", 1)[-1] if group[:2] in ("B-", "I-") else group
    label = LABEL_ALIASES.get(group)
    if label is None:
        return None
    start, end = ent.get("start"), ent.get("end")
    surface = text[int(start):int(end)] if start is not None and end is not None else ent.get("word", "")
    return {"label": label, "text": surface, "start": start, "end": end, "score": float(ent.get("score", 0.0))}


TOKEN_CLASSIFICATION = EngineSpec(
    name="transformers-token-classification",
    description="transformers token classification with entity aggregation, from a local model directory",
    load=TokenClassifier,
    describe=describe,
    options=OPTIONS,
    presets=DEVICE_PRESETS,
)
