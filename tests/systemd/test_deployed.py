"""The three units as deployed, under a real systemd: a container booted with systemd as PID 1 on a root of
its own (tests/systemd/container.py), the wheel installed into it as docs/install.md says, the services
started with ``systemctl enable --now`` and driven with ``systemctl`` and ``journalctl``.

One container per module (booted once: about a second; the install: about 20 s). PostgreSQL is this
module's own throwaway cluster on 127.0.0.1 (the container shares the host's network), so a scenario may
stop it. Where the container cannot boot, the tests fail with the reason under CI=true and are skipped
with it elsewhere.
"""
from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.engine import make_url

from scrinalia.db import migrate
from scrinalia.db.local_cluster import LocalCluster, free_port
from scrinalia.domains.archive import ledger
from scrinalia.domains.archive.ledger import WorkerRun
from tests.foundation.schema_revision import set_revision
from tests.foundation.test_database_tls import make_certificates
from tests.systemd.container import Bind, Container, ContainerError, why_no_container

ROOT = Path(__file__).resolve().parents[2]
VENV = "/opt/scrinalia/.venv"
UNITS = ("scrinalia-api", "scrinalia-scheduler", "scrinalia-runner")
OWNER_PASSWORD = uuid.uuid4().hex
RUNNER_PASSWORD = uuid.uuid4().hex
#: The test's own workers, installed into the container's venv as an operator's plugin module would be.
PLUGIN_MODULE = ROOT / "tests" / "systemd" / "deployed_workers.py"

pytestmark = pytest.mark.slow


def _no_container(reason: str) -> None:
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"the real-systemd container cannot run here: {reason}")
    pytest.skip(f"the real-systemd container cannot run here: {reason}")


def wait_for(predicate: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.1)


@dataclass
class Deployment:
    """The booted container with the three services installed, and the database they use."""

    container: Container
    cluster: LocalCluster
    engine: Engine  # the schema owner's, from the host: what the tests read the ledger with
    api_port: int
    timings: dict[str, float]
    cluster_settings: dict[str, str]
    host_sentinel: Path  # a file in the host's /tmp made before the boot: a systemd on the host's / removes it
    host_passwd: str  # the host's /etc/passwd before the boot
    host_units: list[str]  # the host's scrinalia units before the boot (none, but for a host that has them)

    def sh(self, script: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        return self.container.sh(script, **kwargs)

    def systemctl(self, *args: str, check: bool = True, timeout: float = 240) -> subprocess.CompletedProcess[str]:
        return self.sh("systemctl " + " ".join(shlex.quote(a) for a in args), check=check, timeout=timeout)

    def show(self, unit: str, *props: str) -> dict[str, str]:
        out = self.systemctl("show", unit, *(f"--property={p}" for p in props)).stdout
        return dict(line.split("=", 1) for line in out.splitlines() if "=" in line)

    def api_get(self, path: str) -> Any:
        """GET the API from inside the container (it listens on the container's 127.0.0.1)."""
        url = f"http://127.0.0.1:{self.api_port}{path}"
        script = f"import urllib.request as u; print(u.urlopen({url!r}, timeout=5).read().decode())"
        return json.loads(self.sh(f"{VENV}/bin/python -c {shlex.quote(script)}").stdout)

    def runner_status(self) -> dict[str, Any]:
        """``scrinalia-runner status --json`` as root, over the control socket in /run/scrinalia-runner."""
        answer = json.loads(self.sh(f"{VENV}/bin/scrinalia-runner status --json").stdout)
        return answer[0] if isinstance(answer, list) else answer

    def enqueue(self, worker: str, **options: Any) -> uuid.UUID:
        return ledger.enqueue(self.engine, worker, {"options": options}, requested_by="systemd-test").run_id

    def run_row(self, run_id: uuid.UUID) -> WorkerRun:
        row = ledger.get_run(self.engine, run_id)
        assert row is not None
        return row

    def wait_run(self, run_id: uuid.UUID, statuses: set[str], timeout: float) -> WorkerRun:
        return wait_for(lambda: (row := self.run_row(run_id)).status in statuses and row, timeout,
                        f"run {run_id} to be {'/'.join(sorted(statuses))}")

    def runner_pids(self) -> list[int]:
        """Every process of the runner's unit: its cgroup, as the container's systemd keeps it."""
        group = self.show("scrinalia-runner", "ControlGroup")["ControlGroup"]
        if not group:
            return []
        found = self.sh(f"cat /sys/fs/cgroup/systemd{group}/cgroup.procs /sys/fs/cgroup/unified{group}/cgroup.procs "
                        f"/sys/fs/cgroup{group}/cgroup.procs 2>/dev/null", check=False).stdout
        return sorted({int(pid) for pid in found.split()})

    def set_revision(self, revision: str) -> None:
        """As that release leaves the database (a newer one declares nothing this release knows compatible)."""
        set_revision(self.engine, revision)

    def journal(self, *args: str, output: str = "cat") -> str:
        return self.sh(f"journalctl --no-pager -o {output} " + " ".join(shlex.quote(a) for a in args)).stdout


def _build_wheel(out: Path) -> Path:
    """The wheel as ``make dist`` builds it (python -m build, no isolation: the dev venv has setuptools)."""
    proc = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--wheel", "--outdir", str(out),
                           str(ROOT)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (wheel,) = out.glob("scrinalia_runner-*.whl")
    return wheel


def _database(cluster: LocalCluster) -> Engine:
    """docs/install.md 2.5: the schema owner (CREATEROLE, not a superuser) and its database."""
    admin = create_engine(make_url(cluster.url("postgres")).set(drivername="postgresql+psycopg"),
                          isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f"CREATE ROLE scrinalia LOGIN CREATEROLE NOSUPERUSER NOCREATEDB "
                          f"PASSWORD '{OWNER_PASSWORD}'"))
        conn.execute(text("CREATE DATABASE scrinalia OWNER scrinalia"))
    admin.dispose()
    url = make_url(cluster.url("scrinalia")).set(drivername="postgresql+psycopg", username="scrinalia",
                                                 password=OWNER_PASSWORD)
    return create_engine(url)


