"""The run id shown to people, and finding a run from what a person typed (decision 0143).

Run ids are UUIDv7 (decision 0071): the first 12 hex digits are the millisecond clock, so the first 8
stay the same for about 65 s and four runs started within a minute all showed ``01a23340``. What a
person sees is the random tail instead: the last 12 hex digits (the UUID's last group, 48 random bits;
two runs share it with odds of about one in 10^6 among a million runs). The panel's ``format.js``
``shortId`` is the same rule, and so are the logs, the process titles and ``scrinalia-runner status``.

A short id typed into the panel or a CLI finds its run: 8 to 32 hex digits (dashes ignored) match the
tail or the head of an id (``ledger.find_run_ids``), so an old log's 8-digit prefix still finds it.
"""
from __future__ import annotations

import re
import uuid

SHORT_ID_DIGITS = 12
MIN_TYPED_DIGITS = 8
_HEX = re.compile(r"[0-9a-f]+")


def short_id(run_id: uuid.UUID | str | None) -> str:
    """The run id people see: its last 12 hex digits (``-`` for none)."""
    if run_id is None:
        return "-"
    digits = run_id.hex if isinstance(run_id, uuid.UUID) else str(run_id).replace("-", "").lower()
    return digits[-SHORT_ID_DIGITS:]


def typed_run_id(text: str) -> uuid.UUID | str | None:
    """What a person typed: a full UUID, or the hex digits of a short id (8 to 31), or None when it is
    neither (the caller says so)."""
    cleaned = text.strip().lower()
    try:
        return uuid.UUID(cleaned)
    except ValueError:
        pass
    digits = cleaned.replace("-", "")
    if MIN_TYPED_DIGITS <= len(digits) < 32 and _HEX.fullmatch(digits):
        return digits
    return None
