"""The SDK's retry of a batch's statement (``retry_database``, decisions 0103/0104), each way out pinned
with the driver's own exception types: no database (the real outages are tests/runner's restart and
fingerprint tests). The pauses are recorded, not slept: what is pinned is which pause comes when."""
from __future__ import annotations

from collections.abc import Callable, Iterator

import psycopg
import psycopg.errors as pg
import pytest
from sqlalchemy.exc import DBAPIError

from scrinalia.domains.archive.workers import sdk
from scrinalia.domains.archive.workers.sdk import BatchHeldOpen, DatabaseOutage, LeaseLost, retry_database


class _Fenced(psycopg.Error):
    sqlstate = "SF001"


def _dbapi(orig: BaseException) -> DBAPIError:
    return DBAPIError("COMMIT", {}, orig)


def _attempts(*outcomes: BaseException | str) -> Callable[[], str]:
    """An attempt that raises each exception of ``outcomes`` in turn, then returns the first string."""
    left: Iterator[BaseException | str] = iter(outcomes)

    def attempt() -> str:
        outcome = next(left)
        if isinstance(outcome, BaseException):
            raise outcome
        return outcome
    return attempt


@pytest.fixture
def pauses(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    slept: list[float] = []
    monkeypatch.setattr(sdk.time, "sleep", slept.append)
    return slept


def test_an_unreachable_database_is_tried_again_with_growing_pauses(pauses, capsys):
    down = _dbapi(psycopg.OperationalError("connection refused"))
    assert retry_database("batch 3", _attempts(*[down] * 5, "done"), 60.0) == "done"
    assert pauses == [0.1, 0.25, 0.5, 1.0, 1.0]
    said = capsys.readouterr().err.splitlines()
    assert len(said) == 5 and said[0].startswith("database unreachable during batch 3 (try 1): OperationalError")
    assert said[4].endswith("trying again in 1 s")


def test_a_blocked_statement_is_tried_again(pauses, capsys):
    assert retry_database("batch 1", _attempts(_dbapi(pg.LockNotAvailable()), "ok"), 60.0) == "ok"
    assert pauses == [0.1] and "database blocked during batch 1 (try 1)" in capsys.readouterr().err


def test_past_the_bound_the_outage_is_named(pauses):
    with pytest.raises(DatabaseOutage) as err:
        retry_database("batch 2", _attempts(_dbapi(pg.AdminShutdown())), 0.0)
    assert type(err.value) is DatabaseOutage and pauses == []
    assert str(err.value).startswith("the database stayed unreachable for longer than the run's lease (0 s) "
                                     "during batch 2: AdminShutdown")


def test_the_fence_refusal_is_lease_lost_by_its_first_line(pauses):
    refusal = _dbapi(_Fenced("LeaseLost: run r is not held by runner x\nCONTEXT: trigger"))
    with pytest.raises(LeaseLost, match=r"^run r is not held by runner x$"):
        retry_database("batch 1", _attempts(refusal), 60.0)
    with pytest.raises(LeaseLost, match=r"^LeaseLost$"):
        retry_database("batch 1", _attempts(_dbapi(_Fenced(""))), 60.0)
    assert pauses == []


def test_any_other_error_is_raised_as_it_is(pauses):
    other = _dbapi(pg.UndefinedTable("no table"))
    with pytest.raises(DBAPIError) as err:
        retry_database("batch 1", _attempts(other), 60.0)
    assert err.value is other and pauses == []
    with pytest.raises(ValueError):
        retry_database("batch 1", _attempts(ValueError("not the database")), 60.0)


def test_an_idle_transaction_is_tried_once_more_then_named_held_open(pauses):
    idle = _dbapi(pg.IdleInTransactionSessionTimeout())
    assert retry_database("batch 1", _attempts(idle, "ok"), 4.0) == "ok"
    with pytest.raises(BatchHeldOpen) as err:
        retry_database("batch 1", _attempts(idle, idle), 4.0)
    assert str(err.value).startswith("the worker held its batch transaction open longer than lease/2 (2 s, ")
    blocked = _dbapi(pg.LockNotAvailable())
    assert retry_database("batch 1", _attempts(idle, blocked, idle, "ok"), 4.0) == "ok"  # not twice in a row
    with pytest.raises(BatchHeldOpen):
        retry_database("batch 1", _attempts(idle), 0.0)  # idle, and the bound is out: the same cause
    assert pauses == [0.1, 0.1, 0.1, 0.25, 0.5]