#: The runner as its unit starts it, with seconds instead of minutes (lease 6 s, drain 4 s).
RUNNER_TEST_FLAGS = (f"{VENV}/bin/scrinalia-runner daemon --name %H --concurrency 1 --heartbeat 1 --lease 6 "
                     "--poll 1 --drain-timeout 4 --kill-grace 2 --cancel-grace 4 --preload torch,transformers")


def write_dropin(container: Container, unit: str, body: str, name: str = "test") -> None:
    """/etc/systemd/system/UNIT.service.d/NAME.conf with ``[Service]`` and ``body`` (no daemon-reload)."""
    directory = f"/etc/systemd/system/{unit}.service.d"
    container.sh(f"mkdir -p {directory} && cat > {directory}/{name}.conf", input=f"[Service]\n{body}\n")


def install(container: Container, wheel_name: str, pg_port: int, api_port: int) -> dict[str, float]:
    """docs/install.md sections 2.2, 2.6-2.8, 3.2-3.4 on one host, each command as written, except: uv
    installs the wheel (pip takes minutes; decision 0300), the database is this test's cluster on localhost
    (TLS verified against its own CA, DB_SSLMODE=verify-full as the env files say), the API on a free port,
    and the test's plugin module beside the wheel."""
    timings: dict[str, float] = {}
    sh = container.sh

    def dropin(unit: str, body: str) -> None:
        write_dropin(container, unit, body)
    started = time.monotonic()
    sh("id scrinalia >/dev/null 2>&1 || useradd --system --user-group --home-dir /var/lib/scrinalia "
       "--shell /usr/sbin/nologin scrinalia\n"
       "install -d -m 0750 -o root -g scrinalia /etc/scrinalia\n"
       f"python3 -m venv {VENV}")
    uv = f"{sys.executable} -m uv pip install -q --system-certs --python {VENV}/bin/python"
    constraint = "torch==2.13.0"  # the CPU build (constraints-cpu.txt)
    sh(f"echo {constraint} > /root/constraints.txt && {uv} -c /root/constraints.txt "
       f"--find-links /opt/wheels '/root/dist/{wheel_name}[api,runner]'", timeout=600)
    sh(f"install -m 0644 /root/plugins/{PLUGIN_MODULE.name} "
       f"\"$({VENV}/bin/python -c 'import sysconfig; print(sysconfig.get_paths()[\"purelib\"])')\"/")
    timings["venv"] = time.monotonic() - started

    owner_url = f"postgresql://scrinalia:{OWNER_PASSWORD}@localhost:{pg_port}/scrinalia"
    runner_url = f"postgresql://scrinalia_runner:{RUNNER_PASSWORD}@localhost:{pg_port}/scrinalia"
    sh("install -m 0640 -o root -g scrinalia /root/plugins/db-ca.pem /etc/scrinalia/db-ca.pem\n"
       f"{VENV}/bin/scrinalia install-units api scheduler runner --user scrinalia --config-dir /etc/scrinalia\n"
       f"sed -i 's|^DATABASE_URL=.*|DATABASE_URL={owner_url}|' /etc/scrinalia/scrinalia.env\n"
       f"sed -i 's|^RUNNER_DATABASE_URL=.*|RUNNER_DATABASE_URL={runner_url}|' /etc/scrinalia/runner.env\n"
       "echo HF_HUB_OFFLINE=1 >> /etc/scrinalia/runner.env\n"
       f"echo SCRINALIA_WORKER_PLUGINS={PLUGIN_MODULE.stem}:ALL >> /etc/scrinalia/runner.env\n"
       "set -a; . /etc/scrinalia/scrinalia.env; set +a\n"
       f"{VENV}/bin/scrinalia db upgrade\n"
       f"RUNNER_DB_PASSWORD={RUNNER_PASSWORD} {VENV}/bin/scrinalia db runner-role")
    # Test-only drop-ins (as `systemctl edit` writes them): the API on a free port; the runner's timings
    # shortened so that a drain, a watchdog kill and a lease expiry take seconds (the unit's own
    # WatchdogSec=, TimeoutStopSec=, KillMode=, OOMPolicy= and Restart*= stay as written).
    dropin("scrinalia-api", f"ExecStart=\nExecStart={VENV}/bin/scrinalia api --host 127.0.0.1 --port {api_port} "
                            "--workers 2")
    dropin("scrinalia-runner", f"ExecStart=\nExecStart={RUNNER_TEST_FLAGS}")
    started = time.monotonic()
    sh("systemctl daemon-reload && systemctl enable --now scrinalia-api scrinalia-scheduler", timeout=240)
    timings["api+scheduler start"] = time.monotonic() - started
    started = time.monotonic()
    sh("systemctl enable --now scrinalia-runner", timeout=240)
    timings["runner start"] = time.monotonic() - started
    return timings


