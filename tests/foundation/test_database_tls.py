"""Every connection applies DB_SSLMODE / DB_SSLROOTCERT, migrations included (issue 10, defect 1).

A private CA and a server certificate made here with openssl, a cluster of its own with ssl=on, and the
two commands that migrate: ``scrinalia db upgrade`` and ``alembic upgrade head`` from the checkout.
Under verify-full each must refuse a certificate from another CA and a host name the certificate does
not name, and succeed with the right CA.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from scrinalia.db import migrate
from scrinalia.db.local_cluster import SERVER_USER
from tests.foundation.clusters import create_database, private_cluster, psql

ROOT = Path(__file__).resolve().parents[2]
COMMANDS = {
    "scrinalia db upgrade": [sys.executable, "-m", "scrinalia.cli.main", "db", "upgrade"],
    "alembic upgrade head": [str(Path(sys.executable).parent / "alembic"), "upgrade", "head"],
}


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _ca(directory: Path, name: str) -> None:
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
             "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", "2", "-subj", f"/CN=Scrinalia test {name}",
             cwd=directory)


def make_certificates(directory: Path) -> None:
    """ca-a.pem signs server.crt (SAN: DNS:localhost only); ca-b.pem is another CA."""
    directory.mkdir(parents=True)
    _ca(directory, "ca-a")
    _ca(directory, "ca-b")
    (directory / "server.ext").write_text(
        "subjectAltName=DNS:localhost\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n")
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", "server.key",
             "-out", "server.csr", "-subj", "/CN=localhost", cwd=directory)
    _openssl("x509", "-req", "-in", "server.csr", "-CA", "ca-a.pem", "-CAkey", "ca-a.key", "-CAcreateserial",
             "-out", "server.crt", "-days", "2", "-extfile", "server.ext", cwd=directory)
    os.chmod(directory / "server.key", 0o600)
    if os.geteuid() == 0:
        for path in (directory, directory / "server.key", directory / "server.crt"):
            shutil.chown(path, SERVER_USER, SERVER_USER)


@pytest.fixture(scope="module")
def tls_cluster():
    made: dict[str, Path] = {}

    def with_certificates(root: Path) -> dict[str, str]:
        made["certs"] = certs = root / "tls"
        make_certificates(certs)
        return {"ssl": "on", "ssl_cert_file": str(certs / "server.crt"), "ssl_key_file": str(certs / "server.key")}

    with private_cluster(before_start=with_certificates) as cluster:
        yield cluster, made["certs"]


def _env(url: str, rootcert: Path) -> dict[str, str]:
    ours = ("DATABASE_URL", "RUNNER_DATABASE_URL", "DB_", "PG")
    env = {k: v for k, v in os.environ.items() if not k.startswith(ours)}
    env.update(DATABASE_URL=url, DB_SSLMODE="verify-full", DB_SSLROOTCERT=str(rootcert))
    return env


@pytest.mark.parametrize("name", list(COMMANDS))
def test_migrating_commands_verify_the_server_certificate(tls_cluster, name):
    cluster, certs = tls_cluster
    database = "m_" + name.split()[0]
    create_database(cluster, database, migrated=False)

    def migrate_with(host: str, rootcert: str) -> subprocess.CompletedProcess:
        url = f"postgresql://{SERVER_USER}:not-a-real-secret@{host}:{cluster.port}/{database}"
        return subprocess.run(COMMANDS[name], cwd=ROOT, env=_env(url, certs / rootcert), capture_output=True,
                              text=True, timeout=120)

    def revision() -> str:
        if psql(cluster, database, "SELECT to_regclass('alembic_version') IS NULL") == "t":
            return "none"
        return psql(cluster, database, "SELECT version_num FROM alembic_version")

    other_ca = migrate_with("localhost", "ca-b.pem")
    assert other_ca.returncode != 0 and "certificate verify failed" in other_ca.stderr, other_ca.stderr
    wrong_host = migrate_with("127.0.0.1", "ca-a.pem")
    assert wrong_host.returncode != 0 and "does not match host name" in wrong_host.stderr, wrong_host.stderr
    assert revision() == "none"
    if name.startswith("scrinalia"):  # our CLI: one clean line, the database exit code, no secret
        for refused in (other_ca, wrong_host):
            assert refused.returncode == 5 and "Traceback" not in refused.stderr, refused.stderr
            assert "not-a-real-secret" not in refused.stderr + refused.stdout

    right = migrate_with("localhost", "ca-a.pem")
    assert right.returncode == 0, right.stderr
    assert revision() == migrate.head_revision()


def test_a_url_cannot_be_weakened_by_the_default_setting():
    """DB_SSLMODE's default (prefer) does not lower a URL that asks for verify-full."""
    from scrinalia.db.engine import tls_connect_args
    from scrinalia.settings import DatabaseTls, DatabaseUrl

    url = DatabaseUrl("postgresql://u@h/d?sslmode=verify-full").url
    assert tls_connect_args(DatabaseTls(), url)["sslmode"] == "verify-full"
    assert tls_connect_args(DatabaseTls(db_sslmode="verify-full"), DatabaseUrl("postgresql://u@h/d?sslmode=disable").url
                            )["sslmode"] == "verify-full"
