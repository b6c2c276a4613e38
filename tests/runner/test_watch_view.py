"""``status --watch``'s view without a runner (issue 28 item 10): real control sockets in a shared folder,
one runner answering and the dead ``*.sock`` files stopped runners left behind; the view lists only the
live one, and a runner that stops answering while watched. Drawn at 100 columns, nothing wraps and no
figure is cut. (tests/runner/test_watch.py drives the whole command in tmux against a real daemon.)"""
from __future__ import annotations

import io
import json
import socket
import threading
import uuid
from pathlib import Path

from rich.console import Console

from runner import control
from runner.watch import ChildView, RateTracker, RunnerView, local_source, render


class StatusServer:
    """A control socket that answers ``status`` as a supervisor does (one JSON line in, one answer)."""

    def __init__(self, path: Path, name: str) -> None:
        self.path = path
        self.answer = {"name": name, "runner_id": str(uuid.uuid4()), "state": "online", "pid": 4242,
                       "hostname": "gpu-host", "uptime_seconds": 12.0, "concurrency": 2, "counters": {},
                       "database": {"state": "ok", "last_heartbeat_age_seconds": 0.4}, "children": []}
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(str(path))
        self.sock.listen(8)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with conn:
                conn.recv(1 << 16)
                conn.sendall(json.dumps(self.answer).encode())

    def stop(self) -> None:
        """As a killed runner: nobody listens any more, the file stays."""
        self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        self.thread.join(5)


def _dead_socket(path: Path) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.bind(str(path))  # closed without unlink: the file a stopped runner leaves


def test_watch_lists_only_live_sockets_of_the_folder(tmp_path: Path):
    folder = tmp_path / "sockets"
    folder.mkdir()
    for i in range(5):
        _dead_socket(folder / f"old-{i}.sock")
    live = StatusServer(folder / "live.sock", "dev-live")
    fetch = local_source(lambda: sorted(folder.glob("*.sock")), control.query, pinned=False)
    try:
        for _ in range(2):  # each redraw
            views = fetch()
            assert [v.name for v in views] == ["dev-live"], [(v.name, v.state) for v in views]
        late = StatusServer(folder / "late.sock", "dev-late")  # a runner started while watched appears
        assert sorted(v.name for v in fetch()) == ["dev-late", "dev-live"]
        late.stop()  # ... and stops answering: said, since it answered before
        by_name = {v.name: v for v in fetch()}
        assert by_name["dev-live"].error is None
        assert by_name[str(folder / "late.sock")].state == "not answering"
    finally:
        live.stop()
    # A socket the operator named is always shown, answering or not.
    (named,) = local_source([folder / "old-0.sock"], control.query)()
    assert named.state == "not answering"


def _screen(views: list[RunnerView], rates: RateTracker, width: int, console_width: int) -> list[str]:
    console = Console(width=console_width, record=True, file=io.StringIO(), color_system=None)
    console.print(render(views, rates, title="runner dev-gpu-host-01", clock="12:00:00", width=width))
    return console.export_text().splitlines()


def test_the_view_fits_100_columns_without_wrapping_or_cutting_a_figure():
    children = [ChildView(run_id=str(uuid.uuid4()), worker=worker, pid=123456, phase=phase, elapsed_s=3725.0,
                          done=112, total=200, unit="document", rss_bytes=1_234_567_890, gpu_bytes=9_876_543_210,
                          lease_s=28.5, cancel_requested=cancel)
                for worker, phase, cancel in (("embedding", "running", False), ("typology", "loading", True),
                                              ("quality-validator", "running", False))]
    view = RunnerView(name="dev-gpu-host-01.archives.example.org", runner_id=str(uuid.uuid4()),
                      state="online (draining: operator)", database="ok", heartbeat_age_s=1.25,
                      lease_margin_s=28.75, concurrency=4, children=children,
                      detail="pid 1234567 on gpu-host-01.archives.example.org · up 3h12m · claims=1234 "
                             "spawns=1230 finished=1228 lost=0 fenced=0 reconnects=3")
    rates = RateTracker()
    for c in children:
        rates.observe(c.run_id, 100, 0.0)
        rates.observe(c.run_id, 112, 10.0)
    for width in (100, 140, 80):
        screen = _screen([view], rates, width, width)
        assert len(screen) == len(_screen([view], rates, width, 1000)), "\n".join(screen)  # no line wrapped
        assert all(len(line) <= width for line in screen)
        if width < 100:  # an 80-column terminal: nothing wraps, but these figures cannot all fit
            continue
        header = next(line for line in screen if line.startswith("WORKER"))
        assert header.rstrip().endswith("LEASE"), header
        for c in children:
            row = next(line for line in screen if c.run_id[-12:] in line)
            assert row.rstrip().endswith("28s") and "1.2/s" in row and "1.1 GiB" in row and "9.2 GiB" in row, row
