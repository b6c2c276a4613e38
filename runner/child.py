"""The child: one process per claimed run, the same entry point for the daemon and the one-shot CLI.

It is started either by the fork server (forked from a preloaded interpreter) or by plain spawn
(``python -m runner.child``). Either way it:

1. becomes a session leader (the supervisor stops it and whatever it started with one ``killpg``; a
   terminal's Ctrl-C never reaches it), and dies with its parent: ``PR_SET_PDEATHSIG`` plus a thread
   that watches the parent's socket and kills the child's own process group on EOF;
2. receives its assignment over that socket: the claimed ``WorkerRun``, its configuration as the
   supervisor resolved it (and already wrote with the fenced ``record_start``), how to reach the database;
3. runs the worker through ``RunContext``, reporting progress (throttled) and showing it in its process
   title (``scrinalia-runner: run 9f3c2a7d4e1b embedding batch 7/30``, the short id of run_ids.short_id);
4. sends its result (status, summary, error, metrics) and exits. It never writes the run's row: the
   parent writes the terminal status, fenced. A crash sends nothing; the parent reads the exit status.
"""
from __future__ import annotations

import argparse
import ctypes
import dataclasses
import faulthandler
import importlib
import math
import os
import resource
import signal
import socket
import sys
import threading
import time
import traceback
from typing import Any, NoReturn

from runner import procinfo, wire
from runner.outcome import fit_error, format_error
from scrinalia.domains.archive.run_ids import short_id

PR_SET_PDEATHSIG = 1
EXIT_ORPHANED = 76   # the parent was already gone at start, or went away
EXIT_INTERNAL = 70   # the child's own machinery failed
PROGRESS_INTERVAL = 0.1
CHILD_OOM_SCORE_ADJ = 500


# --- process set-up --------------------------------------------------------------------------------


