"""The one JSON reader for text that comes from outside: request bodies, the ledger's notifications.

``json.loads`` recurses once per nesting level and raises ``RecursionError`` (no ``ValueError``) on a
few thousand ``[``; whatever walks the value afterwards (pydantic, the storable-value checks) recurses
too. So the nesting depth is measured first, without recursion and without parsing (strings are
skipped by one regular expression, then only the brackets are counted), and a text over its size or
depth bound is refused before ``json.loads`` sees it. Every refusal is a ``JsonRefused`` whose
``reason`` is a stable code (``too_large``, ``too_deep``, ``not_json``) and whose message says what
the bound is: the API answers it as a 4xx, the event relay drops the notification and counts it.
"""
from __future__ import annotations

import json
import re
from typing import Any

#: A request body: a run request or settings are a few hundred bytes, a schedule a little more.
BODY_MAX_BYTES = 1024 * 1024
BODY_MAX_DEPTH = 32
#: A notification: PostgreSQL's own bound on a NOTIFY payload is 8000 bytes; the ledger's are flat.
EVENT_MAX_BYTES = 8000
EVENT_MAX_DEPTH = 1

_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")


class JsonRefused(ValueError):
    """The text is not JSON within the bounds; ``reason``: too_large | too_deep | not_json."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def nesting_depth(text: str) -> int:
    """The deepest nesting of arrays and objects in ``text`` (brackets inside strings do not count).
    Linear, no recursion: strings are removed, then only the bracket characters are walked."""
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    depth = deepest = 0
    for char in brackets:
        if char in "[{":
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


def loads(data: str | bytes, *, max_bytes: int = BODY_MAX_BYTES, max_depth: int = BODY_MAX_DEPTH) -> Any:
    """``data`` as a JSON value, or ``JsonRefused``: over ``max_bytes`` (UTF-8), nested deeper than
    ``max_depth``, or not JSON (invalid UTF-8 included). Never raises anything else."""
    size = len(data) if isinstance(data, bytes) else len(data.encode("utf-8", errors="surrogatepass"))
    if size > max_bytes:
        raise JsonRefused("too_large", f"is larger than {max_bytes} bytes ({size})")
    try:
        text = data.decode("utf-8") if isinstance(data, bytes) else data
    except UnicodeDecodeError:
        raise JsonRefused("not_json", "is not valid UTF-8") from None
    depth = nesting_depth(text)
    if depth > max_depth:
        raise JsonRefused("too_deep", f"is nested deeper than {max_depth} levels ({depth})")
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as exc:  # RecursionError: the depth bound above makes it moot
        detail = exc.msg if isinstance(exc, json.JSONDecodeError) else type(exc).__name__
        raise JsonRefused("not_json", f"is not valid JSON ({detail})") from None
