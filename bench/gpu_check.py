"""The GPU acceptance check: the CUDA path of the runner on a real GPU, as one script (< 8 minutes).

For a machine with an NVIDIA GPU and Python 3.12 with CUDA torch, transformers and nvidia-ml-py, but
no PostgreSQL and no network. ``bench/gpu_check_prepare.sh`` fills ``.gpucheck/`` beforehand (on a
machine with the package registries); this script, run from the repository root:

  0. unpacks PostgreSQL 15, installs the project's wheel in a venv over the system's site-packages
     (torch, transformers, nvidia-ml-py stay the system's), starts a throwaway cluster (as the
     ``postgres`` user when root: initdb refuses root; the user is created if missing), migrates,
     seeds ``--docs`` documents and builds an all-MiniLM-L6-v2-shaped model with random weights;
  1. ``scrinalia-runner run gpu-probe``: SUCCESS with the device's name, memory and an fp16 matmul time;
  2. a daemon with ``--concurrency 2 --per-device 2``: ``embedding`` with the ``cuda`` preset (fp16)
     and ``gpu-check-assert`` (a real device-side assert) at once: the crash ends FAILED ``cuda-error``
     with a fingerprint, the embedding SUCCESS, and a third run on the same device succeeds;
  3. ``status --json`` during those runs shows each child's GPU memory and device; the supervisor's and
     the fork server's ``/proc/PID/maps`` have no ``libcuda``;
  4. the embedding throughput through the runner against a bare script (same model, batch size and
     texts, same GPU): target >= 0.95;
  5. one line ``N passed, M failed``, and every figure in one JSON file (``--out``).

``--dry`` (any machine): step 0 with this interpreter's environment instead of the wheels, and step 1
(on CPU without a GPU): proves the bundle (PostgreSQL relocated, migrations, seeding, the model) here.

Usage:  python3 bench/gpu_check.py [--bundle .gpucheck] [--out gpucheck.json] [--docs 4000] [--dry]
Helpers (run inside the venv by the check itself): ``seed URL N``, ``model SRC DST``, ``enqueue URL ...``,
``bare URL MODEL BATCH``.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
BATCH = 64        # texts per forward pass (both sides)
DB_BATCH = 256    # documents per fenced commit
SERVER_USER = "postgres"


# --- the record of checks ---------------------------------------------------------------------------


class Report:
    def __init__(self, out: Path) -> None:
        self.out = out
        self.checks: list[dict[str, Any]] = []
        self.figures: dict[str, Any] = {}
        self.started = time.monotonic()

    def check(self, name: str, ok: bool, detail: Any = None) -> bool:
        self.checks.append({"check": name, "ok": bool(ok), "detail": detail})
        print(f"[{'PASS' if ok else 'FAIL'}] {name}" + (f": {detail}" if detail is not None else ""), flush=True)
        return bool(ok)

    def finish(self) -> int:
        passed = sum(c["ok"] for c in self.checks)
        failed = len(self.checks) - passed
        self.figures["elapsed_seconds"] = round(time.monotonic() - self.started, 1)
        self.out.write_text(json.dumps({"passed": passed, "failed": failed, "checks": self.checks,
                                        "figures": self.figures}, indent=2, default=str))
        print(f"{passed} passed, {failed} failed  (figures: {self.out})", flush=True)
        return 0 if failed == 0 else 1


# --- step 0: the environment -------------------------------------------------------------------------


def run(argv: list[str], env: dict[str, str] | None = None, timeout: float = 300, check: bool = True,
        user: str | None = None) -> subprocess.CompletedProcess:
    if user is not None and os.geteuid() == 0:
        argv = ["runuser", "-u", user, "--", *argv]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        output = done.stderr[-2000:] or done.stdout[-2000:]
        raise RuntimeError(f"{' '.join(argv[:3])} ... failed ({done.returncode}): {output}")
    return done


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Cluster:
    """A throwaway PostgreSQL from the bundle's binaries; only its own processes get LD_LIBRARY_PATH."""

    def __init__(self, work: Path, pg_root: Path) -> None:
        bindirs = sorted((pg_root / "usr/lib/postgresql").glob("*/bin"))
        if not bindirs:
            raise RuntimeError(f"no PostgreSQL binaries under {pg_root}")
        self.bindir = bindirs[-1]
        self.data = work / "pgdata"
        self.sockets = work / "pgsocket"
        self.log = work / "postgres.log"
        self.port = free_port()
        self.env = dict(os.environ, LD_LIBRARY_PATH=str(pg_root / "lib"), TZ="UTC", LC_ALL="C.UTF-8")
        self.user = SERVER_USER if os.geteuid() == 0 else None

    def start(self) -> str:
        if self.user is not None:
            if run(["id", "-u", self.user], check=False).returncode != 0:
                run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", self.user])
            for path in [self.data.parent, *self.data.parent.parents]:
                if path != Path("/"):
                    os.chmod(path, path.stat().st_mode | 0o011)
        for d in (self.data, self.sockets):
            d.mkdir(parents=True, exist_ok=True)
        self.log.touch()
        if self.user is not None:
            for p in (self.data, self.sockets, self.log):
                shutil.chown(p, self.user, self.user)
        os.chmod(self.data, 0o700)
        run([str(self.bindir / "initdb"), "-D", str(self.data), "-U", SERVER_USER, "-A", "trust", "-E", "UTF8",
             "--locale=C.UTF-8", "--no-sync"], env=self.env, user=self.user)
        opts = (f"-p {self.port} -k {self.sockets} -c listen_addresses=127.0.0.1 -c jit=off -c fsync=off "
                "-c synchronous_commit=off -c max_connections=100")
        run([str(self.bindir / "pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-o", opts, "-w", "-t", "60",
             "start"], env=self.env, user=self.user)
        return f"postgresql://{SERVER_USER}@127.0.0.1:{self.port}/gpucheck"

    def stop(self) -> None:
        run([str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop"], env=self.env,
            user=self.user, check=False)


def venv_python(work: Path, bundle: Path, dry: bool) -> Path:
    """The interpreter that runs the project: a venv over the system's site-packages with the wheels."""
    if dry:
        return Path(sys.executable)
    venv = work / "venv"
    py = venv / "bin" / "python"
    made = subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], capture_output=True)
    wheels = [str(w) for w in sorted((bundle / "wheels").glob("*.whl"))]
    install = ["install", "-q", "--no-index", "--find-links", str(bundle / "wheels"), *wheels]
    if made.returncode == 0:
        run([str(py), "-m", "pip", *install], timeout=600)
    else:  # no ensurepip on this Python: the system's pip installs into the venv made without one
        run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", str(venv)])
        run([sys.executable, "-m", "pip", "--python", str(py), *install], timeout=600)
    return py


