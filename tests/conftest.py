"""The test harness: a real PostgreSQL for the session, a fresh migrated database for each test.

Where PostgreSQL comes from, in order:
  1. ``TEST_DATABASE_URL`` (a role that may CREATE DATABASE);
  2. testcontainers' PostgreSQL, when a Docker engine answers;
  3. a throwaway cluster made with the installed binaries (``scrinalia.db.local_cluster``), removed
     at the end of the session.

The schema is migrated once into a template database; every test gets its own copy
(``CREATE DATABASE ... TEMPLATE``), so tests are isolated even when they start real processes. The
copies are made one step ahead by a background thread (``DatabasePool``), so a test does not wait for
its own.
"""
from __future__ import annotations

import os
import queue
import tempfile
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url

from scrinalia.db import migrate
from scrinalia.db.engine import create_engine_from_url

#: The files that take longest, longest first (measured: docs/benchmarks.md, "Test suite time"). pytest-xdist
#: hands whole files to its workers (``--dist loadfile``) in the collection's order when told not to reorder
#: them by their number of tests (``--no-loadscope-reorder``, as ``make test`` runs it): a long file started
#: last is the tail of the whole run, started first it runs beside the many short ones (decision 0360).
LONGEST_FIRST = (
    "tests/systemd/test_deployed.py",
    "tests/foundation/test_previous_release.py",  # builds the previous release once per machine
    "tests/panel/test_make_dev.py",
    "tests/panel/test_accessibility.py",
    "tests/workers/test_catalogue_e2e.py",
    "tests/runner/test_partition.py",
    "tests/simulation/test_simulation.py",
    "tests/api/test_schemathesis.py",
    "tests/workers/test_cancellation_and_fence.py",
    "tests/foundation/test_runner_role.py",
    "tests/runner/test_oneshot_cli.py",
    "tests/api/test_contract.py",
    "tests/foundation/test_test_layout.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The files of ``LONGEST_FIRST`` first, in its order; every other test keeps its place (a stable sort)."""
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::", 1)[0], len(rank)))


def _docker_engine_answers() -> bool:
    try:
        import docker

        client = docker.from_env(timeout=3)
        client.ping()
        return True
    except Exception:
        return False


def _with_database(url: str, database: str) -> str:
    return make_url(url).set(database=database).render_as_string(hide_password=False)


@pytest.fixture(scope="session")
def pg_admin_url() -> Iterator[str]:
    """A URL to a maintenance database of a server on which tests may create databases."""
    env_url = os.environ.get("TEST_DATABASE_URL")
    if env_url:
        yield env_url
        return
    if _docker_engine_answers():
        from testcontainers.postgres import PostgresContainer

        with PostgresContainer("postgres:15", driver=None) as container:
            yield container.get_connection_url()
        return
    from scrinalia.db.local_cluster import LocalCluster

    root = Path(tempfile.mkdtemp(prefix="scrinalia-pg-"))
    cluster = LocalCluster.create(root)
    cluster.start(fsync=False, max_connections=300)
    try:
        yield cluster.url("postgres")
    finally:
        cluster.destroy()


def _admin_engine(admin_url: str) -> Engine:
    return create_engine(make_url(admin_url).set(drivername="postgresql+psycopg"), isolation_level="AUTOCOMMIT")


@pytest.fixture(scope="session")
def admin_engine(pg_admin_url: str) -> Iterator[Engine]:
    engine = _admin_engine(pg_admin_url)
    yield engine
    engine.dispose()


@pytest.fixture(scope="session")
def template_database(pg_admin_url: str, admin_engine: Engine) -> Iterator[str]:
    """A database migrated to head once per session; each test copies it."""
    name = f"scrinalia_tmpl_{uuid.uuid4().hex[:8]}"
    with admin_engine.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    migrate.upgrade(_with_database(pg_admin_url, name))
    yield name
    with admin_engine.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


def _fresh_database(pg_admin_url: str, admin_engine: Engine, template: str | None) -> Iterator[str]:
    name = f"scrinalia_t_{uuid.uuid4().hex[:12]}"
    with admin_engine.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else "")))
    try:
        yield _with_database(pg_admin_url, name)
    finally:
        with admin_engine.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


class DatabasePool:
    """Fresh copies of the template made ahead of time by one background thread, so a test's setup
    takes a database instead of waiting for ``CREATE DATABASE ... TEMPLATE`` (0.1-0.35 s each, about a
    fifth of a typical API test). While a test waits on its processes the next copy is being made.
    Each copy is used by one test and dropped after it, as before; a failed background copy is made
    again in the foreground, so the pool never decides a test's outcome."""

    def __init__(self, admin_engine: Engine, template: str, ahead: int = 2) -> None:
        self.admin_engine = admin_engine
        self.template = template
        self._ready: queue.Queue[str | BaseException] = queue.Queue()
        self._room = threading.Semaphore(ahead)
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._fill, name="test-database-pool", daemon=True)
        self._thread.start()

    def create(self) -> str:
        name = f"scrinalia_t_{uuid.uuid4().hex[:12]}"
        with self.admin_engine.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}" TEMPLATE "{self.template}"'))
        return name

    def _fill(self) -> None:
        while not self._closed.is_set():
            if not self._room.acquire(timeout=0.2):
                continue
            if self._closed.is_set():
                return
            try:
                self._ready.put(self.create())
            except BaseException as exc:  # handed to the test that takes it
                self._ready.put(exc)

    def take(self) -> str:
        item = self._ready.get(timeout=300)
        self._room.release()
        return self.create() if isinstance(item, BaseException) else item

    def close(self) -> None:
        self._closed.set()
        self._thread.join(30)
        while True:
            try:
                item = self._ready.get_nowait()
            except queue.Empty:
                return
            if isinstance(item, str):
                self.drop(item)

    def drop(self, name: str) -> None:
        with self.admin_engine.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


@pytest.fixture(scope="session")
def database_pool(admin_engine: Engine, template_database: str) -> Iterator[DatabasePool]:
    pool = DatabasePool(admin_engine, template_database)
    yield pool
    pool.close()


@pytest.fixture
def database_url(pg_admin_url: str, database_pool: DatabasePool) -> Iterator[str]:
    """A fresh database at the migrations' head, for this test only."""
    name = database_pool.take()
    try:
        yield _with_database(pg_admin_url, name)
    finally:
        database_pool.drop(name)


@pytest.fixture
def empty_database_url(pg_admin_url: str, admin_engine: Engine) -> Iterator[str]:
    """A fresh empty database (no migrations), for migration tests."""
    yield from _fresh_database(pg_admin_url, admin_engine, None)


@pytest.fixture
def engine(database_url: str) -> Iterator[Engine]:
    eng = create_engine_from_url(database_url, pool_size=5, max_overflow=20)
    yield eng
    eng.dispose()


@pytest.fixture(scope="session")
def browser():
    """One chromium for every browser test of this process (the panel's and the installed wheel's).

    Playwright's sync API runs an event loop on the main thread while it is open, so a second
    `sync_playwright()` in the same process fails; under pytest-xdist a worker runs files of several
    folders in one process, so the browser is one session fixture here rather than one per folder.
    """
    from playwright.sync_api import sync_playwright

    from tests.panel.helpers import CHROMIUM, CHROMIUM_ARGS

    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is not installed (apt-get install chromium)")
    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield b
        b.close()
