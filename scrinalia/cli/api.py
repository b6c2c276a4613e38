"""``scrinalia api``: serve the API (and the panel's static files) with uvicorn."""
from __future__ import annotations

from typing import Any

import click


@click.command("api")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(1, 65535))
@click.option("--workers", default=1, show_default=True, type=click.IntRange(1, 64),
              help="Processes; the API is stateless across them")
@click.option("--log-level", default="info", show_default=True,
              type=click.Choice(["critical", "error", "warning", "info", "debug"]))
@click.option("--reload", is_flag=True, help="Restart on code changes (development)")
def command(host: str, port: int, workers: int, log_level: str, reload: bool) -> None:
    """Run the API: uvicorn --factory scrinalia.api.app:create_app.

    Refuses to start on a schema that is not its bundled head: exit 4 when it is behind (migrate first),
    7 when a newer release migrated it (upgrade this API).

    Forwarded headers are believed only from API_TRUSTED_PROXIES (the app decides; uvicorn's own proxy
    handling, which trusts 127.0.0.1 by default, is off)."""
    import uvicorn
    from sqlalchemy import NullPool

    from scrinalia.api.settings import load_api_settings
    from scrinalia.cli.schema import require_head_or_exit
    from scrinalia.db.engine import app_engine
    from scrinalia.settings import get_settings

    settings = get_settings()
    settings.require_database_url()  # fail now, with a clear message, not in every worker
    load_api_settings()
    engine = app_engine(settings, application_name="scrinalia-api", poolclass=NullPool)
    try:
        require_head_or_exit(engine, "API")  # exit 4 (migrate first) or 7 (upgrade this API)
    finally:
        engine.dispose()
    if not reload:
        from scrinalia.sdnotify import ready_when_healthy

        probe_host = "127.0.0.1" if host in ("0.0.0.0", "") else ("[::1]" if host == "::" else host)
        ready_when_healthy(f"http://{probe_host}:{port}/healthz",
                           f"answering on {host}:{port}, {workers} worker process(es)")
    from uvicorn.config import LOGGING_CONFIG

    from scrinalia.journal import uvicorn_log_config

    journal_config = uvicorn_log_config(log_level)  # under systemd: the journal, with priorities
    log_config: dict[str, Any] = LOGGING_CONFIG if journal_config is None else journal_config
    uvicorn.run(
        "scrinalia.api.app:create_app",
        factory=True,
        host=host,
        port=port,
        workers=None if reload else workers,
        reload=reload,
        proxy_headers=False,
        log_level=log_level,
        server_header=False,
        log_config=log_config,
    )
