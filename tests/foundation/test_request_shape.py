"""The one check of a run request's shape (``ledger.check_request_shape``): each refusal names its field
and says why; a good request comes back as a ``ValidRequest``, unchanged. Pure: no database."""
from __future__ import annotations

import pytest

from scrinalia.domains.archive import ledger
from scrinalia.domains.archive.errors import InvalidRunRequest
from scrinalia.domains.archive.ledger import ValidRequest, check_request_shape, validate_request

REFUSED = [
    ([], "request", "must be an object, not list"),
    ({"engine": "x"}, "engine", "is not a request field (expected one of engine_name, preset, db_batch_size"),
    ({"zz": 1, "aa": 2}, "aa", "is not a request field"),
    ({"engine_name": ""}, "engine_name", "must be a non-empty string or null"),
    ({"preset": "  "}, "preset", "must be a non-empty string or null"),
    ({"preset": 3}, "preset", "must be a non-empty string or null"),
    ({"db_batch_size": True}, "db_batch_size", "must be an integer"),
    ({"db_batch_size": 2.0}, "db_batch_size", "must be an integer"),
    ({"db_batch_size": 0}, "db_batch_size", "must be between 1 and 10000, got 0"),
    ({"db_batch_size": 10_001}, "db_batch_size", "must be between 1 and 10000, got 10001"),
    ({"options": []}, "options", "must be an object"),
    ({"engine_options": "a"}, "engine_options", "must be an object"),
    ({"options": {"a": {1, 2}}}, "request", "must be JSON-serialisable (Object of type set"),
    ({"options": {"a": float("nan")}}, None, None),
]


@pytest.mark.parametrize(("request_", "field", "said"), REFUSED, ids=[str(r[0])[:40] for r in REFUSED])
def test_each_bad_shape_is_refused_by_its_field(request_, field, said):
    if field is None:  # json.dumps writes NaN: not a shape error (the API's JSON parser refuses it first)
        assert check_request_shape(request_) == request_
        return
    with pytest.raises(InvalidRunRequest) as err:
        check_request_shape(request_)
    assert err.value.field == field and err.value.message.startswith(said), err.value


@pytest.mark.parametrize("good", [
    {}, {"engine_name": None, "preset": None, "db_batch_size": None, "options": None, "engine_options": None},
    {"engine_name": "cpu", "preset": "fast", "db_batch_size": 1, "options": {"a": 1}, "engine_options": {}},
    {"db_batch_size": 10_000},
])
def test_a_good_shape_comes_back_unchanged_and_is_not_checked_twice(good):
    clean = check_request_shape(good)
    assert isinstance(clean, ValidRequest) and clean == good
    assert validate_request(clean) is clean


def test_every_request_field_has_its_check_in_order():
    assert tuple(ledger._FIELD_PROBLEMS) == ledger.REQUEST_KEYS
