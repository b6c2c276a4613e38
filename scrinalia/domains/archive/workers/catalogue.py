"""The built-in catalogue. Each worker is declared as an entry point of the group ``scrinalia.workers``
in pyproject.toml (so an institution's package adds its own the same way); this list is for code that
wants the built-ins without going through the plugin registry."""
from __future__ import annotations

from scrinalia.domains.archive.workers.cleaning import SPEC as CLEANING
from scrinalia.domains.archive.workers.embedding import SPEC as EMBEDDING
from scrinalia.domains.archive.workers.gpu_probe import SPEC as GPU_PROBE
from scrinalia.domains.archive.workers.ner import SPEC as NER
from scrinalia.domains.archive.workers.quality import SPEC as QUALITY_VALIDATOR
from scrinalia.domains.archive.workers.typology import SPEC as TYPOLOGY

BUILTIN = (EMBEDDING, NER, TYPOLOGY, QUALITY_VALIDATOR, CLEANING, GPU_PROBE)