@pytest.fixture(scope="module")
def deployed() -> Iterator[Deployment]:
    reason = why_no_container()
    if reason:
        _no_container(reason)
    scratch = Path(tempfile.mkdtemp(prefix="scrinalia-systemd-"))
    cluster = LocalCluster.create(scratch / "pg")
    # TLS as docs/install.md 2.3 sets it up: a private CA, a server certificate for localhost.
    make_certificates(scratch / "pg" / "tls")
    cluster_settings = {"ssl": "on", "ssl_cert_file": str(scratch / "pg" / "tls" / "server.crt"),
                        "ssl_key_file": str(scratch / "pg" / "tls" / "server.key")}
    cluster.start(fsync=False, max_connections=100, settings=cluster_settings)
    dist = scratch / "dist"
    wheel = _build_wheel(dist)
    plugins = scratch / "plugins"  # what is carried to the host: the test's plugin module, the CA file
    plugins.mkdir()
    (plugins / PLUGIN_MODULE.name).write_text(PLUGIN_MODULE.read_text())
    (plugins / "db-ca.pem").write_text((scratch / "pg" / "tls" / "ca-a.pem").read_text())
    binds = [Bind(dist, "/root/dist"), Bind(plugins, "/root/plugins")]
    uv_cache = Path(subprocess.run([sys.executable, "-m", "uv", "cache", "dir"], capture_output=True, text=True,
                                   check=True).stdout.strip())
    uv_cache.mkdir(parents=True, exist_ok=True)
    binds.append(Bind(uv_cache, str(uv_cache), read_only=False))  # installs take seconds once it is warm
    # The installer (uv) runs from the test's own venv, seen at the same path inside: the container has a
    # /tmp of its own, so a checkout under the host's /tmp (a CI clone) would otherwise not be there.
    binds.append(Bind(Path(sys.prefix), sys.prefix))
    container = Container(scratch / "container", f"scrinalia-{uuid.uuid4().hex[:8]}", binds=binds)
    descriptor, name = tempfile.mkstemp(prefix="scrinalia-host-sentinel-", dir="/tmp")
    os.close(descriptor)
    sentinel = Path(name)
    host_passwd = Path("/etc/passwd").read_text()
    host_units = sorted(p.name for p in Path("/etc/systemd/system").glob("scrinalia-*"))
    engine = None
    try:
        try:
            container.prepare()
            booted = time.monotonic()
            container.boot()
            boot_seconds = time.monotonic() - booted
        except ContainerError as exc:
            _no_container(str(exc))
        engine = _database(cluster)
        api_port = free_port()
        timings = install(container, wheel.name, cluster.port, api_port)
        timings["boot"] = boot_seconds
        print("real-systemd deployment:", ", ".join(f"{k} {v:.1f}s" for k, v in timings.items()))
        yield Deployment(container, cluster, engine, api_port, timings, cluster_settings, sentinel, host_passwd,
                         host_units)
    finally:
        container.destroy()
        if engine is not None:
            engine.dispose()
        cluster.destroy()
        subprocess.run(["rm", "-rf", str(scratch)], check=False)
        sentinel.unlink(missing_ok=True)


