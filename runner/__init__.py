"""The GPU host's process model: a supervisor parent, one child process per claimed run.

Modules, one per concept:

* ``supervisor``  the arbiter: one loop of named phases over a table of children (never imports torch);
                  its phases live in ``claims`` (claim, resolve once, ``record_start``, start a child),
                  ``lease`` (heartbeat, self-fence, expiry, progress, notifications) and ``tending``
                  (the children's messages, exits, deadlines), over the state of ``loop_state``;
* ``run_state``   the state machine of one run in the table: phases, transitions, effects, deadlines;
* ``finisher``    the one writer of terminal rows in the parent (``ledger.finish``);
* ``children``    a table entry: the process, its channel, its output, its resources;
* ``ledger_link`` every protocol statement of the supervisor, and the database's state;
* ``ledger_port`` the interface of every protocol statement (``LedgerPort``); its adapters: ``pg_ledger``
                  (PostgreSQL, through the ledger module's functions) and ``memory_ledger`` (in memory,
                  PostgreSQL's semantics on a given clock: the simulator's database);
* ``bounded``     the client-side bound of each of its database steps: none outlives the fence point;
* ``stall``       the per-child liveness rule (no message and no CPU work for the stall timeout);
* ``signals``     the self-pipe that brings signals into the loop;
* ``daemon``      how ``scrinalia-runner daemon`` starts;
* ``child``       the child entry point shared by the daemon and the one-shot CLI;
* ``forkserver``  a preloaded (torch, transformers, the catalogue; never CUDA) process that forks children;
* ``launchers``   the launcher interface, exit reports, and plain spawn (used by the one-shot CLI);
* ``wire``        the framing of the private sockets between those processes;
* ``outcome``     how a child's exit becomes a terminal row (status, exit fields, error with a fingerprint);
* ``control``     the unix control socket (``scrinalia-runner status``);
* ``status``      the status snapshot and its rendering; ``watch``: ``status --watch``, the live view;
* ``oneshot``     ``run_once`` and ``scrinalia-runner run``;
* ``guard``       the import hook that keeps torch out of the supervisor;
* ``database``    the supervisor's engine (bounded statements), the schema check, the registration;
* ``ports``       the clock, the wait, signals and /proc, the control socket (interfaces and adapters);
* ``timings``     every time quantity, derived in one place; ``drain``: the drain and the exit code;
* ``simulation``  the deterministic simulator of the production supervisor (``python -m runner.simulation``);
* ``sdnotify``, ``devices`` (NVML), ``procinfo`` (/proc, cgroup), ``options``, ``cli``.
"""