def set_pdeathsig(sig: int = signal.SIGKILL) -> bool:
    """Ask the kernel to send ``sig`` to this process when its parent dies (Linux ``prctl``)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def become_child(expected_parent: int, output_fd: int | None) -> None:
    """Make this freshly started process a supervised child (see the module docstring, step 1)."""
    if output_fd is not None:
        os.dup2(output_fd, 1)
        os.dup2(output_fd, 2)
        if output_fd > 2:
            os.close(output_fd)
    try:
        os.setsid()
    except OSError:
        pass  # already a session leader (spawned with start_new_session)
    set_pdeathsig(signal.SIGKILL)
    if os.getppid() != expected_parent:
        os._exit(EXIT_ORPHANED)  # the parent died before the death signal was armed
    try:
        signal.set_wakeup_fd(-1)
    except ValueError:
        pass
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD, signal.SIGHUP, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_DFL)
    faulthandler.enable(all_threads=True)  # a segfault leaves a Python stack in the stderr tail
    # A stalled child (runner.stall) is asked for its stack first: every thread's, written by a C signal
    # handler, so even a child stuck in one C call that holds the GIL answers.
    faulthandler.register(signal.SIGUSR1, all_threads=True, chain=False)
    try:
        # Under memory pressure the kernel should pick a child, never the supervisor (raising one's own
        # oom_score_adj needs no privilege).
        with open("/proc/self/oom_score_adj", "w") as fh:
            fh.write(str(CHILD_OOM_SCORE_ADJ))
    except OSError:
        pass


def preload_modules(names: tuple[str, ...] | list[str]) -> list[str]:
    """Import what is installed of ``names``; never initialise CUDA (NVML-based availability checks)."""
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    loaded = []
    for name in names:
        try:
            importlib.import_module(name)
            loaded.append(name)
        except ImportError:
            continue
    return loaded


def rehearse() -> None:
    """What a standby child does while it waits (decision 0341): the steps of a run's start that need no
    assignment, once, on throwaway objects. After a fork every page a process writes is copied on first
    write (its objects' reference counts included); the first engine of a child paid ~900 of those
    copies (~12 ms on the project's VM, 0.9 ms once rehearsed). Nothing here connects anywhere."""
    import pickle

    from scrinalia.db.engine import ServerFacts, create_engine_from_url

    facts = ServerFacts(server_version_info=(16, 0), default_schema_name="public",
                        default_isolation_level="READ COMMITTED", backslash_escapes=False)
    engine = create_engine_from_url("postgresql+psycopg://rehearsal@rehearsal.invalid/rehearsal",
                                    application_name="scrinalia-runner-child", pool_size=2, max_overflow=4,
                                    server_facts=ServerFacts.from_json(facts.to_json()))
    engine.dispose()
    pickle.loads(pickle.dumps({"run": None, "config": None, "env": {}, "preload": []}))
    thread = threading.Thread(target=lambda: None, name="rehearsal", daemon=True)
    thread.start()
    thread.join()


# A standby child's engine, built before its run arrived (``prepare_engine``): (the parameters, the engine).
_PREPARED: tuple[dict[str, Any], Any] | None = None
ENGINE_FIELDS = ("database_url", "connect_args", "server_facts")


def prepare_engine(how: dict[str, Any]) -> None:
    """Build, ahead, the engine an assignment with these ``ENGINE_FIELDS`` would (it connects on its
    first statement only): the run's start then skips it (decision 0341)."""
    global _PREPARED
    if _PREPARED is not None:
        _PREPARED[1].dispose()
    _PREPARED = (dict(how), _engine(how))


def _prepared_engine(assign: dict[str, Any]) -> Any | None:
    """The prepared engine if the assignment reaches the database the same way, else None."""
    if _PREPARED is None:
        return None
    how, engine = _PREPARED
    return engine if all(how.get(k) == assign.get(k) for k in ENGINE_FIELDS) else None


# --- the link to the parent (the SDK's ChildChannel) ------------------------------------------------


class ParentLink:
    """The child's end of the parent's socket: progress out, cancellation in, the parent watch."""

    def __init__(self, sock: socket.socket, run: Any) -> None:
        self.sock = sock
        self.short_id = short_id(run.run_id)
        self.worker = run.worker_name
        self.batch_size: int | None = None
        self.progress: dict[str, Any] | None = None
        self._send_lock = threading.Lock()
        self._cancel = threading.Event()
        self._last_sent = 0.0

    def send(self, kind: str, payload: dict[str, Any] | None = None) -> None:
        with self._send_lock:
            wire.send(self.sock, kind, payload)

    # ChildChannel
    def cancel_requested(self) -> bool:
        return self._cancel.is_set()

    def send_progress(self, progress: Any) -> None:
        self.progress = dict(progress)
        now = time.monotonic()
        done, total = self.progress.get("done"), self.progress.get("total")
        if now - self._last_sent >= PROGRESS_INTERVAL or (total is not None and done == total):
            self._last_sent = now
            self.send("progress", self.progress)
            self.retitle()

    def retitle(self, phase: str | None = None) -> None:
        procinfo.set_title(f"scrinalia-runner: run {self.short_id} {self.worker} {phase or self._progress_text()}")

    def _progress_text(self) -> str:
        p = self.progress or {}
        done, total = p.get("done"), p.get("total")
        if not isinstance(done, int):
            return "running"
        size = self.batch_size
        if size and size > 0:
            batch = math.ceil(done / size)
            of = f"/{math.ceil(total / size)}" if isinstance(total, int) else ""
            return f"batch {batch}{of}"
        return f"{done}{'/' + str(total) if isinstance(total, int) else ''} {p.get('unit') or 'units'}"

    def watch_parent(self) -> None:
        threading.Thread(target=self._watch, name="parent-watch", daemon=True).start()

    def _watch(self) -> None:
        while True:
            try:
                kind, _ = wire.recv(self.sock)
            except (EOFError, OSError, ValueError):
                self._parent_gone()
                return
            if kind == "cancel":
                self._cancel.set()

    @staticmethod
    def _parent_gone() -> NoReturn:
        # The supervisor is gone: nobody holds this run's lease any more. Stop everything we started.
        try:
            os.killpg(0, signal.SIGKILL)
        finally:
            os._exit(EXIT_ORPHANED)


# --- errors --------------------------------------------------------------------------------------


def _metrics(started: float | None, done: int) -> dict[str, Any]:
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    metrics: dict[str, Any] = {
        "peak_rss_bytes": max(own.ru_maxrss, kids.ru_maxrss) * 1024,
        "cpu_seconds": round(own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime, 3),
        "units_done": done,
    }
    if started is not None:
        elapsed = time.monotonic() - started
        metrics["worker_seconds"] = round(elapsed, 3)
        metrics["units_per_second"] = round(done / elapsed, 3) if elapsed > 0 and done else None
    warm = sys.modules.get("scrinalia.domains.archive.workers.engines.warm")
    if warm is not None and warm.LOADS:
        # Each model the engine loaded, warm (inherited from the fork server) or cold (from disk); the
        # supervisor asks the fork server to warm a cold one and keeps only warm/seconds in the row.
        metrics["model_loads"] = list(warm.LOADS)
    torch = sys.modules.get("torch")
    try:
        if torch is not None and torch.cuda.is_initialized():
            metrics["gpu_peak_allocated_bytes"] = int(torch.cuda.max_memory_allocated())
    except Exception:
        pass
    return metrics


def _json_safe(value: Any) -> Any:
    """What the ledger will store (JSON), so an odd object in a worker's summary cannot break the pipe."""
    import json

    return None if value is None else json.loads(json.dumps(value, default=str))


# --- the entry point -----------------------------------------------------------------------------


def child_main(channel: socket.socket, *, catalogue: dict | None = None) -> NoReturn:
    """Run one assignment received on ``channel`` and exit. Never returns."""
    code = EXIT_INTERNAL
    try:
        code = _serve(channel, catalogue)
    except BaseException:  # the machinery itself failed: leave the trace in the stderr tail
        traceback.print_exc()
        code = EXIT_INTERNAL
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code)


@dataclasses.dataclass(slots=True)
class Ending:
    """How the worker ended, as the child reports it (``("result", ...)``)."""

    status: str | None = "SUCCESS"  # SUCCESS | FAILED | CANCELLED; None with lease_lost
    result: dict[str, Any] | None = None
    error: str | None = None
    reason: str | None = None       # "configuration": never retried
    lease_lost: bool = False        # RunContext.commit found the lease gone: not a status, nothing is written


def _serve(channel: socket.socket, catalogue: dict | None) -> int:
    try:
        kind, assign = wire.recv(channel)
    except EOFError:
        return EXIT_ORPHANED
    if kind != "assign":
        raise RuntimeError(f"expected an assignment, got {kind!r}")
    run = assign["run"]
    # The child's device (CUDA_VISIBLE_DEVICES), before anything here can initialise CUDA: the fork
    # server imported torch without initialising it, and CUDA reads the variable at its first use.
    os.environ.update(assign.get("env") or {})
    link = ParentLink(channel, run)
    link.retitle("starting")
    if catalogue is None:
        preload_modules(assign.get("preload") or ())
        from scrinalia.domains.archive.workers.plugins import load_catalogue

        catalogue = load_catalogue()
    spec = catalogue.get(run.worker_name)
    if spec is None:
        # The supervisor's catalogue has it, this child's does not (a fork server whose catalogue did
        # not load): a retry would fail the same way (exit_reason "configuration", never retried).
        error = fit_error(f"UnknownWorker: no worker named {run.worker_name!r} in this child's catalogue")
        _report(link, Ending(status="FAILED", error=error, reason="configuration"), None, 0)
        return 1

    from scrinalia.domains.archive.workers.sdk import RunContext

    prepared = _prepared_engine(assign)
    engine = prepared or _engine(assign)
    resolved = assign["config"]  # the supervisor's resolution, already in the row (record_start)
    link.batch_size = resolved.db_batch_size
    link.watch_parent()
    ctx = RunContext(run, resolved, engine, link, spec=spec)
    started = None
    if link.cancel_requested():
        ending = Ending(status="CANCELLED", result={"done": 0, "cancelled": "before the worker started"})
    else:
        link.retitle("running")
        started = time.monotonic()
        # The worker's own stall timeout, if it declares one (runner.stall); None: the runner's.
        link.send("started", {"t": started, "stall_timeout": getattr(spec, "stall_timeout", None)})
        ending = _run_worker(spec, ctx)
    _report(link, ending, started, ctx.done, engine_ahead=prepared is not None)
    engine.dispose()
    return 0 if ending.status in ("SUCCESS", "CANCELLED") else 1


def _engine(assign: dict[str, Any]) -> Any:
    """The child's engine. It connects on the first statement only (a worker that never reads the
    database opens no session), and its first connection asks the server nothing: the supervisor passed
    what the dialect would ask (ServerFacts, decision 0073)."""
    from scrinalia.db.engine import ServerFacts, create_engine_from_url

    facts = assign.get("server_facts")
    return create_engine_from_url(
        assign["database_url"],
        application_name="scrinalia-runner-child",
        pool_size=2,
        max_overflow=4,
        connect_args=assign.get("connect_args") or {},
        server_facts=ServerFacts.from_json(facts) if facts else None,
    )


def _run_worker(spec: Any, ctx: Any) -> Ending:
    from scrinalia.domains.archive.errors import InvalidRunRequest
    from scrinalia.domains.archive.workers.sdk import LeaseLost, RunCancelled

    try:
        out = spec.run(ctx)
        return Ending(result=dict(out) if out is not None else dict(ctx.result))
    except RunCancelled as exc:
        return Ending(status="CANCELLED",
                      result={**ctx.result, "done": ctx.done, "cancelled": str(exc) or "at a batch boundary"})
    except LeaseLost as exc:
        # Not a status: the row may not be ours any more. The supervisor writes nothing for it; its next
        # heartbeat says whether the row is still held.
        return Ending(status=None, error=format_error(exc), lease_lost=True)
    except BaseException as exc:  # a database error, KeyboardInterrupt, SystemExit too: the run failed
        # An InvalidRunRequest (e.g. EngineUnavailable: no model where the options say) is configuration.
        return Ending(status="FAILED", error=format_error(exc), result=dict(ctx.result) or None,
                      reason="configuration" if isinstance(exc, InvalidRunRequest) else None)


def _report(link: ParentLink, ending: Ending, started: float | None, done: int, engine_ahead: bool = False) -> None:
    link.send("result", {
        "status": ending.status,
        "result": _json_safe(ending.result),
        "error": ending.error,
        "reason": ending.reason,
        "lease_lost": ending.lease_lost,
        "progress": link.progress,
        "metrics": {**_metrics(started, done), **({"engine_ahead": True} if engine_ahead else {})},
    })


def main(argv: list[str] | None = None) -> NoReturn:
    """``python -m runner.child --channel-fd N --parent-pid P`` (the plain-spawn path)."""
    parser = argparse.ArgumentParser(prog="python -m runner.child")
    parser.add_argument("--channel-fd", type=int, required=True)
    parser.add_argument("--parent-pid", type=int, required=True)
    args = parser.parse_args(argv)
    become_child(args.parent_pid, None)
    child_main(socket.socket(fileno=args.channel_fd))


if __name__ == "__main__":
    main()