def test_the_host_is_left_alone(deployed: Deployment) -> None:
    """The container's systemd booted and installed everything on its own root: the host's /tmp kept its
    files (systemd-tmpfiles cleans a /tmp it boots over), no unit reached the host's /etc, no user either."""
    assert deployed.host_sentinel.exists()
    assert deployed.sh(f"test -e {deployed.host_sentinel}", check=False).returncode != 0  # its /tmp is its own
    assert sorted(p.name for p in Path("/etc/systemd/system").glob("scrinalia-*")) == deployed.host_units
    assert deployed.sh("test -e /etc/systemd/system/scrinalia-runner.service", check=False).returncode == 0
    assert Path("/etc/passwd").read_text() == deployed.host_passwd  # the service user is the container's


# --- each unit active only once ready, with its status line ------------------------------------------------

def test_units_are_active_once_ready_and_show_their_status(deployed: Deployment) -> None:
    for unit in UNITS:
        props = deployed.show(unit, "ActiveState", "SubState", "Type", "StatusText", "NRestarts")
        assert props["ActiveState"] == "active" and props["SubState"] == "running", (unit, props)
        assert props["Type"] == "notify", (unit, props)
        assert props["StatusText"], f"{unit} sent no STATUS= line: {props}"
        assert props["NRestarts"] == "0", (unit, props)
    # `enable --now` returned, so each service had said READY=1: the API answers at once, the runner is
    # registered and answers on its control socket with its fork server preloaded.
    health = deployed.api_get("/healthz")
    assert health["database"] == "ok" and health["schema"] == "current", health
    status = deployed.runner_status()
    assert status["state"] == "running", status
    with deployed.engine.connect() as conn:
        names = conn.execute(text("SELECT name FROM archive_worker_runners WHERE stopped_at IS NULL")).scalars().all()
    assert deployed.container.name in names
    shown = deployed.systemctl("status", "scrinalia-runner", "--no-pager", check=False).stdout
    assert "Status: \"" in shown, shown
    # The journal as an operator reads it: each service's lines at their priority, with their logger.
    for unit, logger in (("scrinalia-api", "uvicorn.error"), ("scrinalia-runner", "scrinalia.runner"),
                         ("scrinalia-scheduler", "scrinalia.scheduler")):
        entries = [json.loads(line) for line in deployed.journal("-u", unit, f"LOGGER={logger}", output="json")
                   .splitlines() if line.strip()]
        assert entries and all(e["PRIORITY"] in "234567" for e in entries), (unit, len(entries))


@pytest.fixture
def runner_scenario(deployed: Deployment) -> Iterator[Deployment]:
    """A scenario that stops or restarts the runner itself, in whatever state the runner is: the test's
    drop-in removed and a failed state reset when it ends. No start before it: each start preloads torch
    (seconds, half a minute on a loaded host), and these scenarios begin with a stop or a restart."""
    yield deployed
    deployed.sh("rm -f /etc/systemd/system/scrinalia-runner.service.d/scenario.conf && systemctl daemon-reload")
    deployed.systemctl("reset-failed", "scrinalia-runner", check=False)


@pytest.fixture
def runner_up(runner_scenario: Deployment) -> Deployment:
    """The runner active when the test starts (started only if it is not), cleaned up as ``runner_scenario``."""
    deployed = runner_scenario
    if deployed.show("scrinalia-runner", "ActiveState")["ActiveState"] != "active":
        deployed.systemctl("reset-failed", "scrinalia-runner", check=False)
        deployed.systemctl("start", "scrinalia-runner")
    return deployed


