"""A per-process brake on login attempts per client address (a sliding window in memory).

It is deliberately not shared between processes (decision 0032): with ``--workers N`` an address
gets at most N x the limit, and the durable lockout (``lockout``, in ``auth_login_throttle``) is what
protects an account.
"""
from __future__ import annotations

import threading
import time
from collections import deque


class SlidingWindowLimiter:
    def __init__(self, limit: int, window_seconds: float, *, max_keys: int = 10_000, clock=time.monotonic) -> None:
        self.limit = limit
        self.window = window_seconds
        self.max_keys = max_keys
        self._clock = clock
        self._hits: dict[str, deque[float]] = {}
        self._lock = threading.Lock()

    def hit(self, key: str) -> float:
        """Record an attempt; 0.0 when allowed, else the seconds to wait before the next one."""
        now = self._clock()
        horizon = now - self.window
        with self._lock:
            hits = self._hits.get(key)
            if hits is None:
                if len(self._hits) >= self.max_keys:
                    self._prune(horizon)
                hits = self._hits[key] = deque()
            while hits and hits[0] <= horizon:
                hits.popleft()
            if len(hits) >= self.limit:
                return max(0.001, hits[0] + self.window - now)
            hits.append(now)
            return 0.0

    def _prune(self, horizon: float) -> None:
        for key in [k for k, v in self._hits.items() if not v or v[-1] <= horizon]:
            del self._hits[key]
        while len(self._hits) >= self.max_keys:  # still full of live keys: forget the oldest
            self._hits.pop(next(iter(self._hits)))
