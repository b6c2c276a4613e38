"""``scrinalia runs show``: each way it answers, on a real ledger (in-process through click's runner;
tests/api/test_short_ids.py runs the installed command once): a run by its UUID or short id, as text or
JSON, a short id several runs share (exit 2, the candidates listed), not an id (2), no such run (1)."""
from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import pytest
from click.testing import CliRunner
from sqlalchemy import Engine, text

from scrinalia.cli.runs import command
from scrinalia.settings import get_settings

FAILED_RUN = uuid.UUID("0190a1b2-c3d4-7e5f-8a6b-111111111111")
TWIN_A = uuid.UUID("0190a1b2-c3d4-7e5f-8a6b-22222222aaaa")
TWIN_B = uuid.UUID("0190a1b2-c3d4-7e5f-8a6b-33332222aaaa")
DONE_RUN = uuid.UUID("0190a1b2-c3d4-7e5f-8a6b-444444444444")


@pytest.fixture
def show(engine: Engine, database_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[CliRunner]:
    with engine.begin() as conn:
        for run_id, status, reason, error in ((FAILED_RUN, "FAILED", "exception", "boom: bad input\n  at line 2"),
                                              (TWIN_A, "CANCELLED", None, None), (TWIN_B, "CANCELLED", None, None),
                                              (DONE_RUN, "SUCCESS", None, None)):
            conn.execute(text(
                "INSERT INTO archive_worker_runs (run_id, worker_name, status, trigger, request, exit_reason, "
                "error, finished_at) VALUES (:r, 'alpha', CAST(:s AS worker_run_status), 'API', '{}', :x, :e, now())"),
                {"r": run_id, "s": status, "x": reason, "e": error})
    monkeypatch.setenv("DATABASE_URL", database_url)
    get_settings.cache_clear()
    yield CliRunner()
    get_settings.cache_clear()


def test_a_run_is_shown_by_its_uuid_or_short_id(show: CliRunner) -> None:
    failed = show.invoke(command, ["show", "111111111111"])
    assert failed.exit_code == 0, failed.output
    assert failed.stdout.splitlines() == [f"run 111111111111 ({FAILED_RUN}) alpha: FAILED (exception)",
                                          "boom: bad input"]
    done = show.invoke(command, ["show", str(DONE_RUN)])
    assert done.exit_code == 0 and done.stdout == f"run 444444444444 ({DONE_RUN}) alpha: SUCCESS\n", done.output
    as_json = show.invoke(command, ["show", "--json", str(DONE_RUN)])
    assert as_json.exit_code == 0 and json.loads(as_json.stdout)["run_id"] == str(DONE_RUN), as_json.output


def test_a_short_id_several_runs_share_lists_them(show: CliRunner) -> None:
    shared = show.invoke(command, ["show", "2222aaaa"])
    assert shared.exit_code == 2, shared.output
    lines = shared.stderr.splitlines()
    assert lines[0] == "2 runs have an id with 2222aaaa; give more digits:"
    assert sorted(line.strip() for line in lines[1:]) == sorted([str(TWIN_A), str(TWIN_B)])


def test_not_an_id_and_no_such_run(show: CliRunner) -> None:
    bad = show.invoke(command, ["show", "xyz"])
    assert bad.exit_code == 2 and "'xyz' is not a run id" in bad.output
    for missing in ("999999999999", str(uuid.UUID(int=7))):
        gone = show.invoke(command, ["show", missing])
        assert gone.exit_code == 1 and gone.stderr == f"no run {missing}\n", gone.output