# --- systemctl stop drains -----------------------------------------------------------------------------------

def test_stop_drains_the_run_in_flight_and_leaves_nothing(runner_up: Deployment) -> None:
    deployed = runner_up
    short = deployed.enqueue("deployed-slow", units=4, pause=0.5)  # 2 s: ends within --drain-timeout 4
    deployed.wait_run(short, {"RUNNING"}, 60)
    assert len(deployed.runner_pids()) >= 3  # the supervisor, its fork server, the run's child
    deployed.systemctl("stop", "scrinalia-runner")
    assert deployed.run_row(short).status == "SUCCESS"  # finished during the drain, before stop returned
    props = deployed.show("scrinalia-runner", "ActiveState", "Result", "ExecMainStatus")
    assert props == {"ActiveState": "inactive", "Result": "success", "ExecMainStatus": "0"}, props
    assert deployed.runner_pids() == []

    deployed.systemctl("start", "scrinalia-runner")
    long = deployed.enqueue("deployed-slow", units=200, pause=0.5)  # outlives the drain
    deployed.wait_run(long, {"RUNNING"}, 60)
    deployed.systemctl("stop", "scrinalia-runner")
    row = deployed.run_row(long)
    assert (row.status, row.exit_reason) == ("INTERRUPTED", "runner-stopped"), row
    props = deployed.show("scrinalia-runner", "ActiveState", "Result", "ExecMainStatus")
    assert props == {"ActiveState": "inactive", "Result": "success", "ExecMainStatus": "0"}, props
    assert deployed.runner_pids() == []
    stopping = deployed.journal("-u", "scrinalia-runner", f"RUN_ID={long}")
    assert "-> INTERRUPTED runner-stopped" in stopping, stopping


# --- a frozen supervisor: the watchdog ------------------------------------------------------------------------

def test_a_frozen_supervisor_is_killed_by_the_watchdog_and_restarted(runner_scenario: Deployment) -> None:
    deployed = runner_scenario
    unit = deployed.sh("cat /etc/systemd/system/scrinalia-runner.service").stdout
    assert "\nWatchdogSec=" in unit and "\nRestart=on-failure" in unit  # the unit as written arms both
    # A watchdog of seconds, not a minute, and a restart a second after (a drop-in; the mechanism is the unit's).
    write_dropin(deployed.container, "scrinalia-runner", "WatchdogSec=3\nRestartSec=1", name="scenario")
    deployed.sh("systemctl daemon-reload")
    deployed.systemctl("restart", "scrinalia-runner")
    held = deployed.enqueue("deployed-slow", units=400, pause=0.5)
    deployed.wait_run(held, {"RUNNING"}, 60)
    before = deployed.show("scrinalia-runner", "MainPID", "NRestarts")
    children = [c["pid"] for c in deployed.runner_status()["children"]]
    assert children, "the run's child"
    deployed.sh(f"kill -STOP {before['MainPID']}")
    after = wait_for(lambda: (p := deployed.show("scrinalia-runner", "MainPID", "NRestarts", "ActiveState"))
                     ["ActiveState"] == "active" and p["NRestarts"] != before["NRestarts"] and p, 90,
                     "the watchdog to kill the frozen supervisor and systemd to restart it")
    assert after["MainPID"] != before["MainPID"]
    assert int(after["NRestarts"]) == int(before["NRestarts"]) + 1
    journal = deployed.journal("-u", "scrinalia-runner", output="short")
    assert "Watchdog timeout" in journal, journal[-3000:]
    for pid in children:  # the old child went with its supervisor's cgroup
        assert deployed.sh(f"test -e /proc/{pid}", check=False).returncode != 0, pid
    row = deployed.wait_run(held, {"INTERRUPTED", "FAILED", "SUCCESS"}, 60)
    assert row.status == "INTERRUPTED", row
    with deployed.engine.connect() as conn:
        held_twice = conn.execute(text("SELECT count(*) FROM archive_worker_runs WHERE worker_name = 'deployed-slow' "
                                       "AND status IN ('QUEUED', 'RUNNING')")).scalar_one()
    assert held_twice == 0  # nobody runs it again


# --- the schema's exit codes: no restart loop; a database down: retried --------------------------------------

