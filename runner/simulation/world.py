"""The simulated world's engine: virtual time, one event queue, and actors that block on it.

Every actor (a runner's supervisor, a child) runs its own code in a greenlet; whenever that code waits
(the supervisor's ``select``, a statement's round trip or its lock wait, a child's batch), it switches
to the hub, which pops the next event of the queue, moves the clock to it and resumes whoever it
concerns. Exactly one actor runs at a time, in an order fixed by (time, sequence number): one seed is
one history, and replaying it gives the same history (FoundationDB's simulation, TigerBeetle's VOPR).

An actor can be frozen (SIGSTOP: its wake-ups wait for the thaw), killed (never resumed again) or poked
(something became readable for it: its wait ends now).
"""
from __future__ import annotations

import heapq
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from greenlet import greenlet

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)
WALL_EPOCH = EPOCH.timestamp()


CURRENT: World | None = None  # the world running now (the replay's log handler reads it)


class ActorKilled(BaseException):
    """Thrown into a killed actor's greenlet when the world ends: its code unwinds, writing nothing."""


@dataclass(eq=False)
class Actor:
    """Something that runs code in the world: one greenlet, its wake-ups, its state."""

    name: str
    world: World
    body: Callable[[], None]
    glet: greenlet | None = None
    dead: bool = False
    frozen_until: float | None = None    # SIGSTOP: resumed no earlier than this (None: running)
    poked: bool = False                  # something became readable since its last wait began
    waiting: bool = False                # in a wait that a poke ends
    token: int = 0                       # the current wake-up's number (older ones are stale)
    deadline: float | None = None        # the client-side bound of the statement it is in (the guard)
    thawed_at: float | None = None       # the end of its last SIGSTOP
    finished: bool = False

    def start(self, at: float) -> None:
        self.glet = greenlet(self._main, parent=self.world.hub)
        self.world.schedule_actor(self, at)

    def _main(self) -> None:
        try:
            self.body()
        except ActorKilled:
            pass
        self.finished = True

    def poke(self) -> None:
        """Something is readable for this actor: a wait in progress ends now."""
        self.poked = True
        if self.waiting and not self.dead:
            self.world.schedule_actor(self, self.world.now)


@dataclass(order=True)
class _Event:
    at: float
    seq: int
    actor: Actor | None = field(compare=False, default=None)
    token: int = field(compare=False, default=0)
    callback: Callable[[], None] | None = field(compare=False, default=None)


class World:
    """Virtual time and the event queue. ``after_step`` runs after every event (the invariants)."""

    def __init__(self, seed: int, trace: Callable[[float, str, str], None] | None = None) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.now = 0.0
        self.steps = 0
        self.hub = greenlet.getcurrent()
        self._queue: list[_Event] = []
        self._seq = 0
        self.actors: list[Actor] = []
        self.current: Actor | None = None
        self.trace_sink = trace
        self.after_step: Callable[[], None] = lambda: None

    # --- clocks ---------------------------------------------------------------------------------------

    def db_now(self) -> datetime:
        """The database's clock (``now()``): the world's time; the database host's clock never jumps here."""
        return EPOCH + timedelta(seconds=self.now)

    def trace(self, who: str, what: str) -> None:
        if self.trace_sink is not None:
            self.trace_sink(self.now, who, what)

    # --- scheduling -------------------------------------------------------------------------------------

    def _push(self, event: _Event) -> None:
        heapq.heappush(self._queue, event)

    def at(self, when: float, callback: Callable[[], None]) -> None:
        """Run ``callback`` in the hub at ``when`` (a fault, an enqueue, a child's kernel event)."""
        self._seq += 1
        self._push(_Event(max(when, self.now), self._seq, callback=callback))

    def schedule_actor(self, actor: Actor, when: float) -> None:
        actor.token += 1
        self._seq += 1
        self._push(_Event(max(when, self.now), self._seq, actor=actor, token=actor.token))

    def spawn(self, name: str, body: Callable[[], None], at: float | None = None) -> Actor:
        actor = Actor(name, self, body)
        self.actors.append(actor)
        actor.start(self.now if at is None else at)
        return actor

    # --- what an actor calls ------------------------------------------------------------------------------

    def sleep(self, seconds: float, *, wakeable: bool = False) -> None:
        """Block the running actor for ``seconds`` of virtual time (``wakeable``: a poke ends it early)."""
        actor = self.current
        assert actor is not None, "only an actor can wait"
        if actor.dead:
            raise ActorKilled
        if wakeable and actor.poked:
            actor.poked = False
            return
        actor.waiting = wakeable
        self.schedule_actor(actor, self.now + max(0.0, seconds))
        self.hub.switch()
        if actor.dead:
            raise ActorKilled
        actor.waiting = False
        if wakeable:
            actor.poked = False

    def freeze(self, actor: Actor, until: float) -> None:
        actor.frozen_until = max(until, actor.frozen_until or 0.0)
        self.at(actor.frozen_until, lambda: self._thaw(actor))

    def _thaw(self, actor: Actor) -> None:
        if actor.frozen_until is not None and actor.frozen_until <= self.now:
            actor.frozen_until = None
            actor.thawed_at = self.now

    def kill(self, actor: Actor) -> None:
        actor.dead = True

    # --- the hub ---------------------------------------------------------------------------------------------

    def run_until(self, end: float) -> None:
        global CURRENT
        CURRENT = self
        while self._queue and self._queue[0].at <= end:
            event = heapq.heappop(self._queue)
            if event.actor is not None:
                actor = event.actor
                if actor.dead or actor.finished or event.token != actor.token:
                    continue
                if actor.frozen_until is not None and actor.frozen_until > event.at:
                    self.now = max(self.now, event.at)
                    self.schedule_actor(actor, actor.frozen_until)  # SIGSTOP: after the thaw
                    continue
                self.now = max(self.now, event.at)
                self.steps += 1
                self.current = actor
                assert actor.glet is not None
                actor.glet.switch()
                self.current = None
            else:
                self.now = max(self.now, event.at)
                self.steps += 1
                assert event.callback is not None
                event.callback()
            self.after_step()
        self.now = max(self.now, end)

    def close(self) -> None:
        """End every actor still suspended (its code unwinds; the world's ports are inert by now)."""
        for actor in self.actors:
            if actor.glet is not None and not actor.glet.dead and actor.glet is not greenlet.getcurrent():
                actor.dead = True
                try:
                    actor.glet.throw(ActorKilled)
                except ActorKilled:
                    pass
        self.actors.clear()


def pick(rng: random.Random, choices: Sequence[Any]) -> Any:
    return choices[rng.randrange(len(choices))]
