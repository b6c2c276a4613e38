"""Counts in words for people ("1 schedule", "3 schedules", "190/200 documents"): one rule, here."""
from __future__ import annotations


def plural_word(count: int | float | None, word: str) -> str:
    """``word`` for ``count`` of it: as it is for exactly one, else its plural (an ``s`` added, or
    ``es`` after s, x, z, ch, sh; a word that already ends in ``s`` stays)."""
    if count == 1 or not word:
        return word
    if word.endswith(("s",)):
        return word
    if word.endswith(("x", "z", "ch", "sh")):
        return word + "es"
    return word + "s"


def plural(count: int, word: str) -> str:
    """``"3 schedules"``, ``"1 schedule"``."""
    return f"{count} {plural_word(count, word)}"