@pytest.mark.parametrize(("revision", "code", "words"), [
    ("0010", 4, "migrate first with `scrinalia db upgrade`"),
    ("0099_from_a_newer_release", 7, "upgrade this"),
])
def test_a_schema_behind_or_ahead_fails_once_without_a_restart_loop(runner_scenario: Deployment, revision: str,
                                                                    code: int, words: str) -> None:
    deployed = runner_scenario
    deployed.systemctl("stop", *UNITS)
    head = migrate.head_revision()
    deployed.set_revision(revision)
    refused: dict[str, dict[str, str]] = {}
    try:
        for unit in UNITS:
            started = deployed.systemctl("start", unit, check=False)
            assert started.returncode != 0, unit
            refused[unit] = deployed.show(unit, "ActiveState", "Result", "ExecMainStatus", "NRestarts",
                                          "ExecMainPID")
    finally:
        deployed.set_revision(head)
    for unit, props in refused.items():
        # failed, not auto-restart: no restart is pending; one start only
        assert props["ActiveState"] == "failed" and props["ExecMainStatus"] == str(code), (unit, props)
        assert props["NRestarts"] == "0", (unit, props)
        # What the refused process wrote: one line, at priority err, naming the cause.
        lines = deployed.journal(f"_PID={props['ExecMainPID']}", output="json").splitlines()
        entries = [json.loads(line) for line in lines if line.strip()]
        assert len(entries) == 1 and words in entries[0]["MESSAGE"], (unit, entries)
        assert entries[0]["PRIORITY"] == "3", (unit, entries)
    deployed.systemctl("reset-failed", *UNITS, check=False)
    deployed.systemctl("start", "scrinalia-api", "scrinalia-scheduler")


def test_a_database_down_at_start_is_retried_until_it_answers(runner_scenario: Deployment) -> None:
    deployed = runner_scenario
    # Seconds between tries instead of RestartSec=10 (a drop-in); Restart= and the exit code are the unit's.
    write_dropin(deployed.container, "scrinalia-runner", "RestartSec=1", name="scenario")
    deployed.sh("systemctl daemon-reload")
    deployed.systemctl("stop", "scrinalia-runner")
    deployed.cluster.stop()
    try:
        deployed.systemctl("start", "--no-block", "scrinalia-runner")
        wait_for(lambda: int(deployed.show("scrinalia-runner", "NRestarts")["NRestarts"]) >= 2, 90,
                 "systemd to retry the runner while the database is down")
        refused = deployed.show("scrinalia-runner", "ActiveState", "ExecMainStatus")
        assert refused["ActiveState"] in ("activating", "failed") and refused["ExecMainStatus"] in ("5", "0"), refused
    finally:
        deployed.cluster.start(fsync=False, max_connections=100, settings=deployed.cluster_settings)
        deployed.engine.dispose()
    wait_for(lambda: deployed.show("scrinalia-runner", "ActiveState")["ActiveState"] == "active", 90,
             "the runner to come up once the database answers")
    assert deployed.runner_status()["state"] == "running"
    said = deployed.journal("-u", "scrinalia-runner", "-p", "err", output="json").splitlines()
    assert any("database" in json.loads(line)["MESSAGE"] for line in said if line.strip())


# --- the OOM killer inside the unit's memory limit ---------------------------------------------------------

def why_no_memory_limit(deployed: Deployment) -> str | None:
    """None when a unit of the container's systemd gets the memory limit it asks for; else why not. Asked of
    a transient unit (``systemd-run -p MemoryMax=``), so a host that cannot costs no runner restart."""
    limit = 64 << 20
    deployed.sh(f"systemd-run --quiet --unit=memory-probe -p MemoryMax={limit} -p MemoryLimit={limit} sleep 30")
    try:
        group = deployed.show("memory-probe", "ControlGroup")["ControlGroup"]
        for path in (f"/sys/fs/cgroup{group}/memory.max", f"/sys/fs/cgroup/unified{group}/memory.max",
                     f"/sys/fs/cgroup/memory{group}/memory.limit_in_bytes"):
            found = deployed.sh(f"cat {path}", check=False).stdout.strip()
            if found.isdigit() and int(found) == limit:
                return None
        layout = deployed.sh("grep cgroup /proc/self/mounts", check=False).stdout
    finally:
        deployed.systemctl("stop", "memory-probe", check=False)
    memory_v1 = [line.split()[1] for line in layout.splitlines() if " cgroup " in line and "memory" in line]
    return ("this host's cgroup layout cannot give a unit of the container a memory limit: the memory controller "
            f"is on cgroup v1, mounted read-only in the container ({memory_v1[0] if memory_v1 else 'absent'}), "
            "and the cgroup v2 hierarchy has no memory controller (a cgroup v2 host runs this scenario)")


