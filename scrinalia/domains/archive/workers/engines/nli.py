"""Zero-shot classification with an NLI model from a local directory (typology, and the quality check).

A premise (the title, or a text) is paired with a hypothesis per label ("This document is {}."); the
entailment probability is the label's score. With several labels and ``multi_label`` false the scores
are a softmax over the labels' entailment logits (they sum to 1); with one label, or ``multi_label``,
each is entailment against contradiction on its own.
"""
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

MODEL_DESCRIPTION = "a local NLI (sequence-classification with an entailment label) model directory"

OPTIONS = {
    "device": DEVICE,
    "dtype": DTYPE,
    "batch_size": OptionSpec("int", 16, "premise/hypothesis pairs per forward pass", minimum=1, maximum=1024),
}


def describe(options: dict[str, Any]) -> dict[str, Any]:
    return describe_local_model(options, task="zero-shot-classification")


class ZeroShotClassifier:
    def __init__(self, options: dict[str, Any]) -> None:
        directory = require_model_dir(options.get("model"), "nli")
        from transformers import AutoModelForSequenceClassification, pipeline

        tokenizer, model, device, _ = load_pretrained(AutoModelForSequenceClassification, directory, options)
        if not any("entail" in str(label).lower() for label in model.config.id2label.values()):
            raise ValueError(f"{directory} is not an NLI model: no 'entailment' label in {model.config.id2label}")
        self.model_name = directory.name
        self.batch_size = int(options["batch_size"])
        self.pipe = pipeline("zero-shot-classification", model=model, tokenizer=tokenizer, device=device)

    def classify(self, premises: list[str], labels: list[str], hypothesis_template: str,
                 multi_label: bool = False, descriptions: dict[str, str | None] | None = None
                 ) -> list[dict[str, float]]:
        """Per premise: {label: score}. ``descriptions`` is the similarity engine's; NLI scores names."""
        if not premises or not labels:
            return [{} for _ in premises]
        raw = self.pipe(list(premises), candidate_labels=list(labels), hypothesis_template=hypothesis_template,
                        multi_label=multi_label, batch_size=self.batch_size)
        if isinstance(raw, dict):
            raw = [raw]
        return [dict(zip(r["labels"], (float(s) for s in r["scores"]), strict=True)) for r in raw]

    def entailment(self, premises: list[str], hypothesis: str) -> list[float]:
        """Per premise: the probability that it entails ``hypothesis`` (entailment vs contradiction)."""
        scores = self.classify(premises, [hypothesis], "{}", multi_label=True)
        return [s.get(hypothesis, 0.0) for s in scores]


def nli_engine(name: str, description: str, extra_options: dict[str, OptionSpec] | None = None, *,
               required_hint: str) -> EngineSpec:
    """An NLI engine whose ``model`` is required; ``required_hint`` says where to set it."""
    model = model_dir_option(MODEL_DESCRIPTION, required_hint=required_hint)
    return EngineSpec(
        name=name,
        description=description,
        load=ZeroShotClassifier,
        describe=describe,
        options={"model": model, **OPTIONS, **(extra_options or {})},
        presets=DEVICE_PRESETS,
    )


ZERO_SHOT = nli_engine("transformers-zero-shot", "zero-shot classification with a local NLI model",
                       required_hint=model_hint("typology", "NLI"))
