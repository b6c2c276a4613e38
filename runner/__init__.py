"""The GPU host's process model: a supervisor parent, one child process per claimed run.

Modules, one per concept:

* ``supervisor``  the arbiter: one loop, a table of children, the registry row, the claim loop and the
                  batched heartbeat; the only writer of lifecycle rows (never imports torch);
* ``child``       the child entry point shared by the daemon and the one-shot CLI;
* ``forkserver``  a preloaded (torch, transformers, the catalogue; never CUDA) process that forks children;
* ``launchers``   the launcher interface, exit reports, and plain spawn (used by the one-shot CLI);
* ``wire``        the framing of the private sockets between those processes;
* ``outcome``     how a child's exit becomes a terminal row (status, exit fields, error with a fingerprint);
* ``control``     the unix control socket (``scrinalia-runner status``);
* ``status``      the status snapshot and its rendering;
* ``oneshot``     ``run_once`` and ``scrinalia-runner run``;
* ``guard``       the import hook that keeps torch out of the supervisor;
* ``database``    the supervisor's engine (bounded statements), the schema check, the registration;
* ``sdnotify``, ``devices`` (NVML), ``procinfo`` (/proc, cgroup), ``options``, ``cli``.
"""
