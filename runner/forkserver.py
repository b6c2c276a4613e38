"""The fork server: a process that preloads torch, transformers and the catalogue, then forks children.

Why: a spawned interpreter takes seconds to import torch and transformers; a fork of a process that
already imported them is ready in milliseconds. Why a separate process and not the supervisor: the
supervisor must never import torch (CUDA must never be initialised in it, and its memory stays small),
and forking the supervisor would copy its database connections and sockets into every child.

CUDA is never initialised here either: importing torch does not create a CUDA context, and
``PYTORCH_NVML_BASED_CUDA_CHECK=1`` makes ``torch.cuda.is_available()`` (which transformers may call at
import) ask NVML instead of initialising the driver. A CUDA context cannot survive a fork; each child
creates its own. The fork server reports ``cuda_initialized`` at start, and the supervisor refuses a
fork server that did.

Protocol (one ``SOCK_SEQPACKET`` socketpair, pickled tuples, one message per packet):

    supervisor -> server   ("spawn", token)  + SCM_RIGHTS [channel_fd, output_fd]
                           ("warm", key, worker)  (load a model on the CPU for a worker, engines.warm)
    server -> supervisor   ("ready", info)   once, after preloading (and loading the warm models)
                           ("spawned", token, pid)
                           ("exited", ChildExit)  (the wait status decoded, the kernel's rusage)
                           ("warmed", info)  (the warm models now held, after a "warm")

Warm models (decision 0340): the models of the workers kept warm are loaded here, on the CPU, before
"ready"; every child forked after inherits them copy-on-write. A "warm" request (a child had to load a
model cold: its settings changed) loads the new one between two spawns and drops the copy that worker
used before; ``warm_limit`` bytes bound what is held (the oldest goes first).

The fork server reaps its children (SIGCHLD through a wakeup pipe) and reports each exit with the
kernel's resource usage. It dies with the supervisor (PR_SET_PDEATHSIG), and its children die with it.
"""
from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import pickle
import select
import signal
import socket
import subprocess
import sys
import time
from typing import Any

from runner import procinfo
from runner.launchers import ChildExit, LauncherNotReady
from runner.timings import FORK_SERVER_READY_TIMEOUT, SPAWN_WAIT_DEFAULT

log = logging.getLogger("scrinalia.runner.forkserver")

MAX_PACKET = 1 << 16


class ForkServerError(RuntimeError):
    pass


class ForkServerNotAnswering(ForkServerError, LauncherNotReady):
    """The fork server did not run the spawn (stopped, dead, restarting): no worker code ran for it."""


# --- the server (its own process: python -m runner.forkserver) -------------------------------------


def serve(link: socket.socket, parent_pid: int, preload: tuple[str, ...], title: str,
          warm_start: tuple[tuple[dict[str, str], tuple[str, ...]], ...] = (), warm_limit: int = 0,
          standby: bool = False) -> None:
    """Preload, load the warm models, say "ready", then fork a child per spawn request (and, with
    ``standby``, one ahead whenever asked) and report every exit, until the supervisor closes the link."""
    from runner import child as child_module

    child_module.set_pdeathsig(signal.SIGKILL)
    if os.getppid() != parent_pid:
        os._exit(child_module.EXIT_ORPHANED)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    ready, catalogue = _preload(preload)
    warm_models = WarmModels(warm_limit)
    for key, workers in warm_start:
        warm_models.load(key, workers)
    ready["warm"] = warm_models.info()
    torch = sys.modules.get("torch")  # again: loading a model must not have initialised CUDA either
    ready["cuda_initialized"] = bool(torch is not None and torch.cuda.is_initialized())
    procinfo.set_title(title)
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w, warn_on_full_buffer=False)
    signal.signal(signal.SIGCHLD, lambda *_: None)

    def send(*message: Any) -> None:
        link.send(pickle.dumps(message))

    send("ready", ready)
    server_pid, link_fd = os.getpid(), link.fileno()

    want_standby = standby  # decision 0341: one child forked ahead, again after each use or warm load
    while True:
        if want_standby:
            want_standby = False
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            pid = _fork()
            if pid == 0:  # the standby child (forked here too: its stack dumps keep their depth)
                try:
                    channel_fd, output_fd = _standby_wait(server_pid, (wake_r, wake_w), link, ours, theirs)
                    child_module.become_child(server_pid, output_fd)
                    child_module.child_main(socket.socket(fileno=channel_fd), catalogue=catalogue)
                finally:
                    os._exit(child_module.EXIT_INTERNAL)
            _offer_standby(link, pid, ours, theirs)
        try:
            readable, _, _ = select.select([link_fd, wake_r], [], [])
        except InterruptedError:
            continue
        if wake_r in readable:
            _drain(wake_r)
        _reap(send)  # on every wake-up: a SIGCHLD may coalesce several exits
        if link_fd not in readable:
            continue
        request = _next_request(link)
        if request is None:
            return  # the supervisor closed the link (or died): leave; PDEATHSIG takes the children
        if not request:
            continue
        if request[0] in ("warm", "standby"):
            if request[0] == "warm":
                warm_models.load(request[1], (request[2],), replace=True)
                send("warmed", warm_models.info())
            # After a warm load: one that holds the new model (the supervisor closes the older one).
            want_standby = standby
            continue
        token, channel_fd, output_fd = request
        pid = _fork()
        if pid == 0:  # the child (forked here, not in a helper: its stack dumps keep their depth)
            try:
                signal.set_wakeup_fd(-1)
                os.close(wake_r)
                os.close(wake_w)
                link.close()
                child_module.become_child(server_pid, output_fd)
                child_module.child_main(socket.socket(fileno=channel_fd), catalogue=catalogue)
            finally:
                os._exit(child_module.EXIT_INTERNAL)
        os.close(channel_fd)
        os.close(output_fd)
        send("spawned", token, pid)


