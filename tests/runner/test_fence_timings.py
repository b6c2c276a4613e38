"""The self-fence's timings are derived together (decision 0110): the statement bound leaves a retried
heartbeat before the fence point and never exceeds 5 s; flags that leave the fence no room are refused
(exit 2) with a message that says why."""
from __future__ import annotations

import subprocess

import pytest

from runner.options import EXIT_USAGE, OptionsError, RunnerOptions
from tests.runner.conftest import ROOT, RUNNER


@pytest.mark.parametrize(("heartbeat", "lease", "margin", "statement", "connect"), [
    (15, 60, 7.5, 5.0, 2.0),     # the defaults
    (1, 4, 0.5, 1.25, 1.25),     # short: (4 - 0.5 - 1) / 2
    (0.3, 5, 0.15, 2.0, 2.0),
])
def test_the_bounds_are_derived_with_the_fence_margin(heartbeat, lease, margin, statement, connect):
    options = RunnerOptions(name="x", heartbeat_seconds=heartbeat, lease_seconds=lease).validate()
    assert options.fence_margin == pytest.approx(margin)
    assert options.statement_seconds == pytest.approx(statement)
    assert options.connect_seconds == pytest.approx(connect)
    # A failed heartbeat can be retried before the fence point.
    assert heartbeat + 2 * options.statement_seconds <= lease - options.fence_margin + 1e-9
    assert options.spawn_seconds <= max(options.fence_margin, 0.5)


def test_timings_that_leave_the_fence_no_room_are_refused(runner_env, tmp_path):
    with pytest.raises(OptionsError, match="fence margin of 0.05 s"):
        RunnerOptions(name="x", heartbeat_seconds=0.1, lease_seconds=0.3).validate()
    with pytest.raises(OptionsError, match="for one database statement"):
        RunnerOptions(name="x", heartbeat_seconds=1, lease_seconds=1.3).validate()
    done = subprocess.run([*RUNNER, "daemon", "--preload", "none", "--name", "x", "--heartbeat", "0.1", "--lease",
                           "0.3", "--socket", str(tmp_path / "s")], cwd=ROOT, env=runner_env, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == EXIT_USAGE, done.stderr
    assert "fence margin" in done.stderr and "raise --lease" in done.stderr
