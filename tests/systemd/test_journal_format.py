"""The journal as an operator reads it (scrinalia.journal): each line at its priority, a run's lines
carrying RUN_ID, WORKER and RUNNER_ID, and plain lines wherever stderr is not the unit's journal stream.
Sent over a real Unix datagram socket, read back and decoded as journald decodes the native protocol."""
from __future__ import annotations

import io
import logging
import logging.config
import os
import socket
import struct
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest

from scrinalia import journal


def decode_native(datagram: bytes) -> dict[str, str]:
    """journald's reading of a native datagram (``NAME=value`` lines, or ``NAME``, a length, the bytes)."""
    fields: dict[str, str] = {}
    rest = datagram
    while rest:
        line, _, after = rest.partition(b"\n")
        if b"=" in line:
            name, _, value = line.partition(b"=")
            fields[name.decode()] = value.decode()
            rest = after
        else:
            (size,) = struct.unpack("<Q", after[:8])
            fields[line.decode()] = after[8:8 + size].decode()
            assert after[8 + size:9 + size] == b"\n"
            rest = after[9 + size:]
    return fields


@pytest.fixture
def journald(tmp_path: Path) -> Iterator[tuple[socket.socket, str]]:
    """A datagram socket standing where journald's would: what the handler sends arrives here."""
    path = str(tmp_path / "journal.socket")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(path)
    sock.settimeout(5)
    yield sock, path
    sock.close()


def _logger(handler: logging.Handler) -> logging.Logger:
    logger = logging.getLogger(f"scrinalia.test.{uuid.uuid4().hex}")
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    logger.addHandler(handler)
    return logger


@pytest.mark.parametrize(("level", "priority"), [(logging.CRITICAL, 2), (logging.ERROR, 3), (logging.WARNING, 4),
                                                 (logging.INFO, 6), (logging.DEBUG, 7)])
def test_each_level_has_its_syslog_priority(level: int, priority: int) -> None:
    assert journal.syslog_priority(level) == priority


def test_a_run_line_carries_its_fields_and_priority(journald: tuple[socket.socket, str],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    sock, path = journald
    monkeypatch.setattr(journal, "_process_fields", {})
    run = SimpleNamespace(run_id=uuid.uuid4(), worker_name="embed-texts")
    journal.set_process_fields(runner_id="runner-7")
    logger = _logger(journal.JournalHandler("scrinalia-runner", address=path))
    logger.error("run %s (%s): could not start a child", run.run_id, run.worker_name, extra=journal.run_fields(run))
    fields = decode_native(sock.recv(65536))
    assert fields["PRIORITY"] == "3"
    assert fields["RUN_ID"] == str(run.run_id)
    assert fields["WORKER"] == "embed-texts"
    assert fields["RUNNER_ID"] == "runner-7"
    assert fields["SYSLOG_IDENTIFIER"] == "scrinalia-runner"
    assert fields["MESSAGE"].endswith(f"run {run.run_id} (embed-texts): could not start a child")

    logger.warning("draining")  # a line about no run: no RUN_ID, still the runner's
    fields = decode_native(sock.recv(65536))
    assert fields["PRIORITY"] == "4" and "RUN_ID" not in fields and fields["RUNNER_ID"] == "runner-7"


def test_a_multiline_message_is_one_entry(journald: tuple[socket.socket, str]) -> None:
    sock, path = journald
    logger = _logger(journal.JournalHandler("scrinalia-runner", address=path))
    try:
        raise ValueError("boom")
    except ValueError:
        logger.exception("the loop failed")
    fields = decode_native(sock.recv(65536))
    assert fields["PRIORITY"] == "3"
    assert "the loop failed\nTraceback" in fields["MESSAGE"] and "ValueError: boom" in fields["MESSAGE"]


def test_without_the_socket_lines_keep_their_priority_on_the_stream(tmp_path: Path) -> None:
    stream = io.StringIO()
    handler = journal.JournalHandler("scrinalia-runner", address=str(tmp_path / "absent"), fallback=stream)
    logger = _logger(handler)
    logger.warning("one\ntwo")
    logger.info("three")
    assert stream.getvalue().splitlines() == [f"<4>WARNING {logger.name}: one", "<4>two",
                                              f"<6>INFO {logger.name}: three"]


def test_journal_stream_must_be_this_stderr(tmp_path: Path) -> None:
    with open(tmp_path / "stderr", "w") as err, open(tmp_path / "other", "w") as other:
        st = os.fstat(err.fileno())
        mine = {"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"}
        assert journal.under_journal(mine, err)
        assert not journal.under_journal(mine, other)  # stderr redirected elsewhere by a caller
        assert not journal.under_journal({}, err)
        assert not journal.under_journal({"JOURNAL_STREAM": "garbage"}, err)


def _log_from_a_process(tmp_path: Path, journal_stream: bool) -> str:
    """A fresh process that sets up logging as the runner does, its stderr a file; with ``journal_stream``
    its environment names that file as systemd would (no journald here: the stream fallback answers)."""
    err_path = tmp_path / f"stderr-{journal_stream}"
    code = ("import logging; from scrinalia.journal import setup_logging; "
            "setup_logging('INFO', 'scrinalia-runner'); logging.getLogger('scrinalia.runner').error('database down')")
    with open(err_path, "w") as err:
        env = {k: v for k, v in os.environ.items() if k != "JOURNAL_STREAM"}
        if journal_stream:
            st = os.fstat(err.fileno())
            env["JOURNAL_STREAM"] = f"{st.st_dev}:{st.st_ino}"
        subprocess.run([sys.executable, "-c", code], stderr=err, env=env, check=True, timeout=60)
    return err_path.read_text()


def test_plain_lines_elsewhere_and_priorities_under_systemd(tmp_path: Path) -> None:
    plain = _log_from_a_process(tmp_path, journal_stream=False)
    assert " ERROR scrinalia.runner[" in plain and not plain.startswith("<")
    under_systemd = _log_from_a_process(tmp_path, journal_stream=True)
    if os.path.exists(journal.JOURNAL_SOCKET):  # a host with journald: the entry went to it natively
        assert under_systemd == ""
    else:
        assert under_systemd == "<3>ERROR scrinalia.runner: database down\n"


def test_the_api_logs_to_the_journal_only_under_systemd(tmp_path: Path) -> None:
    """uvicorn's log_config: none elsewhere (its own plain lines); under systemd a JournalHandler on its
    loggers and the root, which dictConfig builds as uvicorn does in each worker."""
    assert journal.uvicorn_log_config("info", environ={}) is None
    with open(tmp_path / "stderr", "w") as err:
        st = os.fstat(err.fileno())
        config = journal.uvicorn_log_config("info", environ={"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"})
        assert config is None  # our stderr is not that file: the check reads this process's stderr
    st = os.fstat(sys.stderr.fileno())
    config = journal.uvicorn_log_config("warning", environ={"JOURNAL_STREAM": f"{st.st_dev}:{st.st_ino}"})
    assert config is not None
    handler = logging.config.DictConfigurator(config).configure_handler(dict(config["handlers"]["journal"]))
    assert isinstance(handler, journal.JournalHandler) and handler.identifier == "scrinalia-api"
    assert config["loggers"]["uvicorn.access"]["level"] == "WARNING"
