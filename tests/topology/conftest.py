"""The topology tests (a pooler, a standby) start real runners and APIs: the runner's fixtures apply."""
from __future__ import annotations

from tests.runner.conftest import runner_env, start_runner  # noqa: F401 - fixtures, found by name
