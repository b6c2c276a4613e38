"""Typed errors of the ledger: the API maps them to HTTP answers, the CLI to exit codes."""
from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from scrinalia.domains.archive.ledger import WorkerRun


class LedgerError(Exception):
    """Base class of every ledger error."""


class InvalidRunRequest(LedgerError, ValueError):
    """The request is malformed; ``field`` names the offending part. Nothing was written."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class WorkerRunAlreadyActive(LedgerError):
    """The worker's slot is taken (uq_worker_run_active); ``active`` is the run that holds it."""

    def __init__(self, worker_name: str, active: WorkerRun | None) -> None:
        who = f" by run {active.run_id} ({active.status})" if active else ""
        super().__init__(f"worker {worker_name!r} already has an active run{who}")
        self.worker_name = worker_name
        self.active = active


class RunNotFound(LedgerError, LookupError):
    def __init__(self, run_id: object) -> None:
        super().__init__(f"no run {run_id}")
        self.run_id = run_id


class RunAlreadyFinished(LedgerError):
    """A cancel (or another request) reached a run that is already terminal."""

    def __init__(self, run: WorkerRun) -> None:
        super().__init__(f"run {run.run_id} has already ended {run.status}")
        self.run = run
