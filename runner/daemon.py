"""How ``scrinalia-runner daemon`` starts: its options, its catalogue, its database, its control socket,
its devices, then the supervisor (``runner.cli.run_daemon`` calls these in order; each refusal is the
daemon's exit code, docs/operations.md "Runner")."""
from __future__ import annotations

import logging
from typing import Any

import click

from runner import options as opts
from runner.options import OptionsError, RunnerOptions

log = logging.getLogger("scrinalia.runner")


def daemon_options_from(*, name, capabilities, concurrency, devices, per_device, heartbeat, lease, poll,
                           drain_timeout, max_runtime, cancel_grace, kill_grace, preload, start_method,
                           socket_path, listen, listen_poll,
                           stall_timeout=opts.DEFAULT_STALL_TIMEOUT, warm_models="auto",
                           warm_limit_mb=opts.DEFAULT_WARM_LIMIT_MB, standby=True) -> RunnerOptions:
    from runner.wakeup import listen_default

    try:
        return RunnerOptions(
            name=name,
            capabilities=opts.parse_list(capabilities) or None,
            concurrency=concurrency,
            devices=devices,
            per_device=per_device,
            heartbeat_seconds=heartbeat,
            lease_seconds=lease,
            poll_seconds=poll,
            listen=listen_default() if listen is None else listen,
            listen_poll_seconds=listen_poll,
            drain_timeout=drain_timeout,
            max_runtime=max_runtime,
            cancel_grace=cancel_grace,
            kill_grace=kill_grace,
            stall_timeout=stall_timeout,
            preload=opts.parse_list(preload),
            start_method=start_method,
            socket_path=socket_path or opts.default_socket_path(name),
            warm_models=warm_models,
            warm_limit_mb=warm_limit_mb,
            standby=standby,
        ).validate()
    except OptionsError as exc:
        raise click.UsageError(str(exc)) from None


def daemon_catalogue(options: RunnerOptions) -> tuple[Any, list[str]]:
    """The catalogue (the supervisor resolves with it) and the workers this daemon claims."""
    from scrinalia.domains.archive.workers.plugins import PluginError, load_catalogue

    try:
        catalogue = load_catalogue()
    except (PluginError, ImportError) as exc:
        opts.exit_with(1, f"the worker catalogue cannot be loaded: {exc}")
    if options.capabilities is None:
        capabilities = sorted(catalogue)
    else:
        unknown = [c for c in options.capabilities if c not in catalogue]
        if unknown:
            raise click.UsageError(
                f"--capabilities names workers that are not in the catalogue: {', '.join(unknown)} "
                f"(known: {', '.join(sorted(catalogue)) or 'none'})"
            )
        capabilities = list(options.capabilities)
    if not capabilities:
        opts.exit_with(opts.EXIT_USAGE, "no worker to claim: the catalogue is empty and --capabilities is not set")
    return catalogue, capabilities


def daemon_engine(url: Any, options: RunnerOptions, settings: Any) -> tuple[Any, str | None, int]:
    """The supervisor's engine and the schema's revision, checked against the bundled head; (None, None,
    exit code) when the schema is behind or ahead of this runner, or the database does not answer."""
    from sqlalchemy.exc import SQLAlchemyError

    from runner.database import SchemaMismatch, check_schema, parent_engine
    from scrinalia.db.errors import database_problem

    engine = parent_engine(url, options, settings)
    try:
        return engine, check_schema(engine), 0
    except SchemaMismatch as exc:  # behind: exit 4 (migrate first); ahead: exit 7 (upgrade this runner)
        log.error("%s", exc)
        code = exc.exit_code
    except SQLAlchemyError as exc:
        log.error("%s", database_problem(exc))
        code = opts.EXIT_DATABASE
    engine.dispose()
    return None, None, code


def daemon_control(options: RunnerOptions) -> tuple[Any, int]:
    """The control socket, open; (None, exit code) when another runner holds it or it is unsafe."""
    from runner.control import ControlServer, ControlSocketBusy, ControlSocketUnsafe

    assert options.socket_path is not None  # --socket, or the default path (daemon_options_from)
    control = ControlServer(options.socket_path)
    try:
        control.open()
        return control, 0
    except ControlSocketBusy as exc:
        log.error("%s", exc)
        return None, opts.EXIT_ALREADY_RUNNING
    except ControlSocketUnsafe as exc:
        log.error("control socket: %s", exc)
        return None, opts.EXIT_USAGE


