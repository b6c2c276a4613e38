"""``scrinalia archive``: import descriptions, load the demo collection, look at the workers' queues."""
from __future__ import annotations

import sys
from pathlib import Path

import click

from scrinalia.db.engine import app_engine
from scrinalia.settings import get_settings


def _engine():
    return app_engine(get_settings(), application_name="scrinalia-cli")


@click.group("archive")
def command() -> None:
    """The archive: import descriptions, the demo collection, the workers' queues."""


@command.command("import")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--format", "fmt", type=click.Choice(["jsonl", "csv"]), default=None,
              help="Default: from the file's extension (.jsonl/.ndjson or .csv).")
@click.option("--on-conflict", type=click.Choice(["error", "skip", "update"]), default="error", show_default=True,
              help="What to do with a reference code already in the archive.")
def import_command(file: Path, fmt: str | None, on_conflict: str) -> None:
    """Import FILE (JSONL or CSV). Every bad line is reported with its number; nothing is half-imported."""
    from scrinalia.domains.archive.importer import ImportFailed, import_file

    engine = _engine()
    try:
        report = import_file(engine, file, fmt=fmt, on_conflict=on_conflict)
    except ImportFailed as exc:
        for error in exc.errors:
            click.echo(f"{file.name}:{error.line}: {error.message}", err=True)
        click.echo(f"{len(exc.errors)} error(s): nothing was imported", err=True)
        sys.exit(1)
    except (ValueError, UnicodeDecodeError) as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    finally:
        engine.dispose()
    click.echo(f"imported {report.inserted} new, updated {report.updated}, skipped {report.skipped} "
               f"(from {file.name})")


@command.command("demo")
def demo_command() -> None:
    """Load the demo collection shipped with the package (idempotent)."""
    from scrinalia.domains.archive.demo import load_demo_collection

    engine = _engine()
    try:
        click.echo(f"demo collection: {load_demo_collection(engine)} new documents")
    finally:
        engine.dispose()


@command.command("queues")
@click.option("--check", is_flag=True,
              help="Also compare the counts the panel reads (archive_stamp_counts) with these; exit 1 if they differ.")
@click.option("--repair", is_flag=True, help="Rebuild archive_stamp_counts from the documents first (implies --check).")
def queues_command(check: bool, repair: bool) -> None:
    """Pending, processed and failed units per worker (the same condition as the execution), counted
    from the documents."""
    from scrinalia.domains.archive.workers import stamp_summary
    from scrinalia.domains.archive.workers.plugins import load_catalogue
    from scrinalia.domains.archive.workers.stamps import catalogue_counts

    engine = _engine()
    try:
        catalogue = load_catalogue()
        if repair:
            groups = stamp_summary.recompute(engine)
            click.echo(f"archive_stamp_counts rebuilt from the documents ({groups} groups)")
        for name, counts in catalogue_counts(engine, catalogue).items():
            if counts is None:
                click.echo(f"{name:20s} (no queue)")
            else:
                click.echo(f"{name:20s} pending {counts['pending']:>8}  processed {counts['processed']:>8}  "
                           f"failed {counts['failed']:>6}")
        if check or repair:
            differ = stamp_summary.differences(engine, catalogue)
            for name, (served, live) in differ.items():
                click.echo(f"{name}: the panel's counts {served} differ from the documents' {live} "
                           "(scrinalia archive queues --repair rebuilds them)", err=True)
            if differ:
                raise SystemExit(1)
            click.echo("the panel's counts (archive_stamp_counts) equal these")
    finally:
        engine.dispose()


@command.command("reset-stamps")
@click.argument("stamp_key")
@click.confirmation_option(prompt="Forget this stamp on every document (its worker will redo them all)?")
def reset_stamps_command(stamp_key: str) -> None:
    """Forget STAMP_KEY (a worker's stamp key) on every document, so the worker redoes the whole archive."""
    from scrinalia.domains.archive.workers.stamps import reset_stamps

    engine = _engine()
    try:
        click.echo(f"{reset_stamps(engine, stamp_key)} documents will be processed again by {stamp_key}")
    finally:
        engine.dispose()
