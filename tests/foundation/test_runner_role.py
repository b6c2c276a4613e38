"""The runner's least-privilege role (issue 10, defects 5 and 6; docs/security.md "Database roles").

As the role: every worker of the catalogue and every protocol step succeed (a real daemon, real
one-shot children); DELETE on the ledger, the registry and the documents, a forged ledger row, DDL,
TEMP and the identity tables are refused. ``scrinalia db runner-role`` run twice by a schema owner that
is not a superuser but has CREATEROLE exits 0.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

from runner.oneshot import run_once
from scrinalia.api import catalogue_view
from scrinalia.db import migrate
from scrinalia.db.engine import create_engine_from_url
from scrinalia.db.roles import ensure_runner_role, unmanaged_tables
from scrinalia.domains.archive import ledger, registry
from scrinalia.domains.archive.ledger import FinishParams, StartParams
from scrinalia.domains.archive.workers.plugins import load_catalogue
from tests.ledger.helpers import register_runner
from tests.runner.conftest import runner_env, start_runner, wait_status  # noqa: F401 - fixtures
from tests.workers import tiny_models
from tests.workers.helpers import insert_docs

ROOT = Path(__file__).resolve().parents[2]
DENIED = "permission denied|must be owner|row-level security"

# Each must be refused to the runner (the role's grants in scrinalia.db.roles say why).
FORBIDDEN = {
    "delete the run history": "DELETE FROM archive_worker_runs",
    "delete the registry": "DELETE FROM archive_worker_runners",
    "delete the archive": "DELETE FROM archive_documents",
    "insert a document": "INSERT INTO archive_documents (reference_code, title) VALUES ('X', 'forged')",
    "delete a review item": "DELETE FROM archive_review_queue",
    "delete embeddings": "DELETE FROM archive_document_embeddings",
    "truncate": "TRUNCATE archive_documents",
    "forge a finished run": "INSERT INTO archive_worker_runs (worker_name, status, trigger, finished_at) "
                            "VALUES ('embedding', 'SUCCESS', 'API', now())",
    "forge who asked": "INSERT INTO archive_worker_runs (worker_name, status, trigger, requested_by_user_id) "
                       "VALUES ('embedding', 'RUNNING', 'CLI', 1)",
    "enqueue a run": "INSERT INTO archive_worker_runs (worker_name, status, trigger) VALUES ('x', 'QUEUED', 'API')",
    "insert a finished run": "INSERT INTO archive_worker_runs (worker_name, status, trigger) "
                             "VALUES ('x', 'SUCCESS', 'CLI')",
    "insert a run of no runner": "INSERT INTO archive_worker_runs (worker_name, status, trigger, runner_id) "
                                 "VALUES ('x', 'RUNNING', 'CLI', gen_random_uuid())",
    "rewrite what was asked": "UPDATE archive_worker_runs SET request = '{}'",
    "rewrite who asked": "UPDATE archive_worker_runs SET requested_by = 'someone else'",
    "rewrite a run's recorded configuration": "UPDATE archive_worker_run_configs SET config = '{}'",
    "delete a run's recorded configuration": "DELETE FROM archive_worker_run_configs",
    "read the users": "SELECT * FROM auth_users",
    "read the sessions": "SELECT * FROM auth_sessions",
    "read the login throttle": "SELECT * FROM auth_login_throttle",
    "read the devices": "SELECT * FROM auth_devices",
    "read the schedules": "SELECT * FROM archive_worker_schedules",
    "forge the queue counts": "INSERT INTO archive_stamp_counts (stamp_key, governed, stale, failed, n) "
                              "VALUES ('embedding', true, true, false, -5)",
    "recompute the queue counts": "SELECT archive_stamp_counts_recompute()",
    "change a setting": "UPDATE archive_worker_settings SET preset = 'x'",
    "change a rule": "UPDATE archive_cleaning_rules SET active = false",
    "create a table": "CREATE TABLE evil (id int)",
    "create a temp table": "CREATE TEMP TABLE evil (id int)",
    "drop a table": "DROP TABLE archive_documents",
    "alter a table": "ALTER TABLE archive_documents ADD COLUMN evil int",
    "create a function": "CREATE FUNCTION public.evil() RETURNS int LANGUAGE sql AS 'SELECT 1'",
}


def _as(url: str, role: str) -> str:
    return make_url(url).set(username=role, password="runner-secret").render_as_string(hide_password=False)


def _drop_role(engine, role: str) -> None:
    with engine.begin() as conn:
        conn.execute(text(f'DROP OWNED BY "{role}"'))
        conn.execute(text(f'DROP ROLE "{role}"'))


@pytest.fixture
def runner_url(database_url, engine):
    role = f"runner_{uuid.uuid4().hex[:8]}"
    ensure_runner_role(engine, role, password="runner-secret")
    yield _as(database_url, role)
    _drop_role(engine, role)


def assert_refused(as_runner) -> None:
    for what, statement in FORBIDDEN.items():
        with pytest.raises(DBAPIError, match=DENIED), as_runner.begin() as conn:
            conn.execute(text(statement))
            pytest.fail(f"the runner could {what}")


def test_every_table_is_granted_or_withheld_explicitly():
    assert unmanaged_tables() == set()


def test_the_protocol_steps_as_the_runner_role(engine, runner_url):
    as_runner = create_engine_from_url(runner_url)
    try:
        with as_runner.connect() as conn:
            assert migrate.current_revision(conn) == migrate.head_revision()
        me = register_runner(as_runner, ["embedding", "ner"])
        ledger.enqueue(engine, "embedding", {})
        run = ledger.claim_next(as_runner, me, ["embedding"], 60)
        assert ledger.record_start(as_runner, run.run_id, me, StartParams(engine_name="transformers", preset="cpu",
                                   config={"device": "cpu"}, options={}))
        beat = ledger.heartbeat(as_runner, me, 60, progress={run.run_id: {"done": 1}}, children=[{"pid": 1}])
        assert beat.registry_renewed and beat.held.keys() == {run.run_id}
        assert ledger.finish(as_runner, run.run_id, me, FinishParams("SUCCESS", result={"units": 1},
                                                                        metrics={"m": 1})) is not None
        # the one-shot CLI's own RUNNING row, its Ctrl-C, and the lease expiry of a lost run
        cli = ledger.create_running(as_runner, "ner", {}, runner_id=me, lease_seconds=60, requested_by="cli")
        assert ledger.request_cancel(as_runner, cli.run_id, "cli").cancel_requested_at is not None
        assert ledger.finish(as_runner, cli.run_id, me, FinishParams("CANCELLED", exit_reason="cancelled")) is not None
        ledger.enqueue(engine, "embedding", {})
        lost = ledger.claim_next(as_runner, me, ["embedding"], 1)
        with engine.begin() as conn:  # its lease runs out (a wait on the clock would race a fast round trip)
            conn.execute(text("UPDATE archive_worker_runs SET lease_expires_at = now() - interval '1 second'"
                              " WHERE run_id = :run_id"), {"run_id": lost.run_id})
        assert [r.run_id for r in ledger.expire_leases(as_runner)] == [lost.run_id]
        assert ledger.get_run(as_runner, lost.run_id).status == "INTERRUPTED"
        with pytest.raises(DBAPIError, match="row-level security"), as_runner.begin() as conn:  # nor add one
            conn.execute(text("INSERT INTO archive_worker_run_configs (run_id, config) VALUES (:r, '{}')"),
                         {"r": lost.run_id})
        assert ledger.get_run(as_runner, run.run_id).config == {"device": "cpu"}
        assert ledger.active_run(as_runner, "embedding") is None
        # the finished history is out of the runner's reach: its UPDATE sees no finished row
        with as_runner.begin() as conn:
            assert conn.execute(text("UPDATE archive_worker_runs SET error = 'rewritten', status = 'FAILED' "
                                     "WHERE status <> 'QUEUED' AND status <> 'RUNNING'")).rowcount == 0
        assert ledger.get_run(engine, run.run_id).status == "SUCCESS"
        assert registry.stop(as_runner, me)
        assert any(r.runner_id == me for r in registry.list_runners(as_runner))
        with pytest.raises(DBAPIError, match="row-level security"):  # a stopped runner starts no CLI run
            ledger.create_running(as_runner, "ner", {}, runner_id=me, lease_seconds=60)
        assert_refused(as_runner)
    finally:
        as_runner.dispose()


def test_a_daemon_as_the_runner_role(engine, runner_url, start_runner, runner_env):  # noqa: F811 - fixtures
    env = dict(runner_env, RUNNER_DATABASE_URL=runner_url)
    daemon = start_runner("--capabilities", "ok", "--poll", "0.2", "--heartbeat", "0.5", "--lease", "4", env=env)
    run = ledger.enqueue(engine, "ok", {"options": {"units": 3}}, requested_by="test")
    done = wait_status(engine, run.run_id, ("SUCCESS", "FAILED"))
    assert done.status == "SUCCESS", done.error
    daemon.proc.send_signal(15)
    assert daemon.wait_exit() == 0, daemon.log()
    with engine.connect() as conn:
        stopped = conn.execute(text("SELECT stopped_at FROM archive_worker_runners WHERE name = :n"),
                               {"n": daemon.name}).scalar()
    assert stopped is not None


def test_every_worker_as_the_runner_role(database_url, engine, runner_url, tmp_path):
    """Each worker of the catalogue, once, in a real one-shot child connected as the runner role."""
    ner_model = str(tiny_models.make_ner_model(tmp_path / "ner"))
    nli_model = str(tiny_models.make_nli_model(tmp_path / "nli"))
    insert_docs(engine, [
        {"reference_code": "W1", "title": "Letters  of Maria Joaquina to the Camara Municipal de Lisboa"},
        {"reference_code": "W2", "title": "REGISTO DE TESTAMENTOS", "scope_and_content": "Lorem ipsum."},
        {"reference_code": "W3", "title": "Register of deeds", "date_text": "1750", "date_start": "1750-01-01"},
    ])
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO archive_typologies (name) VALUES ('correspondence'), ('minutes')"))
        conn.execute(text("INSERT INTO archive_entity_stopwords (term) VALUES ('BRAGA')"))
        conn.execute(text("INSERT INTO archive_entity_exclusions (label, term) VALUES ('MISC', 'concilio')"))
        conn.execute(text(
            "INSERT INTO archive_cleaning_rules (name, kind, field, pattern, replacement, message) VALUES "
            "('spaces', 'REWRITE', 'title', '\\s{2,}', ' ', NULL), "
            "('lorem', 'VALIDATE', 'scope_and_content', '(?i)lorem ipsum', NULL, 'placeholder text')"))
        conn.execute(text("INSERT INTO archive_cleaning_rules (name, kind, field, engine_name, engine_options, prompt) "
                          "VALUES ('nli', 'LLM_CHECK', 'title', 'nli-check', CAST(:eo AS jsonb), 'This is wrong.')"),
                     {"eo": json.dumps({"model": nli_model, "threshold": 0.5})})
    requests: dict[str, dict[str, Any]] = {
        "cleaning": {},
        "embedding": {"preset": "cpu"},
        "ner": {"engine_options": {"model": ner_model}, "preset": "cpu"},
        "typology": {"engine_options": {"model": nli_model}},
        "quality-validator": {},
        "gpu-probe": {"options": {"matmul_size": 64}},
    }
    assert set(requests) == set(load_catalogue()), "a new worker must be run here as the runner role"
    for name, request in requests.items():
        run = run_once(runner_url, name, request, requested_by="tests")
        assert run.status == "SUCCESS", f"{name}: {run.error}"
        if name != "gpu-probe":
            assert (run.result or {}).get("units", 0) >= 1, (name, run.result)
    with engine.connect() as conn:
        counts = conn.execute(text(
            "SELECT (SELECT count(*) FROM archive_document_embeddings),"
            " (SELECT count(*) FROM archive_document_entities),"
            " (SELECT count(*) FROM archive_document_typologies), (SELECT count(*) FROM archive_review_queue)")).one()
    assert all(c > 0 for c in counts), counts
    # the workers' writes as the role fired the summary's triggers (SECURITY DEFINER: the role has no
    # privilege on archive_stamp_counts), and the summary is the live count
    catalogue = load_catalogue()
    served = catalogue_view.unit_counts(engine, catalogue)
    assert served == catalogue_view.live_unit_counts(engine, catalogue)
    assert served["embedding"] == {"pending": 0, "failed": 0, "processed": 3}, served


@pytest.fixture
def createrole_owner(pg_admin_url, admin_engine):
    """A schema owner that is no superuser: CREATEROLE, owner of its database (and of another one)."""
    suffix = uuid.uuid4().hex[:8]
    owner, database, other = f"owner_{suffix}", f"owned_{suffix}", f"other_{suffix}"
    with admin_engine.connect() as conn:
        conn.execute(text(f'CREATE ROLE "{owner}" LOGIN CREATEROLE PASSWORD \'owner-secret\''))
        conn.execute(text(f'CREATE DATABASE "{database}" OWNER "{owner}"'))
        conn.execute(text(f'CREATE DATABASE "{other}" OWNER "{owner}"'))
    url = make_url(pg_admin_url).set(username=owner, password="owner-secret", database=database)
    owner_url = url.render_as_string(hide_password=False)
    migrate.upgrade(owner_url)
    yield owner_url, other
    with admin_engine.connect() as conn:
        for name in (database, other):
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        roles = conn.execute(text("SELECT rolname FROM pg_roles WHERE rolname LIKE :p"), {"p": f"%{suffix}"}).scalars()
        for role in sorted(roles, key=lambda r: r.startswith("owner_")):
            conn.execute(text(f'DROP ROLE "{role}"'))


def test_runner_role_twice_by_a_createrole_owner(createrole_owner):
    owner_url, other = createrole_owner
    role = "runner_" + make_url(owner_url).username.removeprefix("owner_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_URL", "RUNNER_"))}
    env.update(DATABASE_URL=owner_url, RUNNER_DB_PASSWORD="runner-secret")
    command = [sys.executable, "-m", "scrinalia.cli.main", "db", "runner-role", "--role", role]
    first = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert first.returncode == 0, first.stderr
    assert f"role {role} created" in first.stdout and other in first.stdout  # PUBLIC's CONNECT revoked there
    second = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert second.returncode == 0, second.stderr
    assert f"role {role} updated" in second.stdout and "Traceback" not in second.stderr
    assert "runner-secret" not in first.stdout + first.stderr + second.stdout + second.stderr

    as_runner = create_engine_from_url(_as(owner_url, role))
    try:
        register_runner(as_runner, ["embedding"])
        assert_refused(as_runner)
        elsewhere = create_engine_from_url(
            make_url(_as(owner_url, role)).set(database=other).render_as_string(hide_password=False))
        with pytest.raises(DBAPIError, match="permission denied"):
            elsewhere.connect()
        elsewhere.dispose()
    finally:
        as_runner.dispose()


def grant_rows() -> list[str]:
    """docs/security.md's grant table, row by row, from RUNNER_GRANTS."""
    from scrinalia.db.roles import RUNNER_GRANTS

    def cols(columns: tuple[str, ...]) -> str:
        return ", ".join(f"`{c}`" for c in columns) if columns else "-"

    return [f"| `{g.table}` | {'yes' if g.select else '-'} | {cols(g.insert)} | {cols(g.update)} | "
            f"{'yes' if g.delete else '-'} | {g.why} |" for g in RUNNER_GRANTS]