def _fork() -> int:
    """``os.fork`` with the streams flushed (a child must not repeat buffered output) and the server's
    objects frozen (a child's collector never traverses, so never copies, the server's pages)."""
    sys.stdout.flush()
    sys.stderr.flush()
    gc.freeze()
    return os.fork()


def _standby_wait(server_pid: int, wake: tuple[int, int], link: socket.socket, ours: socket.socket,
                  theirs: socket.socket) -> tuple[int, int]:
    """In a standby child (decision 0341): drop the server's descriptors, rehearse a run's start, wait for
    the run's socket and output, handed over by the supervisor directly (the server is not on that path).
    Exits quietly when its end is closed (a newer standby replaced it, or the supervisor is gone)."""
    from runner import child as child_module

    signal.set_wakeup_fd(-1)
    for fd in wake:
        os.close(fd)
    link.close()
    ours.close()
    child_module.set_pdeathsig(signal.SIGKILL)
    if os.getppid() != server_pid:
        os._exit(child_module.EXIT_ORPHANED)
    procinfo.set_title("scrinalia-runner: standby child")
    child_module.rehearse()
    handed = _await_hand_over(theirs)
    if handed is None:
        os._exit(0)  # no run was ever ours
    return handed


def _offer_standby(link: socket.socket, pid: int, ours: socket.socket, theirs: socket.socket) -> None:
    """Hand the supervisor its end of the standby's socket (``("standby", pid)`` + SCM_RIGHTS)."""
    theirs.close()
    try:
        socket.send_fds(link, [pickle.dumps(("standby", pid))], [ours.fileno()])
    finally:
        ours.close()


def _preload(preload: tuple[str, ...]) -> tuple[dict[str, Any], dict | None]:
    """Import what the children share (``preload``, the catalogue, the SDK): the "ready" report and the
    catalogue (None when it cannot be loaded: the children load it and report the error on their runs)."""
    from runner import child as child_module

    started = time.monotonic()
    loaded = child_module.preload_modules(preload)
    catalogue: dict | None
    catalogue_error = None
    try:
        from scrinalia.domains.archive.workers.plugins import load_catalogue

        catalogue = load_catalogue()
    except Exception as exc:  # the children load it themselves and report the error on their runs
        catalogue, catalogue_error = None, f"{type(exc).__name__}: {exc}"
    # Modules a child needs anyway, imported once here.
    import psycopg  # noqa: F401
    import sqlalchemy.dialects.postgresql  # noqa: F401

    import scrinalia.db.engine
    import scrinalia.domains.archive.workers.sdk  # noqa: F401

    torch = sys.modules.get("torch")
    return {
        "pid": os.getpid(),
        "preloaded": loaded,
        "preload_seconds": round(time.monotonic() - started, 3),
        "cuda_initialized": bool(torch is not None and torch.cuda.is_initialized()),
        "catalogue": sorted(catalogue) if catalogue is not None else None,
        "catalogue_error": catalogue_error,
    }, catalogue


