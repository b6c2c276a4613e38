"""Every refusal of ``RunnerOptions.validate`` (the daemon's flags), each by its flag and reason, pinned
before its checks were split into named steps (issue 27). Pure: no database, no process."""
from __future__ import annotations

import pytest

from runner.options import OptionsError, RunnerOptions

REFUSED = [
    ({"name": " "}, "--name must not be empty"),
    ({"concurrency": 0}, "--concurrency must be at least 1, got 0"),
    ({"heartbeat_seconds": 0}, "--heartbeat must be positive, got 0"),
    ({"heartbeat_seconds": 15, "lease_seconds": 15}, "--lease (15 s) must exceed --heartbeat (15 s)"),
    ({"poll_seconds": 0}, "--poll must be positive, got 0"),
    ({"listen_poll_seconds": -1}, "--listen-poll must be positive, got -1"),
    ({"drain_timeout": -1}, "--drain-timeout must not be negative"),
    ({"max_runtime": 0}, "--max-runtime must be positive"),
    ({"kill_grace": -1}, "--cancel-grace and --kill-grace must not be negative"),
    ({"stall_timeout": -1}, "--stall-timeout must not be negative (0 turns it off), got -1"),
    ({"per_device": 0}, "--per-device must be at least 1, got 0"),
    ({"devices": "0,0"}, "--devices names a device twice"),
    ({"devices": "x"}, "--devices: 'x' is neither an index nor a device UUID"),
    ({"warm_limit_mb": -1}, "--warm-limit-mb must not be negative (0: no model warm), got -1"),
    ({"warm_models": "/m:float32, /n:int8"}, "--warm-models: '/n:int8': the dtype must be one of float32"),
    ({"start_method": "fork"}, "--start-method must be one of forkserver, spawn"),
    ({"name": "", "concurrency": 0}, "--name must not be empty"),  # the first refusal wins
    ({"per_device": 0, "start_method": "fork"}, "--per-device must be at least 1"),
]


@pytest.mark.parametrize(("flags", "said"), REFUSED, ids=[str(r[0]) for r in REFUSED])
def test_each_bad_flag_is_refused_by_name(flags, said):
    with pytest.raises(OptionsError) as err:
        RunnerOptions(**{"name": "x", **flags}).validate()
    assert str(err.value).startswith(said), err.value


@pytest.mark.parametrize("flags", [
    {}, {"warm_models": "auto"}, {"warm_models": " none "}, {"warm_models": "/m, /n:bfloat16"},
    {"devices": "none"}, {"devices": "0,GPU-1"}, {"max_runtime": 1.0}, {"stall_timeout": 0},
    {"warm_limit_mb": 0}, {"start_method": "spawn"},
])
def test_good_flags_come_back_as_they_are(flags):
    options = RunnerOptions(**{"name": "x", **flags})
    assert options.validate() is options