def create_database(py: Path, url: str) -> None:
    code = ("import sys; from sqlalchemy import create_engine, text; "
            "e = create_engine(sys.argv[1].rsplit('/', 1)[0].replace('postgresql://', 'postgresql+psycopg://') "
            "+ '/postgres', isolation_level='AUTOCOMMIT'); c = e.connect(); "
            "c.execute(text('CREATE DATABASE gpucheck')) if not c.execute(text("
            "\"SELECT 1 FROM pg_database WHERE datname = 'gpucheck'\")).first() else None")
    run([str(py), "-c", code, url])


# --- helpers run in the venv ---------------------------------------------------------------------------


def helper_seed(url: str, n: int) -> None:
    """``n`` documents from the demo collection (reference codes made unique)."""
    from sqlalchemy import text

    from scrinalia.db.engine import create_engine_from_url
    from scrinalia.domains.archive.demo import demo_path

    records = [json.loads(line) for line in demo_path().read_text(encoding="utf-8").splitlines() if line.strip()]
    rows = []
    for i in range(n):
        r = dict(records[i % len(records)])
        r["reference_code"] = f"{r['reference_code']}/{i}"
        rows.append(r)
    engine = create_engine_from_url(url)
    with engine.begin() as conn:
        conn.execute(text("""INSERT INTO archive_documents (reference_code, title, scope_and_content,
            admin_biographical_history, provenance) SELECT reference_code, title, scope_and_content,
            admin_biographical_history, provenance FROM jsonb_to_recordset(CAST(:rows AS jsonb)) AS x(
            reference_code text, title text, scope_and_content text, admin_biographical_history text,
            provenance text)"""),
                     {"rows": json.dumps(rows)})
        conn.execute(text("ANALYZE archive_documents"))
    engine.dispose()


