"""The faults a history may meet, each with its own probability (the dials), drawn from the seed.

``FAULT_KINDS`` names every kind; ``Dials`` holds the probability that a history has one of each (a
history may have several of a kind). World-level faults are scheduled when the history starts
(``FaultPlan.schedule``); a child's own fault is drawn when it is forked (``child_plan``).
"""
from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field

#: Every fault kind, in the order of the issue: the database path, the children, the fork server, the
#: runner's process and host, the control socket.
FAULT_KINDS = (
    "statement_hang", "slow_statements", "refused_connections", "partition_one", "partition_all",
    "db_restart", "db_failover", "row_lock_frozen_session", "answer_lost",
    "child_crash", "child_stall", "child_long_c_call", "child_slow_batch", "child_late_commit",
    "fork_server_stop", "fork_server_death",
    "runner_sigstop", "runner_sigkill",
    "control_client_never_reads", "wall_clock_jump",
)

WORLD_FAULTS = tuple(k for k in FAULT_KINDS if not k.startswith("child_"))


@dataclass(frozen=True)
class Dials:
    """The probability of each kind per history (world faults), or per child (child faults)."""

    world: dict[str, float] = field(default_factory=lambda: {
        "statement_hang": 0.25, "slow_statements": 0.25, "refused_connections": 0.2, "partition_one": 0.3,
        "partition_all": 0.15, "db_restart": 0.15, "db_failover": 0.1, "row_lock_frozen_session": 0.25,
        "answer_lost": 0.2, "fork_server_stop": 0.3, "fork_server_death": 0.15, "runner_sigstop": 0.2,
        "runner_sigkill": 0.15, "control_client_never_reads": 0.3, "wall_clock_jump": 0.2,
    })
    child: dict[str, float] = field(default_factory=lambda: {
        "child_crash": 0.05, "child_stall": 0.04, "child_long_c_call": 0.05, "child_slow_batch": 0.08,
        "child_late_commit": 0.05,
    })


@dataclass(frozen=True, slots=True)
class ChildPlan:
    """What one child will do: its batches, and at most one fault of its own."""

    batches: int
    compute: float
    write: float = 0.005               # seconds of writes inside each batch's transaction
    crash_at: int | None = None
    stall_at: int | None = None
    long_call_at: int | None = None
    long_call: float = 0.0
    slow_at: int | None = None
    slow_factor: float = 1.0
    freeze_at: int | None = None
    freeze: float = 0.0


@dataclass(frozen=True, slots=True)
class Scheduled:
    kind: str
    at: float
    seconds: float
    host: int | None  # the host's index (None: every host)


class FaultPlan:
    def __init__(self, rng: random.Random, dials: Dials, lease: float, stall_timeout: float) -> None:
        self.rng = rng
        self.dials = dials
        self.lease = lease
        self.stall_timeout = stall_timeout
        self.counts: Counter[str] = Counter()

    def schedule(self, hosts: int, active_until: float) -> list[Scheduled]:
        """The world's faults of one history, in [1, active_until)."""
        rng, lease = self.rng, self.lease
        plan = []
        for kind in WORLD_FAULTS:
            probability = self.dials.world.get(kind, 0.0)
            while probability > 0 and rng.random() < probability:
                at = rng.uniform(1.0, active_until)
                seconds = {
                    "statement_hang": rng.uniform(0.5, 2 * lease), "slow_statements": rng.uniform(1, 3 * lease),
                    "refused_connections": rng.uniform(0.2, 1.5 * lease), "partition_one": rng.uniform(0.3, 2 * lease),
                    "partition_all": rng.uniform(0.3, 1.5 * lease), "db_restart": rng.uniform(0.2, 3.0),
                    "db_failover": rng.uniform(1.0, 1.5 * lease),
                    "row_lock_frozen_session": rng.uniform(0.5, 2 * lease),
                    "answer_lost": rng.uniform(0.5, lease), "fork_server_stop": rng.uniform(0.3, 3 * lease),
                    "runner_sigstop": rng.uniform(0.2, 2 * lease), "control_client_never_reads": rng.uniform(0.5, 5),
                    "wall_clock_jump": rng.uniform(-7200, 7200),
                }.get(kind, 0.0)
                one_host = kind not in ("partition_all", "db_restart", "db_failover")
                plan.append(Scheduled(kind, at, seconds, rng.randrange(hosts) if one_host else None))
                probability /= 2  # a second one of a kind is rarer
        plan.sort(key=lambda s: (s.at, s.kind))
        return plan

    def child_plan(self) -> ChildPlan:
        rng, dials = self.rng, self.dials.child
        batches = rng.randint(1, 6)
        compute = rng.uniform(0.02, 0.6)
        write = rng.uniform(0.001, 0.05)
        roll = rng.random()
        edge = 0.0
        for kind in ("child_crash", "child_stall", "child_long_c_call", "child_slow_batch", "child_late_commit"):
            edge += dials.get(kind, 0.0)
            if roll < edge:
                self.counts[kind] += 1
                at = rng.randrange(batches)
                if kind == "child_crash":
                    return ChildPlan(batches, compute, write, crash_at=at)
                if kind == "child_stall":
                    return ChildPlan(batches, compute, write, stall_at=at)
                if kind == "child_long_c_call":
                    return ChildPlan(batches, compute, write, long_call_at=at,
                                     long_call=rng.uniform(1.0, 2.5) * self.stall_timeout)
                if kind == "child_slow_batch":
                    return ChildPlan(batches, compute, write, slow_at=at, slow_factor=rng.uniform(5, 20))
                return ChildPlan(batches, compute, write, freeze_at=at, freeze=rng.uniform(0.2, 2.5 * self.lease))
        return ChildPlan(batches, compute, write)
