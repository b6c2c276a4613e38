"""The deterministic simulator: the production ``Supervisor`` on virtual time, every fault schedule a seed.

``python -m runner.simulation --seeds N [--seed S] [--json]`` runs N histories (seeds 0..N-1, or the one
seed S, replayed with a readable trace). Each history is built from its seed alone (``history``): several
runners, each the production ``runner.supervisor.Supervisor`` with its production phases, over simulated
ports (``processes``: the clock, the wait, the fork server and its children, signals; ``control``: the
control socket; ``database``: the in-memory ledger ``runner.memory_ledger`` on the world's clock and the
faults between a session and it), driven by one event queue (``world``). Faults come on dials
(``faults``); the invariants (``invariants``) are checked after every step, and a violation names the
seed, the invariant and the step. See docs/architecture.md, "The simulator", and decision 0132.
"""
from runner.simulation.faults import FAULT_KINDS, Dials
from runner.simulation.history import SeedResult, Simulation, run_seed
from runner.simulation.invariants import INVARIANTS

__all__ = ["FAULT_KINDS", "INVARIANTS", "Dials", "SeedResult", "Simulation", "run_seed"]
