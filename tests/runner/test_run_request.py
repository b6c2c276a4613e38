"""The one-shot's request from its command line (``runner.cli._run_request``): ``--request`` first, the
flags over it, each ``KEY=VALUE`` read by the catalogue's declared type (decision 0140); each refusal is
a usage error (exit 2). In-process, no database: tests/runner/test_oneshot_cli.py runs the command."""
from __future__ import annotations

import json

import click
import pytest

from runner.cli import _run_request
from scrinalia.domains.archive.workers.plugins import ENV_VAR

NER_ENGINE = "transformers-token-classification"

READ = [
    (("ner", None, None, None, (), (), None), {}),
    (("ner", NER_ENGINE, "cpu", 8, ("min_score=0.5", 'labels=["PER"]'), ("batch_size=4", "model=/m"), None),
     {"db_batch_size": 8, "engine_name": NER_ENGINE, "engine_options": {"batch_size": 4, "model": "/m"},
      "options": {"labels": ["PER"], "min_score": 0.5}, "preset": "cpu"}),
    (("ner", None, None, None, ("min_length=3",), (),
      '{"options":{"min_score":0.1},"engine_options":{"stride":2},"preset":"gpu"}'),
     {"engine_options": {"stride": 2}, "options": {"min_length": 3, "min_score": 0.1}, "preset": "gpu"}),
    (("ner", None, "cpu", None, ("min_length=3",), (), '{"options":"not-a-dict","preset":"gpu"}'),
     {"options": {"min_length": 3}, "preset": "cpu"}),
    (("ner", None, None, None, (), ("batch_size=8",), '{"engine_options":{"model":"/x"}}'),
     {"engine_options": {"batch_size": 8, "model": "/x"}}),
    (("unknown", None, None, None, ("a=1", "b=x", 'c={"k":1}'), ("d=2",), None),
     {"engine_options": {"d": 2}, "options": {"a": 1, "b": "x", "c": '{"k":1}'}}),
    (("typology", "transformers-zero-shot", None, None, (), ("batch_size=5",), None),
     {"engine_name": "transformers-zero-shot", "engine_options": {"batch_size": 5}}),
    (("ner", None, None, None, ("min_score=0.5",), (), '{"engine_name":5}'),
     {"engine_name": 5, "options": {"min_score": 0.5}}),  # judged later, by the shared validation
]

REFUSED = [
    (("ner", None, None, None, ("engine_options.model=/m",), (), None),
     "--option 'engine_options.model=/m': an engine option takes --engine-option model=VALUE"),
    (("ner", None, None, None, ("novalue",), (), None), "--option 'novalue' must look like key=value"),
    (("ner", None, None, None, (), ("=1",), None), "--engine-option '=1' must look like key=value"),
    (("ner", None, None, None, (), (), "[1]"), "--request must be a JSON object (the API's run request)"),
    (("ner", None, None, None, (), (), "{bad"), "--request is not valid JSON"),
]


@pytest.fixture(autouse=True)
def _installed_catalogue(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENV_VAR, "")


@pytest.mark.parametrize(("args", "request_"), READ, ids=[str(r[0][4:])[:50] for r in READ])
def test_the_flags_are_read_over_the_request(args, request_):
    assert json.dumps(_run_request(*args), sort_keys=True) == json.dumps(request_, sort_keys=True)


@pytest.mark.parametrize(("args", "said"), REFUSED, ids=[r[1][:40] for r in REFUSED])
def test_a_malformed_flag_or_request_is_a_usage_error(args, said):
    with pytest.raises(click.UsageError) as err:
        _run_request(*args)
    assert err.value.message.startswith(said), err.value.message


def test_a_value_its_declared_type_cannot_read_exits_2_naming_the_field(capsys):
    with pytest.raises(SystemExit) as done:
        _run_request("ner", None, None, None, ("min_length=abc",))
    assert done.value.code == 2
    assert capsys.readouterr().err == "scrinalia-runner: options.min_length: cannot read 'abc' as int\n"