def helper_model(src: str, dst: str) -> None:
    """all-MiniLM-L6-v2's architecture and tokenizer with random weights (the same compute per text)."""
    import torch
    from transformers import AutoConfig, AutoModel

    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(src)
    model = AutoModel.from_config(config)
    Path(dst).mkdir(parents=True, exist_ok=True)
    model.save_pretrained(dst, safe_serialization=True)
    for f in Path(src).iterdir():
        if f.name != "config.json":
            shutil.copy(f, Path(dst) / f.name)


def helper_enqueue(url: str, worker: str, request: str) -> None:
    from scrinalia.db.engine import create_engine_from_url
    from scrinalia.domains.archive import ledger

    engine = create_engine_from_url(url)
    print(ledger.enqueue(engine, worker, json.loads(request), requested_by="gpu-check").run_id)
    engine.dispose()


def helper_runs(url: str) -> None:
    """Every run, as JSON lines (the check reads the ledger through the project's own code)."""
    from sqlalchemy import text

    from scrinalia.db.engine import create_engine_from_url
    from scrinalia.domains.archive.ledger import RUN_COLUMNS, WorkerRun

    engine = create_engine_from_url(url)
    with engine.connect() as conn:
        for row in conn.execute(text(f"SELECT {RUN_COLUMNS} FROM archive_worker_runs ORDER BY id")):
            print(json.dumps(WorkerRun.from_row(row).to_json(), default=str))
    engine.dispose()


def helper_reset(url: str) -> None:
    from sqlalchemy import text

    from scrinalia.db.engine import create_engine_from_url

    engine = create_engine_from_url(url)
    with engine.begin() as conn:
        conn.execute(text("DELETE FROM archive_document_embeddings"))
        conn.execute(text("UPDATE archive_documents SET execution_log = execution_log - 'embedding'"))
    engine.dispose()


def helper_bare(url: str, model: str, batch: int) -> None:
    """The bare script: the same texts (one SELECT), the same engine class, fp16 on cuda, nothing written.
    Timed like the runner's ``worker_seconds`` (the worker's code: the model load, then every batch), so
    the ratio is the cost of the runner's own work per batch (the stamp query, the fenced commits)."""
    from sqlalchemy import create_engine, text

    from scrinalia.domains.archive.workers.engines.embedding import TransformersEmbedder
    from scrinalia.domains.archive.workers.stamps import COMPOSED_TEXT_SQL

    t0 = time.perf_counter()
    engine = create_engine(url.replace("postgresql://", "postgresql+psycopg://"))
    with engine.connect() as conn:
        texts = list(conn.execute(text("SELECT " + COMPOSED_TEXT_SQL.format(a="d")
                                       + " FROM archive_documents d ORDER BY id")).scalars())
    cuda = os.environ.get("GPU_CHECK_REHEARSAL") != "1"
    t1 = time.perf_counter()  # from here as in the runner's worker_seconds: the model load, then the batches
    embedder = TransformersEmbedder({"model": model, "device": "cuda" if cuda else "cpu",
                                     "dtype": "float16" if cuda else "float32", "batch_size": batch, "max_length": 256})
    loaded = time.perf_counter()
    n = 0
    for start in range(0, len(texts), DB_BATCH):
        n += len(embedder.embed(texts[start:start + DB_BATCH]))
    import torch

    if cuda:
        torch.cuda.synchronize()
    t2 = time.perf_counter()
    print(json.dumps({"n": n, "embed_seconds": t2 - t1, "load_seconds": loaded - t1, "setup_seconds": t1 - t0}))


HELPERS = {"seed": lambda a: helper_seed(a[0], int(a[1])), "model": lambda a: helper_model(a[0], a[1]),
           "enqueue": lambda a: helper_enqueue(a[0], a[1], a[2]), "runs": lambda a: helper_runs(a[0]),
           "reset": lambda a: helper_reset(a[0]), "bare": lambda a: helper_bare(a[0], a[1], int(a[2]))}


