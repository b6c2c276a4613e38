"""The deterministic simulator (issue 19): the production Supervisor on virtual time, a few hundred
seeds in ``make test`` (the long run is bench/bench_simulation.py), replayable histories, the CLI's
JSON exactly as other checks call it."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from runner.simulation import FAULT_KINDS, run_seed
from runner.simulation.__main__ import run_many

SHORT_RUN = 200


def test_a_few_hundred_seeds_break_no_invariant_and_meet_every_fault_kind():
    summary = run_many(list(range(SHORT_RUN)), jobs=2)
    assert summary["violations"] == [], summary["violations"][:5]
    assert summary["seeds"] == SHORT_RUN and summary["steps"] > 100 * SHORT_RUN
    missing = [kind for kind in FAULT_KINDS if summary["faults"].get(kind, 0) == 0]
    assert not missing, missing
    assert summary["runs"].get("SUCCESS", 0) > summary["runs"].get("FAILED", 0)  # the world is not all faults


def test_the_same_seed_gives_the_same_history_twice_and_in_another_process():
    first, second = run_seed(11), run_seed(11)
    assert (first.steps, first.virtual_seconds, first.digest, first.faults) == \
        (second.steps, second.virtual_seconds, second.digest, second.faults)
    assert run_seed(12).digest != first.digest
    code = "from runner.simulation import run_seed; r = run_seed(11); print(r.steps, r.digest)"
    env = dict(os.environ, PYTHONHASHSEED="12345")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == [str(first.steps), str(first.digest)]


def test_the_command_line_prints_the_summary_the_issue_names():
    out = subprocess.run([sys.executable, "-m", "runner.simulation", "--seeds", "4", "--json"],
                         capture_output=True, text=True, check=True)
    summary = json.loads(out.stdout)
    assert {"seeds", "steps", "virtual_seconds", "faults", "violations", "wall_seconds"} <= set(summary)
    assert summary["seeds"] == 4 and summary["violations"] == [] and set(FAULT_KINDS) <= set(summary["faults"])


def test_one_seed_replays_with_a_readable_trace():
    out = subprocess.run([sys.executable, "-m", "runner.simulation", "--seeds", "1", "--seed", "3"],
                         capture_output=True, text=True, check=True)
    lines = out.stdout.splitlines()
    assert lines[-1].startswith("seed 3: ") and "digest" in lines[-1]
    assert any("runner-1" in line and "registered" in line for line in lines)  # the supervisor's own log
    assert any("enqueued" in line for line in lines)
    assert str(run_seed(3).digest and f"{run_seed(3).digest:08x}") in lines[-1]


def test_parallel_processes_give_the_same_summary_as_one():
    one, two = run_many(list(range(6)), jobs=1), run_many(list(range(6)), jobs=2)
    for summary in (one, two):
        del summary["wall_seconds"]
    assert one == two


def test_the_claims_reads_go_through_the_port_so_the_simulator_sends_them():
    """Decision 0351: what a resolver reads at claim (the settings, the LLM_CHECK rule) is a statement of
    the port, so the production supervisor sends it to the simulator's ledger too."""
    from collections import Counter

    from runner.simulation import Simulation

    sim = Simulation(5)
    sim.run()
    sent: Counter[str] = Counter()
    for host in sim.hosts:
        if host.supervisor is not None:
            sent.update(host.supervisor.db.statements)
    assert sent["settings"] > 0 and sent["llm_check_rule"] > 0, sent
