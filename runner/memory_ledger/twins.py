"""Each named query's in-memory twin: ``@statement("<name>")`` marks the method, ``TWINS`` lists them."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

#: Each named query of ``scrinalia/domains/archive/queries.sql`` -> its in-memory twin ("Class.method"),
#: filled by ``@statement``; ``tests/ledger/test_named_queries.py`` holds the two lists equal.
TWINS: dict[str, str] = {}

_Method = TypeVar("_Method", bound=Callable[..., Any])


def statement(query: str) -> Callable[[_Method], _Method]:
    """Mark a method as the in-memory twin of the named query ``query`` (its body sends
    ``self._statement(query)``: counted, and passed by the simulator's faults under that name)."""

    def mark(method: _Method) -> _Method:
        if query in TWINS:
            raise ValueError(f"two in-memory twins of {query!r}")
        TWINS[query] = method.__qualname__
        return method

    return mark