# --- the checks ----------------------------------------------------------------------------------------


class Project:
    """The project's commands and helpers, run with the venv's interpreter and the check's environment."""

    def __init__(self, py: Path, url: str, work: Path) -> None:
        self.py = py
        self.url = url
        self.bindir = py.parent
        self.env = dict(os.environ, DATABASE_URL=url, PYTHONUNBUFFERED="1",
                        SCRINALIA_WORKER_PLUGINS="gpu_check_workers:ALL",
                        PYTHONPATH=str(ROOT / "bench"), XDG_RUNTIME_DIR=str(work))
        self.env.pop("LD_LIBRARY_PATH", None)

    def cli(self, name: str, *args: str, timeout: float = 300, check: bool = True) -> subprocess.CompletedProcess:
        exe = self.bindir / name
        module = {"scrinalia": "scrinalia.cli.main", "scrinalia-runner": "runner.cli"}[name]
        argv = [str(exe), *args] if exe.exists() else [str(self.py), "-m", module, *args]
        return run(argv, env=self.env, timeout=timeout, check=check)

    def helper(self, *args: str, timeout: float = 300) -> str:
        return run([str(self.py), str(Path(__file__).resolve()), "--helper", *args], env=self.env,
                   timeout=timeout).stdout

    def enqueue(self, worker: str, request: dict[str, Any]) -> str:
        return self.helper("enqueue", self.url, worker, json.dumps(request)).strip().splitlines()[-1]

    def runs(self) -> dict[str, dict[str, Any]]:
        return {r["run_id"]: r for r in map(json.loads, self.helper("runs", self.url).splitlines()) if r}

    def wait_runs(self, run_ids: list[str], timeout: float) -> dict[str, dict[str, Any]]:
        deadline = time.monotonic() + timeout
        while True:
            rows = self.runs()
            if all(rows.get(r, {}).get("status") not in (None, "QUEUED", "RUNNING") for r in run_ids):
                return rows
            if time.monotonic() > deadline:
                return rows
            time.sleep(0.5)


