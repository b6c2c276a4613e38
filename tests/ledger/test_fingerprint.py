"""archive_error_fingerprint: one group per kind of error, whatever its particulars."""
from __future__ import annotations

import pytest
from sqlalchemy import text


def _fp(engine, error: str | None) -> str | None:
    with engine.connect() as conn:
        return conn.execute(text("SELECT archive_error_fingerprint(:e)"), {"e": error}).scalar_one()


@pytest.mark.parametrize(
    "variants",
    [
        ["RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 79.15 GiB total)",
         "RuntimeError: CUDA out of memory. Tried to allocate 1024.50 MiB (GPU 3; 39.59 GiB total)"],
        ["KeyError: document 1234 not found in run 6f1c2a9e-3b4d-4e5f-8a9b-0c1d2e3f4a5b",
         "KeyError: document 98 not found in run 00000000-1111-2222-3333-444444444444"],
        ["OSError: [Errno 2] No such file or directory: '/models/minilm/config.json'",
         "OSError: [Errno 2] No such file or directory: '/srv/cache/other-model/v2/config.json'"],
        ["ValueError: checksum deadbeefcafebabe0123 mismatch",
         "ValueError: checksum 0123456789abcdef9999aaaa mismatch"],
        ["ChildCrashed:   killed by   SIGSEGV\nTraceback line 1\nline 2",
         "childcrashed: killed by sigsegv\nsomething else entirely"],
    ],
)
def test_errors_differing_only_by_particulars_share_a_fingerprint(engine, variants):
    prints = {_fp(engine, v) for v in variants}
    assert len(prints) == 1, prints
    assert all(p and len(p) <= 200 for p in prints)


def test_fingerprint_normalises_as_documented(engine):
    assert _fp(engine, "  OSError:  bad file /tmp/x/1.txt at 12 \n trace") == "oserror: bad file <path> at <n>"
    assert _fp(engine, "E: 6f1c2a9e-3b4d-4e5f-8a9b-0c1d2e3f4a5b") == "e: <uuid>"
    assert _fp(engine, "E: hash 0123456789abcdef0") == "e: hash <hash>"
    assert _fp(engine, "E: " + "word " * 100) == ("e: " + "word " * 100)[:200]
    assert _fp(engine, None) is None


def test_errors_differing_in_words_stay_apart(engine):
    prints = {
        _fp(engine, "RuntimeError: CUDA out of memory"),
        _fp(engine, "RuntimeError: CUDA illegal memory access"),
        _fp(engine, "ValueError: CUDA out of memory"),
        _fp(engine, "KeyError: document 12 not found"),
        _fp(engine, "KeyError: entity 12 not found"),
    }
    assert len(prints) == 5


def test_the_column_is_generated_from_error(engine):
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO archive_worker_runs (worker_name, trigger, request, status, error) "
                          "VALUES ('x', 'API', '{}', 'FAILED', 'IOError: disk 3 full')"))
        fingerprint = text("SELECT error_fingerprint FROM archive_worker_runs")
        assert conn.execute(fingerprint).scalar_one() == "ioerror: disk <n> full"
        conn.execute(text("UPDATE archive_worker_runs SET error = 'TimeoutError: after 30 s'"))
        assert conn.execute(fingerprint).scalar_one() == "timeouterror: after <n> s"