def _daemon_devices(options: RunnerOptions, catalogue: Any, capabilities: list[str], gpu: Any) -> tuple[Any, Any]:
    """The device planner over the GPUs this runner owns, and what NVML lists (a usage error when
    --devices names what is not there)."""
    from runner.devices import DeviceError, DevicePlanner, inventory, needs_of, parse_devices

    nvml_devices = gpu.devices()
    try:
        owned = inventory(parse_devices(options.devices), nvml_devices)
    except DeviceError as exc:
        raise click.UsageError(str(exc)) from None
    planner = DevicePlanner(owned, options.per_device, needs_of({c: catalogue[c] for c in capabilities}),
                            free_memory=gpu.free_memory)
    _log_devices(options, planner, nvml_devices)
    return planner, nvml_devices


def serve_daemon(options: RunnerOptions, settings: Any, url: Any, database: tuple[Any, str | None], control: Any,
                  catalogue: Any, capabilities: list[str]) -> int:
    """Build the supervisor over what is open (the engine, the control socket), serve until it stops."""
    from sqlalchemy.exc import SQLAlchemyError

    from runner.database import child_connect_args, registration
    from runner.devices import GpuProbe
    from runner.forkserver import ForkServerError, ForkServerLauncher
    from runner.launchers import SpawnLauncher
    from runner.loop_state import ChildSetup, Services
    from runner.sdnotify import Notifier
    from runner.supervisor import Supervisor
    from scrinalia.db.errors import database_problem
    from scrinalia.domains.archive.model_dirs import seen_model_dirs

    engine, revision = database
    gpu = GpuProbe()
    try:
        planner, nvml_devices = _daemon_devices(options, catalogue, capabilities, gpu)
    except click.UsageError:
        gpu.close()
        control.close()
        engine.dispose()
        raise
    if options.start_method == "forkserver":
        from runner.warm_models import warm_start

        launcher: Any = ForkServerLauncher(options.preload, title=f"scrinalia-runner: fork server {options.name}",
                                           warm=warm_start(options, catalogue, capabilities),
                                           # --warm-models none: nothing warm, not even after a cold load
                                           warm_limit=0 if options.warm_models.strip() == "none"
                                           else options.warm_limit_mb << 20, standby=options.standby)
    else:
        launcher = SpawnLauncher(preload=options.preload)
    sup = Supervisor(
        options,
        registration(options, capabilities, kind="daemon", schema_revision=revision,
                     devices=planner.registry_devices(nvml_devices),
                     sees=seen_model_dirs(catalogue, capabilities, engine)),
        launcher,
        ChildSetup(url.render(), child_connect_args(settings, options), catalogue, engine),
        services=Services(notifier=Notifier(), gpu=gpu, devices=planner, control=control,
                          wakeup=_wakeup(options, engine, capabilities, settings)),
    )
    try:
        sup.open()
        code = sup.serve()
        log.info("stopped (runner %s)", sup.runner_id)
        return code
    except ForkServerError as exc:
        log.error("%s", exc)
        return 1
    except SQLAlchemyError as exc:
        log.error("%s", database_problem(exc))
        return opts.EXIT_DATABASE
    finally:
        sup.close()
        engine.dispose()


def _wakeup(options: RunnerOptions, engine: Any, capabilities: list[str], settings: Any) -> Any:
    """The LISTEN connection of pick-up on notification, or None with --no-listen."""
    if not options.listen:
        log.info("not listening for notifications (--no-listen): claiming every %gs", options.poll_seconds)
        return None
    from runner.wakeup import Wakeup
    from scrinalia.db.engine import connect_args_for

    direct = settings.runner_session_url() if settings is not None else None
    args = connect_args_for(settings, "scrinalia-runner-listen", direct.url if direct is not None else None)
    if direct is not None:
        log.info("listening for notifications on RUNNER_DATABASE_SESSION_URL / DATABASE_SESSION_URL (%s)", direct)
    return Wakeup.for_engine(engine, capabilities, url=direct.url if direct is not None else None, **args)


def _log_devices(options: RunnerOptions, planner: Any, nvml_devices: list[dict[str, Any]]) -> None:
    """Say at start which GPUs the children get, and what cannot work with them."""
    if not planner.devices:
        why = ("--devices none" if options.devices == "none"
               else "NVML lists no GPU (no driver, no device, or nvidia-ml-py missing)")
        log.info("devices: none (%s): every child runs with CUDA_VISIBLE_DEVICES='' (GPU workers on CPU)", why)
        return
    log.info("devices: %s, %d child(ren) per device (%d device slots, --concurrency %d)%s",
             ", ".join(d.key for d in planner.devices), planner.per_device, planner.slots, options.concurrency,
             "" if nvml_devices else "; NVML does not answer: no memory rule, the slots alone decide")
    for worker in planner.unfit_workers():
        log.warning("worker %s declares %d bytes of GPU memory, more than any device of this runner has: "
                    "it is never claimed here", worker, planner.need(worker).memory_bytes)
