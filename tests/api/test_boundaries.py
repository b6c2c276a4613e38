"""The API never imports runner, torch or transformers; the CLI's users commands."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner
from sqlalchemy import text

REPO = Path(__file__).resolve().parents[2]


def test_the_api_imports_neither_runner_nor_torch_nor_transformers():
    code = (
        "import sys\n"
        "from sqlalchemy import create_engine\n"
        "from scrinalia.api.app import create_app\n"
        "from scrinalia.api.settings import ApiSettings\n"
        "app = create_app(engine=create_engine('postgresql+psycopg://u@127.0.0.1:1/x'), api_settings=ApiSettings())\n"
        "app.openapi()\n"
        "import scrinalia.cli.api, scrinalia.cli.users\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('runner', 'torch', 'transformers'))\n"
        "print(len(app.routes), bad)\n"
        "sys.exit(1 if bad else 0)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("SCRINALIA_WORKER_PLUGINS", None)
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _cli(database_url, *args, input=None):
    from scrinalia.cli.main import cli
    from scrinalia.settings import get_settings

    get_settings.cache_clear()
    runner = CliRunner()
    result = runner.invoke(cli, list(args), input=input, env={"DATABASE_URL": database_url}, catch_exceptions=False)
    get_settings.cache_clear()
    return result


def test_users_commands(database_url, engine):
    r = _cli(database_url, "users", "create", "Root@Example.org", "--role", "ADMIN", "--password-stdin",
             input="a long enough passphrase\n")
    assert r.exit_code == 0, r.output
    assert "created root@example.org (ADMIN)" in r.output
    r = _cli(database_url, "users", "create", "root@example.org", "--password-stdin", input="another long passphrase\n")
    assert r.exit_code == 1 and "already exists" in r.output
    r = _cli(database_url, "users", "create", "weak@example.org", "--password-stdin", input="short\n")
    assert r.exit_code == 1 and "at least" in r.output
    r = _cli(database_url, "users", "create", "view@example.org", "--password-stdin", input="viewer passphrase 1\n")
    assert r.exit_code == 0

    r = _cli(database_url, "users", "list", "--json")
    users = {u["email"]: u for u in json.loads(r.output)}
    assert set(users) == {"root@example.org", "view@example.org"}
    assert "password_hash" not in r.output and "argon2" not in r.output
    assert users["view@example.org"]["role"] == "VIEWER"

    assert _cli(database_url, "users", "set-role", "view@example.org", "curator").exit_code == 0
    with engine.begin() as conn:
        assert conn.execute(text("SELECT role FROM auth_users WHERE email = 'view@example.org'")).scalar() == "CURATOR"
        conn.execute(text(
            "INSERT INTO auth_login_throttle (scope, key_sha256, attempts, lockout_count, locked_until) "
            "VALUES ('account', encode(sha256(convert_to('root@example.org', 'UTF8')), 'hex'), 5, 1, "
            "now() + interval '1 hour')"))
        hashed = conn.execute(text("SELECT password_hash FROM auth_users WHERE email = 'root@example.org'")).scalar()
    assert hashed.startswith("$argon2id$")

    listing = next(line for line in _cli(database_url, "users", "list").output.splitlines()
                   if line.startswith("root@example.org"))
    assert "T" in listing.split()[4]  # LOCKED-UNTIL: the account bucket's lock, as a timestamp
    r = _cli(database_url, "users", "reset-password", "root@example.org", "--password-stdin",
             input="a fresh passphrase here\n")
    assert r.exit_code == 0, r.output
    with engine.connect() as conn:
        row = conn.execute(text("SELECT must_change_password FROM auth_users "
                                "WHERE email = 'root@example.org'")).one()
        locks = conn.execute(text("SELECT count(*) FROM auth_login_throttle")).scalar_one()
    assert tuple(row) == (True,) and locks == 0  # the reset lifted the account's lock

    r = _cli(database_url, "users", "deactivate", "view@example.org")
    assert r.exit_code == 0
    assert _cli(database_url, "users", "deactivate", "nobody@example.org").exit_code == 1
    r = _cli(database_url, "users", "list")
    assert "view@example.org" in r.output and " no " in r.output
