"""What every request handler reaches through ``request.app.state.ctx``: no module-level state."""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import TYPE_CHECKING

from argon2 import PasswordHasher
from fastapi import Request
from sqlalchemy import Engine

from scrinalia.api.catalogue_view import CountsCache
from scrinalia.api.settings import ApiSettings
from scrinalia.domains.archive.workers.sdk import WorkerSpec
from scrinalia.domains.identity.lockout import LockoutPolicy, Pruner
from scrinalia.domains.identity.ratelimit import SlidingWindowLimiter
from scrinalia.settings import Settings

if TYPE_CHECKING:
    from scrinalia.api.events import EventHub
    from scrinalia.api.stream_sessions import SessionWatch


@dataclass
class AppContext:
    engine: Engine
    settings: Settings | None
    api: ApiSettings
    catalogue: dict[str, WorkerSpec]
    hasher: PasswordHasher | None = None  # None: the default argon2id profile
    owns_engine: bool = False
    login_limiter: SlidingWindowLimiter = field(init=False)
    lockout_pruner: Pruner = field(default_factory=Pruner)
    counts: CountsCache = field(init=False)

    def __post_init__(self) -> None:
        self.counts = CountsCache(self.api.counts_max_age_seconds)
        # The per-process brake (decision 0032); the durable lockout is in auth_login_throttle.
        self.login_limiter = SlidingWindowLimiter(self.api.login_rate_limit, self.api.login_rate_window_seconds)

    @cached_property
    def events(self) -> EventHub:
        """The process's one LISTEN connection for the live panel (opened with its first stream)."""
        from scrinalia.api.events import EventHub
        from scrinalia.db.engine import connect_args_for

        direct = self.settings.session_url() if self.settings is not None else None
        url = direct.url if direct is not None else None
        return EventHub.for_engine(self.engine, url=url, workers=frozenset(self.catalogue),
                                   **connect_args_for(self.settings, "scrinalia-api-events", url))

    @cached_property
    def stream_sessions(self) -> SessionWatch:
        """The sessions of the open streams, checked again every few seconds (decision 0141)."""
        from scrinalia.api.stream_sessions import SessionWatch

        return SessionWatch(self.engine)

    @cached_property
    def lockout(self) -> LockoutPolicy:
        return LockoutPolicy(self.api.lockout_threshold, self.api.lockout_base_seconds, self.api.lockout_max_seconds)


def ctx(request: Request) -> AppContext:
    return request.app.state.ctx