class WarmModels:
    """The fork server's warm models (engines.warm), bounded by ``limit`` bytes (0: none is kept)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.order: list[Any] = []  # WarmKey, oldest first
        self.errors: list[str] = []

    def load(self, key_json: dict[str, str], workers: tuple[str, ...], replace: bool = False) -> None:
        """Load one model for ``workers``; ``replace``: the model these workers used before is dropped
        unless another worker still uses it. A failure is reported (``errors``), never raised: the
        children then load cold, as before."""
        from scrinalia.domains.archive.workers.engines import warm

        try:
            key = warm.WarmKey.from_json(key_json)
            entry = warm.warm(key)
        except Exception as exc:  # a missing directory, a broken model: the children load cold
            self.errors = [*self.errors[-4:], f"{key_json.get('model_dir')}: {type(exc).__name__}"]
            log.warning("warm model %s not loaded: %s", key_json, exc)
            return
        if replace:
            for other in warm.held():
                if other.key != key:
                    other.workers.difference_update(workers)
                    if not other.workers:
                        self._forget(other.key)
        entry.workers.update(workers)
        if key in self.order:
            self.order.remove(key)
        self.order.append(key)
        self._bound()

    def _bound(self) -> None:
        from scrinalia.domains.archive.workers.engines import warm

        while self.order and sum(m.nbytes for m in warm.held()) > self.limit:
            oldest = self.order[0]
            log.warning("warm model %s dropped: over the limit of %d bytes", oldest.model_dir, self.limit)
            self.errors = [*self.errors[-4:], f"{oldest.model_dir}: over the warm limit ({self.limit} bytes)"]
            self._forget(oldest)

    def _forget(self, key: Any) -> None:
        from scrinalia.domains.archive.workers.engines import warm

        warm.drop(key)
        if key in self.order:
            self.order.remove(key)
        gc.unfreeze()  # a dropped model's cycles are in the frozen generation (frozen again at the next fork)
        gc.collect()

    def info(self) -> dict[str, Any]:
        from scrinalia.domains.archive.workers.engines import warm

        models = [m.describe() for m in warm.held()]
        return {"models": models, "bytes": sum(m["bytes"] for m in models), "limit_bytes": self.limit,
                "errors": list(self.errors)}


def _await_hand_over(sock: socket.socket) -> tuple[int, int] | None:
    """A standby child's wait: (channel_fd, output_fd) from the supervisor, or None when its end closed.
    A ("prepare", how the child reaches the database) on the way builds the run's engine ahead
    (``child.prepare_engine``; it connects nowhere)."""
    from runner import child as child_module

    while True:
        try:
            data, fds, _flags, _addr = socket.recv_fds(sock, MAX_PACKET, 2)
        except InterruptedError:
            continue
        except OSError:
            return None
        if data and data != b"go" and not fds:
            message = pickle.loads(data)
            if message[0] == "prepare":
                child_module.prepare_engine(message[1])
            continue
        if not data or len(fds) != 2:
            for fd in fds:
                os.close(fd)
            return None
        sock.close()
        return fds[0], fds[1]


def _drain(fd: int) -> None:
    try:
        while os.read(fd, 512):
            pass
    except BlockingIOError:
        pass


def _reap(send: Any) -> None:
    """Report every child that exited, with the kernel's wait status and resource usage."""
    while True:
        try:
            pid, status, rusage = os.wait4(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        send("exited", ChildExit.from_wait(pid, status, rusage))


def _next_request(link: socket.socket) -> tuple | None:
    """The next request: (token, channel_fd, output_fd) for a spawn, ("warm", key, worker) for a warm
    model; () for a malformed one (dropped); None when the link is closed."""
    try:
        data, fds, _flags, _addr = socket.recv_fds(link, MAX_PACKET, 4)
    except OSError:
        data, fds = b"", []
    if not data:
        return None
    message = pickle.loads(data)
    if message[0] == "warm" and len(message) == 3 and not fds:
        return tuple(message)
    if message == ("standby",) and not fds:
        return message
    kind, token = message
    if kind != "spawn" or len(fds) != 2:
        for fd in fds:
            os.close(fd)
        return ()
    return int(token), fds[0], fds[1]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m runner.forkserver")
    parser.add_argument("--link-fd", type=int, required=True)
    parser.add_argument("--parent-pid", type=int, required=True)
    parser.add_argument("--preload", default="")
    parser.add_argument("--title", default="scrinalia-runner: fork server")
    parser.add_argument("--warm", default="[]", help="JSON: [[key, [worker, ...]], ...] (engines.warm)")
    parser.add_argument("--warm-limit", type=int, default=0)
    parser.add_argument("--standby", action="store_true", help="keep a child forked ahead (decision 0341)")
    args = parser.parse_args(argv)
    link = socket.socket(fileno=args.link_fd)
    preload = tuple(p for p in args.preload.split(",") if p)
    warm_start = tuple((dict(key), tuple(workers)) for key, workers in json.loads(args.warm))
    serve(link, args.parent_pid, preload, args.title, warm_start, args.warm_limit, args.standby)


# --- the supervisor's side -------------------------------------------------------------------------


class ForkServerLauncher:
    """Starts and talks to the fork server; children are the fork server's, reported back as exits."""

    name = "forkserver"
    child_preload: tuple[str, ...] = ()  # the fork server preloaded already

    def __init__(self, preload: tuple[str, ...], *, title: str = "scrinalia-runner: fork server",
                 env: dict[str, str] | None = None, ready_timeout: float = FORK_SERVER_READY_TIMEOUT,
                 warm: tuple[tuple[dict[str, str], tuple[str, ...]], ...] = (), warm_limit: int = 0,
                 standby: bool = False) -> None:
        self.preload = preload
        self.standby = standby  # keep a child forked ahead (decision 0341)
        self._standby: tuple[int, socket.socket] | None = None  # its pid, our end of its hand-over
        self.standby_used = 0
        self._standby_asked = False  # a ("standby",) request is on its way
        # How a child reaches the database (database_url, connect_args, server_facts): sent to each standby
        # as it arrives, so it builds its engine ahead (``child.prepare_engine``). Set by the supervisor.
        self.prepare: dict[str, Any] | None = None
        self.warm_start = warm  # the models kept warm: (engines.warm key, the workers that use it)
        self.warm_limit = warm_limit
        self.warm_info: dict[str, Any] = {}
        self._warm_asked: set[tuple[str, str, str, str]] = set()  # (worker, *key) asked since the last start
        self.title = title
        self.env = env
        self.ready_timeout = ready_timeout
        self.proc: subprocess.Popen | None = None
        self.link: socket.socket | None = None
        self.ready_info: dict[str, Any] = {}
        self._exits: list[ChildExit] = []
        self._token = 0
        self._dead = False
        self._unanswered: set[int] = set()  # spawn tokens that timed out (see ``stalled``)
        self._ready_by: float | None = None  # a background start's deadline (see ``start``)
        self._start_error: str | None = None

    def start(self, wait: bool = True) -> None:
        """Start the fork server. ``wait``: until it is ready (at the supervisor's start). Without: return
        at once (a restart from the loop: preloading torch takes seconds, the loop must go on); it is
        ``starting`` (``stalled``: nothing is claimed) until its "ready" arrives through
        ``collect_exits``. A background start that fails (it dies, times out or initialised CUDA) makes
        the next ``start`` raise, so a fork server that cannot start is not restarted forever."""
        if self._start_error is not None:
            raise ForkServerError(self._start_error)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        env = dict(os.environ if self.env is None else self.env)
        env["PYTORCH_NVML_BASED_CUDA_CHECK"] = "1"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "runner.forkserver", "--link-fd", str(theirs.fileno()),
             "--parent-pid", str(os.getpid()), "--preload", ",".join(self.preload), "--title", self.title,
             "--warm", json.dumps([[key, list(workers)] for key, workers in self.warm_start]),
             "--warm-limit", str(self.warm_limit), *(["--standby"] if self.standby else [])],
            stdin=subprocess.DEVNULL,
            pass_fds=(theirs.fileno(),),
            close_fds=True,
            start_new_session=True,
            env=env,
        )
        theirs.close()
        self._drop_standby()
        self._standby_asked = self.standby  # the server forks its first one after "ready"
        self.link = ours
        self._dead = False
        self._unanswered = set()
        if not wait:
            self.link.setblocking(False)
            self._ready_by = time.monotonic() + self.ready_timeout
            return
        message = self._recv(self.ready_timeout)
        if message is None or message[0] != "ready":
            self.close()
            raise ForkServerError(f"the fork server did not start (got {message!r})")
        self._ready(message[1])
        self.link.setblocking(False)

    def _ready(self, info: dict[str, Any]) -> None:
        self.ready_info = info
        self.warm_info = info.get("warm") or {}
        self._warm_asked = set()
        if info.get("cuda_initialized"):
            self.close()
            raise ForkServerError("the fork server initialised CUDA while preloading; refusing to fork from it")
        self._ready_by = None

    @property
    def starting(self) -> bool:
        """Started in the background and not ready yet."""
        return self._ready_by is not None

    def _recv(self, timeout: float | None) -> tuple | None:
        assert self.link is not None
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            readable, _, _ = select.select([self.link], [], [], remaining)
            if not readable:
                return None
            message = self._read_message()
            if message is not None or self._dead:
                return message

    def _read_message(self) -> tuple | None:
        """One message from the link, or None: nothing there yet, or the server is gone (``_dead``)."""
        assert self.link is not None
        try:
            data, fds, _flags, _addr = socket.recv_fds(self.link, MAX_PACKET, 1)
        except BlockingIOError:
            return None
        except OSError:
            data, fds = b"", []
        if not data:
            for fd in fds:
                os.close(fd)
            self._dead = True
            return None
        message = pickle.loads(data)
        if message[0] == "standby" and len(fds) == 1:
            return (*message, socket.socket(fileno=fds[0]))
        for fd in fds:
            os.close(fd)
        return message

    def _handle(self, message: tuple) -> None:
        if message[0] == "ready" and self._ready_by is not None:
            try:
                self._ready(message[1])
            except ForkServerError as exc:
                self._start_error = str(exc)
            else:
                log.warning("fork server pid %s ready again (preloaded in %ss)", self.pid,
                            message[1].get("preload_seconds"))
        elif message[0] == "standby" and len(message) == 3:
            self._drop_standby()  # an older one (forked before a warm load) leaves when its end closes
            self._standby = (int(message[1]), message[2])
            self._standby_asked = False
            self._send_prepare()
        elif message[0] == "exited":
            if self._standby is not None and message[1].pid == self._standby[0]:
                self._drop_standby()  # it died waiting (killed): the next spawn is a plain one
            self._exits.append(message[1])
        elif message[0] == "warmed":
            self.warm_info = message[1]
            log.info("fork server: %d warm model(s), %d bytes", len(self.warm_info.get("models") or []),
                     self.warm_info.get("bytes") or 0)
        elif message[0] == "spawned" and message[1] in self._unanswered:
            # The late answer of a spawn that timed out: that child got no assignment and is leaving.
            self._unanswered.discard(message[1])
            log.warning("the fork server answered again (child %s of an abandoned spawn request exits)", message[2])

    def spawn(self, channel_fd: int, output_fd: int, timeout: float | None = None) -> int:
        """Ask for a child and wait for its pid, at most ``timeout`` seconds (default 30).

        A fork server that does not answer in time (SIGSTOPped, swapped out) is *stalled*: the spawn
        fails (the caller closes its ends of the child's socket and pipe, so a child forked later for
        this request finds no assignment and exits at once), ``stalled`` stays true and nothing more is
        asked of it until its late answer arrives. The loop is never held longer than ``timeout``."""
        if self.link is None or self._dead:
            raise ForkServerNotAnswering("the fork server is not running")
        pid = self._hand_over(channel_fd, output_fd)
        if pid is not None:
            return pid
        if self._unanswered:
            raise ForkServerNotAnswering("the fork server has not answered an earlier spawn request (stalled)")
        self._token += 1
        token = self._token
        wait = SPAWN_WAIT_DEFAULT if timeout is None else max(0.0, timeout)
        deadline = time.monotonic() + wait
        try:
            # Non-blocking: a stopped server's full socket buffer must not hold the loop either.
            socket.send_fds(self.link, [pickle.dumps(("spawn", token))], [channel_fd, output_fd])
        except BlockingIOError:
            raise ForkServerNotAnswering("the fork server does not take spawn requests (its socket is full)") from None
        return self._await_spawned(token, deadline, wait)

    def _await_spawned(self, token: int, deadline: float, wait: float) -> int:
        """The pid the fork server answers for ``token``; other messages are handled on the way."""
        while True:
            message = self._recv(max(0.0, deadline - time.monotonic()))
            if message is None:
                if self._dead:
                    raise ForkServerNotAnswering("the fork server died during a spawn request")
                self._unanswered.add(token)
                raise ForkServerNotAnswering(f"the fork server did not answer a spawn request within {wait:.3g} s")
            if message[0] == "spawned" and message[1] == token:
                self._ask_standby()
                return int(message[2])
            self._handle(message)

    def _hand_over(self, channel_fd: int, output_fd: int) -> int | None:
        """The standby child takes the run (its pid), or None: none is waiting, or it is gone. The fork
        server is not on this path (a stopped or busy one still starts this run); it is asked for the
        next standby afterwards, without waiting."""
        if self._standby is None:
            return None
        self._pump()  # a standby that died waiting is reported there, not handed a run
        if self._standby is None:
            return None
        pid, hand = self._standby
        self._standby = None
        try:
            socket.send_fds(hand, [b"go"], [channel_fd, output_fd])
        except OSError:
            return None
        finally:
            hand.close()
        self.standby_used += 1
        self._ask_standby()
        return pid

    def _ask_standby(self) -> None:
        """Ask for the next standby once: after a hand-over, and after a plain spawn that found none (so a
        standby that dies at once is asked again at the pace of the spawns, never in a loop)."""
        if not self.standby or self._standby is not None or self._standby_asked or self.link is None:
            return
        try:
            self.link.send(pickle.dumps(("standby",)))
        except OSError:
            return  # a full buffer (a stopped server): asked again after the next plain spawn
        self._standby_asked = True

    def set_prepare(self, prepare: dict[str, Any]) -> None:
        """How children reach the database; the waiting standby (and each later one) builds its engine."""
        if prepare == self.prepare:
            return
        self.prepare = prepare
        self._send_prepare()

    def _send_prepare(self) -> None:
        if self._standby is None or self.prepare is None:
            return
        try:
            self._standby[1].send(pickle.dumps(("prepare", self.prepare)))
        except OSError:
            pass  # it is gone: its exit report drops it

    def _drop_standby(self) -> None:
        if self._standby is not None:
            self._standby[1].close()
            self._standby = None

    def warm(self, key: dict[str, str], worker: str) -> bool:
        """Ask the fork server to keep ``key`` warm for ``worker`` (a child of it loaded ``key`` cold: its
        settings changed). Never waits: the answer ("warmed") is read with the exits. Only when warm
        models are on (``warm_limit``), once per worker and key until the next start."""
        asked = (worker, key["model_class"], key["model_dir"], key["dtype"])
        if self.warm_limit <= 0 or asked in self._warm_asked or self.link is None or self._dead:
            return False
        try:
            self.link.send(pickle.dumps(("warm", dict(key), worker)))
        except OSError:
            return False
        self._warm_asked.add(asked)
        return True

    @property
    def stalled(self) -> bool:
        """A spawn request is still unanswered, or the fork server is still starting: claim nothing that
        would need it."""
        return bool(self._unanswered) or self._ready_by is not None

    def wait_fds(self) -> list[int]:
        return [self.link.fileno()] if self.link is not None and not self._dead else []

    def _pump(self) -> None:
        """Handle every message already there (exits are kept for ``collect_exits``)."""
        while self.link is not None and not self._dead:
            message = self._read_message()
            if message is None:
                break
            self._handle(message)

    def collect_exits(self) -> list[ChildExit]:
        self._pump()
        if self._ready_by is not None:
            self._check_start()
        exits, self._exits = self._exits, []
        return exits

    def _check_start(self) -> None:
        """A background start that dies or is not ready in time fails (``start`` raises next time)."""
        assert self._ready_by is not None
        if not self._dead and time.monotonic() > self._ready_by:
            self._start_error = f"the fork server was not ready within {self.ready_timeout:g} s"
            if self.proc is not None:
                self.proc.kill()
            self._dead = True
        if self._dead and self._start_error is None:
            self._start_error = "the fork server died while preloading"

    def healthy(self) -> bool:
        return self.link is not None and not self._dead and self.proc is not None and self.proc.poll() is None

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def info(self) -> dict:
        return {
            "start_method": "forkserver",
            "pid": self.pid,
            "preload": list(self.preload),
            "preloaded": self.ready_info.get("preloaded", []),
            "preload_seconds": self.ready_info.get("preload_seconds"),
            "warm": self.warm_info,
            "cuda_initialized": self.ready_info.get("cuda_initialized"),
            "standby": {"on": self.standby, "pid": self._standby[0] if self._standby else None,
                        "used": self.standby_used},
            "healthy": self.healthy(),
            "stalled": self.stalled,
            "starting": self.starting,
        }

    def close(self) -> None:
        self._drop_standby()
        if self.link is not None:
            self.link.close()
            self.link = None
        if self.proc is not None:
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            self.proc = None
        self._dead = True


if __name__ == "__main__":
    main()
