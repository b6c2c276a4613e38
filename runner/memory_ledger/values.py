"""What the in-memory ledger computes as PostgreSQL does: the error fingerprint (the generated column), jsonb
values, ``duration_ms``'s rounding."""
from __future__ import annotations

import json
import re
from datetime import datetime, timedelta
from typing import Any

# --- the generated column: archive_error_fingerprint (migration 0001), the same regular expressions ------

_WS = re.compile(r"\s+")
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_PATH = re.compile(r"(^|[\s'\"(=:,\[])(~?/[^\s'\"(),:\]]+)")
_HASH = re.compile(r"[0-9a-f]{16,}")
_DIGITS = re.compile(r"[0-9]+")


def error_fingerprint(error: str | None) -> str | None:
    if error is None:
        return None
    text = _WS.sub(" ", error.split("\n", 1)[0]).strip(" ").lower()
    text = _PATH.sub(r"\1<path>", _UUID.sub("<uuid>", text))
    return _DIGITS.sub("<n>", _HASH.sub("<hash>", text))[:200]


_SCALARS = frozenset({str, int, float, bool, type(None)})


class _NotPlain(Exception):
    pass


def _copy_plain(value: Any) -> Any:
    kind = type(value)
    if kind in _SCALARS:
        return value
    if kind is dict:
        out = {}
        for key, item in value.items():
            if type(key) is not str:
                raise _NotPlain
            out[key] = _copy_plain(item)
        return out
    if kind is list:
        return [_copy_plain(item) for item in value]
    raise _NotPlain


def jsonb(value: Any) -> Any:
    """What a value becomes through ``CAST(:x AS jsonb)`` of the ledger's ``_json`` and back. Plain JSON
    (dicts with str keys, lists, scalars: the usual case) is only copied; anything else (tuples, uuids,
    datetimes, non-str keys) goes through ``json`` as the ledger's ``_json`` sends it."""
    if value is None:
        return None
    try:
        return _copy_plain(value)
    except _NotPlain:
        return json.loads(json.dumps(value, default=str))


def duration_ms(now: datetime, started_at: datetime | None) -> int | None:
    """``GREATEST(0, extract(epoch FROM now - started_at) * 1000)::bigint`` (the cast rounds half up)."""
    if started_at is None:
        return None
    micros = (now - started_at) // timedelta(microseconds=1)
    return max(0, (micros + 500) // 1000) if micros > 0 else 0


def seconds(value: float) -> timedelta:
    return timedelta(seconds=float(value))
