"""One channel per child (issue 12): a run's outcome is decided once its exit has been reported AND its
channel has reached its end (bounded by EOF_GRACE), never by reading the channel one last time at the
moment the exit is reported."""
from __future__ import annotations

import pytest

from tests.runner.conftest import enqueue, wait_status

pytestmark = pytest.mark.slow


def test_a_result_that_arrives_after_the_exit_report_is_the_outcome(engine, start_runner):
    start_runner("--poll", "0.1", "--heartbeat", "1", "--lease", "8", "--capabilities", "late-result")
    run = wait_status(engine, enqueue(engine, "late-result", delay=0.5).run_id, ("SUCCESS", "FAILED"))
    assert run.status == "SUCCESS", run.error
    assert run.result == {"late": True}
