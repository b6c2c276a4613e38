"""The NER engine: a transformers token-classification model from a local directory, with aggregation."""
from __future__ import annotations

from typing import Any

from scrinalia.domains.archive.workers.engines.common import (
    DEVICE,
    DEVICE_PRESETS,
    DTYPE,
    describe_device,
    describe_model_dir,
    model_dir_option,
    require_model_dir,
    torch_device,
    torch_dtype,
    validate_device,
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
    "model": model_dir_option("a local token-classification model directory (required)"),
    "device": DEVICE,
    "dtype": DTYPE,
    "batch_size": OptionSpec("int", 16, "texts per forward pass", minimum=1, maximum=1024),
    "aggregation": OptionSpec("str", "simple", "how word pieces are grouped into entities",
                              choices=("simple", "first", "average", "max")),
    "stride": OptionSpec("int", 32, "token overlap when a long text is split into windows", minimum=0,
                         maximum=256),
}


def describe(options: dict[str, Any]) -> dict[str, Any]:
    validate_device(options["device"])
    return {**describe_model_dir(options.get("model")), **describe_device(options),
            "task": "token-classification", "aggregation": options["aggregation"]}


class TokenClassifier:
    def __init__(self, options: dict[str, Any]) -> None:
        from transformers import AutoModelForTokenClassification, AutoTokenizer, pipeline

        directory = require_model_dir(options.get("model"), "ner")
        device = torch_device(options["device"])
        dtype = torch_dtype(options["dtype"], device)
        tokenizer = AutoTokenizer.from_pretrained(str(directory))
        model = AutoModelForTokenClassification.from_pretrained(str(directory), dtype=dtype).to(device).eval()
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
        for text, entities in zip(texts, raw):
            found = []
            for ent in entities:
                group = str(ent.get("entity_group") or ent.get("entity") or "").upper()
                group = group.split("-", 1)[-1] if group[:2] in ("B-", "I-") else group
                label = LABEL_ALIASES.get(group)
                if label is None:
                    continue
                start, end = ent.get("start"), ent.get("end")
                surface = text[start:end] if start is not None and end is not None else ent.get("word", "")
                found.append({"label": label, "text": surface, "start": start, "end": end,
                              "score": float(ent.get("score", 0.0))})
            out.append(found)
        return out


def load(options: dict[str, Any]) -> TokenClassifier:
    return TokenClassifier(options)


TOKEN_CLASSIFICATION = EngineSpec(
    name="transformers-token-classification",
    description="transformers token classification with entity aggregation, from a local model directory",
    load=load,
    describe=describe,
    options=OPTIONS,
    presets=DEVICE_PRESETS,
)
