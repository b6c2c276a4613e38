"""Row locks held by other sessions (a frozen transaction, a batch's own ``FOR UPDATE``)."""
from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from runner.memory_ledger.batch import InMemoryBatch
    from runner.memory_ledger.database import MemoryDatabase

#: Row-lock modes another session may hold (PostgreSQL's FOR SHARE / FOR UPDATE). Every UPDATE of the
#: protocol takes FOR NO KEY UPDATE, which conflicts with both; the batch COMMIT's FOR SHARE conflicts
#: with FOR UPDATE only; a ``SKIP LOCKED`` claim or expiry skips a row held in either mode.
SHARE, UPDATE = "share", "update"


@dataclass(eq=False)
class RowLock:
    """A row lock held by another session (one frozen mid-transaction, say) until ``release`` or, when
    given, its ``release_at`` (the database clock): then it is gone by itself."""

    database: MemoryDatabase
    run_id: uuid.UUID
    mode: str
    release_at: datetime | None = None
    owner: InMemoryBatch | None = None  # the transaction that holds it (None: a session of the world's)

    def release(self) -> None:
        held = self.database.locks.get(self.run_id)
        if held is not None and self in held:
            held.remove(self)
            if not held:
                del self.database.locks[self.run_id]

    def conflicts(self, wanted: str) -> bool:
        return self.mode == UPDATE or wanted != SHARE
