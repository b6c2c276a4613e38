"""One home per statement, one name (issue 27): every statement of the protocol is a named query of
``scrinalia/domains/archive/queries.sql``; each has a method of that name on the ledger port, an in-memory
twin keyed by it (``runner.memory_ledger.TWINS``), a conformance test that sends it, and a row in
docs/protocol.md. No database: these read the file, the classes and the sources.
"""
from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

from runner import memory_ledger
from runner.ledger_port import BatchTransaction, LedgerPort
from scrinalia.domains.archive.queries import QUERIES, QUERIES_FILE, parse

ROOT = Path(__file__).resolve().parents[2]

#: Named queries the runner does not send, so the port (and the in-memory ledger) has no twin of them.
NOT_ON_THE_PORT = {"enqueue_retries": "the scheduler's retry policy (tests/scheduler), not the runner's"}
#: A port method named otherwise than its query: the batch's, on the transaction object.
PORT_NAME = {"register_batch_fence": "register_fence"}


def _port_methods() -> set[str]:
    def names(cls: type) -> set[str]:
        return {n for n, v in vars(cls).items() if callable(v) and not n.startswith("_")}

    return names(LedgerPort) | names(BatchTransaction)


def test_every_named_query_has_a_port_method_and_an_in_memory_twin() -> None:
    on_the_port = [name for name in QUERIES if name not in NOT_ON_THE_PORT]
    assert sorted(memory_ledger.TWINS) == sorted(on_the_port)
    methods = _port_methods()
    for name in on_the_port:
        method = PORT_NAME.get(name, name)
        assert method in methods, f"no port method {method!r} for the named query {name!r}"
        assert memory_ledger.TWINS[name].rsplit(".", 1)[1] == method


def test_each_twin_sends_its_statement_under_the_querys_name() -> None:
    classes = {"InMemoryLedger": memory_ledger.InMemoryLedger, "InMemoryBatch": memory_ledger.InMemoryBatch}
    for name, qualname in memory_ledger.TWINS.items():
        cls, method = qualname.split(".")
        source = inspect.getsource(getattr(classes[cls], method))
        assert f'_statement("{name}")' in source, f"{qualname} does not send {name!r}"


def test_every_twin_is_held_to_postgresql_by_a_conformance_test() -> None:
    tree = ast.parse((ROOT / "tests" / "ledger" / "test_conformance.py").read_text())
    called: set[str] = set()
    for test in (n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")):
        called |= {c.func.attr for c in ast.walk(test) if isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute)}
    missing = [name for name in memory_ledger.TWINS if PORT_NAME.get(name, name) not in called]
    assert not missing, f"named queries no conformance test sends: {missing}"
    extra = sorted({"server_facts"} - called)  # the port's one method that is no statement
    assert not extra


def test_every_statement_has_one_fence_and_takes_no_client_timestamp() -> None:
    for query in QUERIES.values():
        assert query.fence.strip()
        params = set(re.findall(r"(?<!:):([a-z_]+)", query.sql))
        assert not {p for p in params if p.endswith("_at") or p in ("now", "at")}, query.name


def test_the_file_is_read_strictly() -> None:
    assert list(parse(QUERIES_FILE.read_text())) == list(QUERIES)
    for broken in ("-- name: a\nSELECT 1\n",  # no fence
                   "-- name: a\n-- fence: x\n",  # no statement
                   "-- name: a\n-- fence: x\nSELECT 1\n-- name: a\n-- fence: x\nSELECT 2\n"):  # twice
        try:
            parse(broken)
        except ValueError:
            continue
        raise AssertionError(f"accepted {broken!r}")


def test_docs_protocol_lists_the_named_queries_in_the_files_order() -> None:
    text = (ROOT / "docs" / "protocol.md").read_text()
    section = text.split("## The named queries", 1)[1].split("\n## ", 1)[0]
    listed = re.findall(r"^\| `([a-z_]+)` \| (.+?) \|$", section, re.M)
    expected = [(q.name, q.fence.replace("|", "\\|")) for q in QUERIES.values()]
    assert listed == expected, "\n".join(f"| `{n}` | {f} |" for n, f in expected)
