"""The ADR's entry point for the runner daemon: ``python -m scrinalia.domains.archive.workers.runner_daemon``.

It takes the same flags as ``scrinalia-runner daemon`` (``--name``, ``--capabilities``, ``--concurrency``,
``--heartbeat``, ``--lease``, ``--poll``, ``--drain-timeout``, ``--max-runtime``, ``--preload``, ...) and
runs the same supervisor (``runner.supervisor``). The import of ``runner`` is deferred to ``main`` so
that importing the catalogue package never pulls in the runner.
"""
from __future__ import annotations


def main(argv: list[str] | None = None) -> None:
    from runner.cli import daemon_command

    daemon_command.main(
        args=argv, prog_name="python -m scrinalia.domains.archive.workers.runner_daemon", standalone_mode=True
    )


if __name__ == "__main__":
    main()
