"""The GPU host's process model: a supervisor parent, one child process per claimed run.

Modules, one per concept:

* ``supervisor``  the arbiter: one loop, a table of children, the registry row, the claim loop and the
                  batched heartbeat; the only writer of lifecycle rows (never imports torch);
* ``child``       the child entry point shared by the daemon and the one-shot CLI;
* ``forkserver``  a preloaded (torch, transformers, the catalogue; never CUDA) process that forks children;
* ``spawn``       the plain-spawn launcher (a fresh interpreter per child), used by the one-shot CLI;
* ``wire``        the framing of the private sockets between those processes;
* ``outcome``     how a child's exit becomes a terminal row (status, exit fields, error with a fingerprint);
* ``control``     the unix control socket (``scrinalia-runner status``);
* ``status``      the status snapshot and its rendering;
* ``oneshot``     ``run_once`` and ``scrinalia-runner run``;
* ``sdnotify``, ``devices`` (NVML), ``procinfo`` (/proc, cgroup), ``options``, ``schema``, ``cli``.
"""