def test_the_documented_grant_table_is_the_code():
    doc = (ROOT / "docs" / "security.md").read_text()
    missing = [row for row in grant_rows() if row not in doc]
    assert not missing, "docs/security.md lacks:\n" + "\n".join(missing)


def test_the_documented_no_access_list_is_the_code():
    """docs/security.md's "No access at all" paragraph names every table of NO_ACCESS."""
    from scrinalia.db.roles import NO_ACCESS

    doc = (ROOT / "docs" / "security.md").read_text()
    paragraph = doc[doc.index("No access at all:"):].split("\n\n", 1)[0]
    missing = [table for table in NO_ACCESS if f"`{table}`" not in paragraph]
    assert not missing, f"docs/security.md's 'No access at all' lacks: {missing}"


def test_a_role_made_before_the_tables_of_reports_and_configurations_runs_after_the_upgrade(empty_database_url):
    """Migrations 0022 and 0023 grant their tables (and 0022 its policy) to the runner roles that exist when
    they run, so no ``db runner-role`` has to run again for a runner to register, report its warm models
    and record a run's start."""
    migrate.upgrade(empty_database_url)
    owner = create_engine_from_url(empty_database_url)
    role = f"runner_{uuid.uuid4().hex[:8]}"
    try:
        ensure_runner_role(owner, role, password="runner-secret")
        migrate.downgrade(empty_database_url, "0021")  # as a role made by the previous release finds it
        migrate.upgrade(empty_database_url)
        as_runner = create_engine_from_url(_as(empty_database_url, role))
        try:
            me = register_runner(as_runner, ["embedding"], sees={"model_dirs": ["/m"]})
            assert ledger.heartbeat(as_runner, me, 60, warm={"models": []}).registry_renewed
            assert (registry.get_runner(as_runner, me).sees, registry.get_runner(as_runner, me).warm) == (
                {"model_dirs": ["/m"]}, {"models": []})
            ledger.enqueue(owner, "embedding", {})
            run = ledger.claim_next(as_runner, me, ["embedding"], 60)
            assert ledger.record_start(as_runner, run.run_id, me, StartParams("transformers", None, {"a": 1}, {}))
            assert ledger.get_run(as_runner, run.run_id).config == {"a": 1}
            ledger.finish(as_runner, run.run_id, me, FinishParams("SUCCESS"))
            queued = ledger.enqueue(owner, "embedding", {})
            with pytest.raises(DBAPIError, match="row-level security"), as_runner.begin() as conn:
                conn.execute(text("INSERT INTO archive_worker_run_configs (run_id, config) VALUES (:r, '{}')"),
                             {"r": queued.run_id})
        finally:
            as_runner.dispose()
    finally:
        _drop_role(owner, role)
        owner.dispose()