def test_a_child_killed_by_the_oom_killer_is_one_failed_run_and_the_service_stays(runner_up: Deployment) -> None:
    deployed = runner_up
    why_not = why_no_memory_limit(deployed)
    if why_not:
        pytest.skip(why_not)
    pids = " ".join(str(pid) for pid in deployed.runner_pids())
    rss_kib = deployed.sh(f"for p in {pids}; do grep VmRSS /proc/$p/status; done | awk '{{s += $2}} END {{print s}}'")
    limit = (int(rss_kib.stdout) // 1024 + 400) << 20  # what the supervisor and its preloaded fork server use, +400 MiB
    write_dropin(deployed.container, "scrinalia-runner", f"MemoryMax={limit}\nMemoryLimit={limit}", name="scenario")
    deployed.sh("systemctl daemon-reload")
    deployed.systemctl("restart", "scrinalia-runner")
    pid = deployed.show("scrinalia-runner", "MainPID")["MainPID"]
    hog = deployed.enqueue("deployed-memory-hog", cap_mb=4096)
    row = deployed.wait_run(hog, {"SUCCESS", "FAILED", "INTERRUPTED", "CANCELLED"}, 120)
    assert (row.status, row.exit_reason) == ("FAILED", "oom"), (row.status, row.exit_reason, row.error)
    after = deployed.show("scrinalia-runner", "ActiveState", "MainPID", "NRestarts")
    assert after["ActiveState"] == "active" and after["MainPID"] == pid, after  # OOMPolicy=continue
    with deployed.engine.connect() as conn:
        runs = conn.execute(text("SELECT count(*) FROM archive_worker_runs WHERE worker_name = "
                                 "'deployed-memory-hog'")).scalar_one()
    assert runs == 1
    assert deployed.runner_status()["state"] == "running"


# --- a real embedding run under the unit's sandbox -----------------------------------------------------------

def test_a_real_embedding_run_under_the_sandbox(runner_up: Deployment) -> None:
    deployed = runner_up
    titles = {"A1": "Letters of the bishop to the cathedral chapter", "B1": "Map of the river harbour",
              "C": "Accounts of the hospital pharmacy"}
    with deployed.engine.begin() as conn:
        for code, title in titles.items():
            conn.execute(text("INSERT INTO archive_documents (reference_code, title, status) "
                              "VALUES (:c, :t, 'DRAFT')"), {"c": code, "t": title})
    run_id = ledger.enqueue(deployed.engine, "embedding", {"preset": "cpu"}, requested_by="systemd-test").run_id
    row = deployed.wait_run(run_id, {"SUCCESS", "FAILED", "INTERRUPTED", "CANCELLED"}, 180)
    assert row.status == "SUCCESS", row.error
    assert row.result is not None and row.result["embedded"] == 3, row.result
    with deployed.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM archive_document_embeddings")).scalar_one() == 3
    # The sandbox: everything but the unit's own directories is read-only; nothing tried to write elsewhere.
    logged = deployed.journal("-u", "scrinalia-runner", f"RUN_ID={run_id}") + deployed.journal(
        "-u", "scrinalia-runner", "-p", "warning")
    for refusal in ("Read-only file system", "Permission denied", "not writable", "Errno 30", "Errno 13"):
        assert refusal not in logged, logged[-3000:]
    # Where the libraries would write: the unit's CacheDirectory= and StateDirectory=, the service user's.
    listed = deployed.show("scrinalia-runner", "Environment")["Environment"].split()
    environ = {name: value for name, _, value in (item.partition("=") for item in listed)
               if name in ("HF_HOME", "XDG_CACHE_HOME", "HOME")}
    assert environ == {"HF_HOME": "/var/cache/scrinalia-runner/huggingface",
                       "XDG_CACHE_HOME": "/var/cache/scrinalia-runner", "HOME": "/var/lib/scrinalia-runner"}, environ
    owners = deployed.sh("stat -c '%U %a' /var/cache/scrinalia-runner /var/lib/scrinalia-runner").stdout.split("\n")
    assert owners[:2] == ["scrinalia 700", "scrinalia 700"], owners
