"""Every URL form libpq and SQLAlchemy accept for PostgreSQL works in DATABASE_URL and RUNNER_DATABASE_URL
(issue 18; decision 0120): libpq's multi-host URI with target_session_attrs, SQLAlchemy's ``?host=h:p``
form, unix-socket hosts (a query ``host`` or a percent-encoded path), libpq's key=value string. Each is
read as libpq reads it, connects for real (a dead first host is skipped), and never shows its password."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote

import pytest
from sqlalchemy import text
from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg
from sqlalchemy.engine import make_url

from scrinalia.db.engine import create_engine_from_url
from scrinalia.db.errors import EXIT_DATABASE
from scrinalia.db.local_cluster import free_port
from scrinalia.settings import DatabaseUrl, SettingsError, load_settings, parse_database_url

ROOT = Path(__file__).resolve().parents[2]
SECRET = "pw-never-shown"

FORMS = [
    (f"postgresql://u:{SECRET}@h1:5432,h2:5433/db?target_session_attrs=read-write",
     {"host": "h1,h2", "port": "5432,5433", "target_session_attrs": "read-write"}),
    (f"postgres://u:{SECRET}@h1,h2/db", {"host": "h1,h2"}),
    (f"postgresql://u:{SECRET}@/db?host=h1:5432&host=h2:5433", {"host": "h1,h2", "port": "5432,5433"}),
    (f"postgresql+psycopg://u:{SECRET}@/db?host=h1:5432&host=h2:5433&target_session_attrs=primary",
     {"host": "h1,h2", "port": "5432,5433", "target_session_attrs": "primary"}),
    (f"postgresql://u:{SECRET}@/db?host=/var/run/postgresql", {"host": "/var/run/postgresql"}),
    (f"postgresql://u:{SECRET}@%2Fvar%2Frun%2Fpostgresql:5433/db", {"host": "/var/run/postgresql", "port": "5433"}),
    (f"host=h1,h2 port=5432,5433 dbname=db user=u password={SECRET} target_session_attrs=read-write",
     {"host": "h1,h2", "port": "5432,5433", "target_session_attrs": "read-write"}),
    (f"postgresql://u:{SECRET}@db.example.org:6432/db?sslmode=require", {"host": "db.example.org", "port": 6432}),
]


@pytest.mark.parametrize(("raw", "expected"), FORMS, ids=[f[0].split(SECRET)[1][:40] for f in FORMS])
def test_every_form_reads_as_libpq_reads_it_and_hides_its_password(raw, expected):
    url = DatabaseUrl(raw)
    _, params = PGDialect_psycopg().create_connect_args(url.url)
    assert {k: params.get(k) for k in expected} == expected, params
    assert params["dbname"] == "db" and params["user"] == "u" and params["password"] == SECRET
    assert SECRET not in str(url) and SECRET not in repr(url) and SECRET not in url.redacted()
    # What a child is handed (the rendered URL) reads back the same.
    assert PGDialect_psycopg().create_connect_args(DatabaseUrl(url.render()).url)[1] == params


@pytest.mark.parametrize(("raw", "said"), [
    (f"postgresql://u:{SECRET}@h/db?target_session_atrs=read-write", "no connection parameter target_session_atrs"),
    (f"host=h dbname=db password={SECRET} sslmod=require", "no connection parameter sslmod"),
    (f"postgresql://u:{SECRET}@h1,h2/db?host=h3:1&host=h4:2", "not a valid URL"),
    (f"postgresql://u:{SECRET}@h1:5432,h2:99999/db", "port"),
    (f"host=h1 dbname=db password={SECRET} nonsense", "not a valid URL"),
    (f"postgresql://u:{SECRET}@h1,h2", "names no database"),
])
def test_a_bad_url_is_refused_by_name_without_its_secret(monkeypatch, raw, said):
    monkeypatch.setenv("RUNNER_DATABASE_URL", raw)
    with pytest.raises(SettingsError) as err:
        load_settings()
    assert "RUNNER_DATABASE_URL" in str(err.value) and said in str(err.value), err.value
    assert SECRET not in str(err.value) and SECRET not in str(err.value.__context__)


#: Each branch of reading a URL's hosts and ports, pinned: (raw, what it reads as, or the refusal's reason).
HOST_AND_PORT_READINGS = [
    ("host=h port=5433 dbname=db user=u", "postgresql+psycopg://u@h:5433/db"),
    ("host=h dbname=db", "postgresql+psycopg://h/db"),
    ("dbname=db", "postgresql+psycopg:///db"),
    ("host=/run/pg dbname=db port=5433", "postgresql+psycopg:///db?host=%2Frun%2Fpg&port=5433"),
    ("host=h1,h2 dbname=db", "postgresql+psycopg:///db?host=h1%2Ch2"),
    ("postgresql+psycopg://u@/db?host=/s&port=5432", "postgresql+psycopg://u@/db?host=%2Fs&port=5432"),
    ("postgresql+psycopg://u@h:5432/db?port=5433", "postgresql+psycopg://u@h:5432/db?port=5433"),
    ("host=h port=abc dbname=db", "!its port is not a number"),
    ("postgresql://u@h/db?port=x", "!its port is not a number"),
    ("host=h port=5432,5433 dbname=db", "!its hosts and ports do not match"),
    ("postgresql://u@h:0/db", "!it has a port that is not a number from 1 to 65535"),
    ("postgresql://u@h:70000/db", "!it has a port that is not a number from 1 to 65535"),
    ("postgresql://u@/db?host=/s&port=5432,0", "!it has a port that is not a number from 1 to 65535"),
    ("postgresql://u@h/db?port=5432&port=99999", "!it has a port that is not a number from 1 to 65535"),
    ("postgresql+psycopg://u@/db?host=/s&port=x", "!it has a port that is not a number from 1 to 65535"),
    ("host=h dbname=db bogus=1", "!libpq knows no connection parameter bogus"),
    ("postgresql://u@h/db?bogus=1", "!libpq knows no connection parameter bogus"),
    ("host='unterminated dbname=db", "!is not a valid URL;"),
]


@pytest.mark.parametrize(("raw", "reading"), HOST_AND_PORT_READINGS, ids=[r[0] for r in HOST_AND_PORT_READINGS])
def test_hosts_and_ports_read_as_pinned(raw, reading):
    if not reading.startswith("!"):
        assert parse_database_url(raw).render_as_string(hide_password=False) == reading
        return
    with pytest.raises(SettingsError) as err:
        parse_database_url(raw)
    assert reading[1:] in str(err.value), err.value


def _real_forms(database_url: str, socket_dir: str) -> dict[str, str]:
    parsed = make_url(database_url)
    db, port, dead = parsed.database, parsed.port, free_port()
    return {
        "libpq multi-host, first host dead": f"postgresql://postgres@127.0.0.1:{dead},127.0.0.1:{port}/{db}"
                                             "?target_session_attrs=read-write",
        "sqlalchemy multi-host, first host dead": f"postgresql://postgres@/{db}?host=127.0.0.1:{dead}"
                                                  f"&host=127.0.0.1:{port}",
        "unix socket in the query": f"postgresql://postgres@/{db}?host={socket_dir}&port={port}",
        "unix socket as the host": f"postgresql://postgres@{quote(socket_dir, safe='')}:{port}/{db}",
        "key=value": f"host=127.0.0.1,{socket_dir} port={dead},{port} dbname={db} user=postgres",
    }


def test_every_form_connects(engine, database_url):
    with engine.connect() as conn:
        socket_dir = conn.execute(text("SHOW unix_socket_directories")).scalar_one().split(",")[0].strip()
    for name, raw in _real_forms(database_url, socket_dir).items():
        other = create_engine_from_url(raw, pool_size=1)
        try:
            with other.connect() as conn:
                seen = conn.execute(text("SELECT current_database()")).scalar_one()
            assert seen == make_url(database_url).database, name
        finally:
            other.dispose()


def _cli_env(url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DATABASE_URL", "RUNNER_", "DB_", "PG"))}
    env.update(DATABASE_URL=url, PYTHONPATH=str(ROOT), SCRINALIA_WORKER_PLUGINS="tests.runner.workers:ALL")
    return env


def test_the_cli_and_the_one_shot_runner_take_a_multi_host_url(database_url):
    parsed = make_url(database_url)
    url = (f"postgresql://postgres@127.0.0.1:{free_port()},127.0.0.1:{parsed.port}/{parsed.database}"
           "?target_session_attrs=read-write")
    current = subprocess.run([sys.executable, "-m", "scrinalia.cli.main", "db", "current"], cwd=ROOT,
                             env=_cli_env(url), capture_output=True, text=True, timeout=120)
    assert current.returncode == 0, current.stderr
    oneshot = subprocess.run([sys.executable, "-m", "runner.cli", "run", "ok", "--json"], cwd=ROOT,
                             env=_cli_env(url), capture_output=True, text=True, timeout=120)
    assert oneshot.returncode == 0 and '"SUCCESS"' in oneshot.stdout, oneshot.stderr


def test_a_multi_host_url_that_reaches_nothing_is_one_line_without_its_password():
    url = f"postgresql://scrinalia:{SECRET}@127.0.0.1:{free_port()},127.0.0.1:{free_port()}/db?connect_timeout=2"
    proc = subprocess.run([sys.executable, "-m", "scrinalia.cli.main", "db", "current"], cwd=ROOT,
                          env=_cli_env(url), capture_output=True, text=True, timeout=120)
    assert proc.returncode == EXIT_DATABASE, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("database error: ") and "refused" in lines[0], proc.stderr
    assert SECRET not in proc.stderr + proc.stdout