def libcuda_mapped(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/maps") as fh:
            return any("/libcuda.so" in line for line in fh)
    except OSError:
        return False


def step_probe(p: Project, report: Report, dry: bool) -> None:
    done = p.cli("scrinalia-runner", "run", "gpu-probe", "--json", timeout=180, check=False)
    try:
        row = json.loads(done.stdout)
    except ValueError:
        report.check("1 gpu-probe (one-shot CLI) SUCCESS", False, done.stderr[-1500:])
        return
    devices = [d for d in (row.get("result") or {}).get("devices", []) if str(d.get("device", "")).startswith("cuda")]
    report.figures["gpu_probe"] = row.get("result")
    report.check("1 gpu-probe (one-shot CLI) SUCCESS", row.get("status") == "SUCCESS", row.get("error"))
    if dry:
        return
    first = devices[0] if devices else {}
    report.check("1 gpu-probe reports the device's name, memory and an fp16 matmul timing",
                 bool(first.get("name") and first.get("total_memory_mib") and (first.get("matmul") or {}).get("ms")
                      and (first.get("matmul") or {}).get("dtype") == "float16"), first or row.get("result"))


REHEARSAL = os.environ.get("GPU_CHECK_REHEARSAL") == "1"  # steps 2-4 on CPU, to rehearse the script itself


def embedding_request(model: str) -> dict[str, Any]:
    return {"preset": "cpu" if REHEARSAL else "cuda", "db_batch_size": DB_BATCH,
            "engine_options": {"model": model, "batch_size": BATCH}}


def step_daemon(p: Project, report: Report, work: Path, model: str, docs: int) -> dict[str, Any]:
    sock = work / "gpucheck.sock"
    log = open(work / "runner.log", "wb")
    daemon = subprocess.Popen(
        [str(p.bindir / "scrinalia-runner"), "daemon", "--name", "gpucheck", "--concurrency", "2", "--per-device", "2",
         "--devices", "0" if REHEARSAL else "auto", "--heartbeat", "1", "--lease", "10", "--poll", "0.2",
         "--socket", str(sock),
         "--preload", "torch,transformers"], env=p.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    out: dict[str, Any] = {}
    try:
        status = wait_status(p, sock, daemon, 180)
        report.check("2 daemon started with its devices", bool(status and status["devices"]),
                     status and status["devices"])
        if not status:
            return out
        out["supervisor_pid"], out["fork_server_pid"] = status["pid"], status["launcher"].get("pid")
        embed = p.enqueue("embedding", embedding_request(model))
        crash = p.enqueue("gpu-check-assert", {"options": {"hold_seconds": 6}})
        peaks: dict[str, int] = {}
        devices: dict[str, Any] = {}
        together = False
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            snap = query_status(p, sock)
            if snap:
                children = snap["children"]
                together |= {c["run_id"] for c in children} >= {embed, crash}
                for c in children:
                    peaks[c["run_id"]] = max(peaks.get(c["run_id"], 0), c.get("gpu_memory_bytes") or 0)
                    devices[c["run_id"]] = c.get("device")
            rows = p.runs()
            if all(rows.get(r, {}).get("status") in ("SUCCESS", "FAILED", "INTERRUPTED", "CANCELLED")
                   for r in (embed, crash)):
                break
            time.sleep(0.2)
        rows = p.runs()
        e, c = rows.get(embed, {}), rows.get(crash, {})
        report.check("2 the two runs ran at once on the device (--per-device 2)", together, devices)
        report.check("2 the device-side assert ends FAILED cuda-error with a fingerprint",
                     c.get("status") == "FAILED" and c.get("exit_reason") == "cuda-error"
                     and (c.get("error") or "").startswith("CudaError: device-side assert triggered")
                     and bool(c.get("error_fingerprint")),
                     {k: c.get(k) for k in ("status", "exit_reason", "error_fingerprint")}
                     | {"error": (c.get("error") or "")[:300]})
        report.check("2 the embedding run (cuda preset, fp16) ends SUCCESS",
                     e.get("status") == "SUCCESS" and (e.get("result") or {}).get("embedded") == docs,
                     {k: e.get(k) for k in ("status", "error", "result")})
        metrics = e.get("metrics") or {}
        report.check("2 the run's metrics record the device's name and UUID and the child's peak GPU memory",
                     bool((metrics.get("device") or {}).get("uuid") and (metrics.get("device") or {}).get("name")
                          and metrics.get("gpu_peak_bytes")), {k: metrics.get(k) for k in ("device", "gpu_peak_bytes")})
        report.check("3 status --json showed each child's GPU memory",
                     peaks.get(embed, 0) > 0 and peaks.get(crash, 0) > 0, peaks)
        report.check("3 no libcuda in the supervisor's and the fork server's maps",
                     not libcuda_mapped(out["supervisor_pid"]) and out["fork_server_pid"] is not None
                     and not libcuda_mapped(out["fork_server_pid"]), out)
        third = p.enqueue("gpu-probe", {"options": {"matmul_size": 2048, "repeats": 5}})
        rows = p.wait_runs([third], 120)
        t = rows.get(third, {})
        same = (((t.get("metrics") or {}).get("device") or {}).get("uuid")
                == ((c.get("metrics") or {}).get("device") or {}).get("uuid"))
        report.check("2 a third run on the same device afterwards succeeds", t.get("status") == "SUCCESS" and same,
                     {k: t.get(k) for k in ("status", "error")} | {"device": (t.get("metrics") or {}).get("device")})
        out["crash"] = {k: c.get(k) for k in ("exit_reason", "error_fingerprint", "metrics")}
        out["embedding_concurrent"] = {k: e.get(k) for k in ("duration_ms", "metrics")}
        out["gpu_memory_peaks"] = peaks

        # 4. Throughput: the embedding run alone through the runner against the bare script, alternated.
        rounds = []
        for _ in range(2):
            bare = json.loads(p.helper("bare", p.url, model, str(BATCH), timeout=300).strip().splitlines()[-1])
            p.helper("reset", p.url)
            rid = p.enqueue("embedding", embedding_request(model))
            r = p.wait_runs([rid], 300).get(rid, {})
            rounds.append({"bare": bare, "runner": {k: r.get(k) for k in ("status", "duration_ms")}
                           | {"units_per_second": (r.get("metrics") or {}).get("units_per_second"),
                              "worker_seconds": (r.get("metrics") or {}).get("worker_seconds")}})
        bare_rate = max(docs / r["bare"]["embed_seconds"] for r in rounds)
        runner_rate = max((r["runner"]["units_per_second"] or 0) for r in rounds)
        ratio = runner_rate / bare_rate if bare_rate else 0.0
        out["throughput"] = {"docs": docs, "batch_size": BATCH, "db_batch_size": DB_BATCH, "rounds": rounds,
                             "bare_docs_per_s": round(bare_rate, 1), "runner_docs_per_s": round(runner_rate, 1),
                             "ratio": round(ratio, 3), "target": 0.95}
        report.check("4 embedding throughput runner/bare >= 0.95", ratio >= 0.95, out["throughput"] | {"rounds": None})
        daemon.send_signal(signal.SIGTERM)
        report.check("2 the daemon drains and exits 0", daemon.wait(timeout=60) == 0)
    finally:
        if daemon.poll() is None:
            os.killpg(daemon.pid, signal.SIGKILL)
            daemon.wait()
        log.close()
    return out


def query_status(p: Project, sock: Path) -> dict[str, Any] | None:
    done = p.cli("scrinalia-runner", "status", "--socket", str(sock), "--json", timeout=30, check=False)
    if done.returncode != 0:
        return None
    try:
        return json.loads(done.stdout)[0]
    except (ValueError, IndexError):
        return None


def wait_status(p: Project, sock: Path, daemon: subprocess.Popen, timeout: float) -> dict[str, Any] | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and daemon.poll() is None:
        snap = query_status(p, sock)
        if snap:
            return snap
        time.sleep(0.5)
    return None


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--helper":
        HELPERS[sys.argv[2]](sys.argv[3:])
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundle", type=Path, default=ROOT / ".gpucheck")
    parser.add_argument("--out", type=Path, default=ROOT / "gpucheck.json")
    parser.add_argument("--docs", type=int, default=4000)
    parser.add_argument("--work", type=Path, default=None)
    parser.add_argument("--dry", action="store_true", help="step 0 and 1 only, with this interpreter (no GPU needed); "
                        "with GPU_CHECK_REHEARSAL=1, steps 2-4 too, on CPU (the GPU's checks then fail)")
    args = parser.parse_args()
    report = Report(args.out)
    work = args.work or Path(tempfile.mkdtemp(prefix="scrinalia-gpucheck-"))
    work.mkdir(parents=True, exist_ok=True)
    cluster = None
    try:
        t0 = time.monotonic()
        (work / "pg").mkdir(exist_ok=True)
        run(["tar", "-C", str(work / "pg"), "-xJf", str(args.bundle / "pg.tar.xz")])
        py = venv_python(work, args.bundle, args.dry)
        cluster = Cluster(work, work / "pg")
        url = cluster.start()
        create_database(py, url)
        p = Project(py, url, work)
        p.cli("scrinalia", "db", "upgrade")
        p.helper("seed", url, str(args.docs))
        model = str(work / "model")
        p.helper("model", str(args.bundle / "model"), model)
        report.figures["setup_seconds"] = round(time.monotonic() - t0, 1)
        report.check("0 the bundle unpacks, PostgreSQL starts, the schema migrates, the documents are seeded", True,
                     {"docs": args.docs, "postgres": str(cluster.bindir)})
        step_probe(p, report, args.dry)
        if not args.dry or REHEARSAL:
            report.figures.update(step_daemon(p, report, work, model, args.docs))
    except Exception as exc:  # a broken step is a failed check, with its reason
        report.check("the check ran to its end", False, f"{type(exc).__name__}: {exc}"[:3000])
    finally:
        if cluster is not None:
            cluster.stop()
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    return report.finish()


if __name__ == "__main__":
    sys.exit(main())
