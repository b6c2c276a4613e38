"""``per_unit``: a failing batch is retried unit by unit; a batch in which every unit fails is the engine's fault."""
from __future__ import annotations

import pytest

from scrinalia.domains.archive.workers.base import SystematicFailure, per_unit


def _upper_unless_bad(items: list[str]) -> list[str]:
    if "bad" in items:
        raise ValueError("cannot read bad")
    return [s.upper() for s in items]


def test_a_good_batch_runs_once():
    calls = []

    def fn(items):
        calls.append(items)
        return _upper_unless_bad(items)

    assert per_unit(["a", "b"], fn) == [("A", None), ("B", None)]
    assert calls == [["a", "b"]]


def test_one_bad_unit_is_an_error_and_the_others_are_done():
    assert per_unit(["a", "bad", "c"], _upper_unless_bad) == [
        ("A", None), (None, "ValueError: cannot read bad"), ("C", None)]


def test_a_wrong_number_of_results_is_retried_unit_by_unit():
    assert per_unit(["a", "b"], lambda items: [s.upper() for s in items][:1]) == [("A", None), ("B", None)]


def test_every_unit_failing_fails_the_run_but_a_single_unit_is_just_an_error():
    with pytest.raises(SystematicFailure, match="cannot read bad"):
        per_unit(["bad", "bad"], _upper_unless_bad)
    assert per_unit(["bad"], _upper_unless_bad) == [(None, "ValueError: cannot read bad")]
