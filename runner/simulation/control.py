"""The control socket port of a simulated host: clients that ask for ``status`` or a drain, and clients
that never finish their request (``runner.control.ControlServer``'s bounds: ``CONTROL_CLIENT_TIMEOUT`` per
client, ``CONTROL_SERVE_BUDGET`` per call, never past the caller's fence point, at least 50 ms a client)."""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from runner.simulation.world import World
from runner.timings import CONTROL_CLIENT_MIN, CONTROL_CLIENT_TIMEOUT, CONTROL_SERVE_BUDGET


@dataclass
class Client:
    request: dict[str, Any] | None  # None: it never sends its newline (or never reads the answer)
    answer: dict[str, Any] | None = None


class SimControl:
    def __init__(self, world: World, poke: Callable[[], None]) -> None:
        self.world = world
        self.poke = poke
        self.waiting: list[Client] = []
        self.answered: list[Client] = []

    def connect(self, client: Client) -> None:
        self.waiting.append(client)
        self.poke()

    def fileno(self) -> int | None:
        return None  # the simulated waiter is poked instead

    def serve_pending(self, handler: Callable[[dict[str, Any]], dict[str, Any]], until: float | None = None) -> None:
        world = self.world
        budget_end = world.now + CONTROL_SERVE_BUDGET
        if until is not None:
            budget_end = min(budget_end, until)
        while world.now < budget_end and self.waiting:
            client = self.waiting.pop(0)
            at = world.now + CONTROL_CLIENT_TIMEOUT
            limit = at if until is None else max(min(at, until), world.now + CONTROL_CLIENT_MIN)
            if client.request is None:
                world.sleep(limit - world.now)  # it takes its whole budget, then it is dropped
                continue
            client.answer = handler(client.request)
            self.answered.append(client)

    def close(self) -> None:
        self.waiting.clear()
