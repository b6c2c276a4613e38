"""Persisted worker settings (``archive_worker_settings``) and their revisions.

A PUT replaces the worker's settings and a DELETE removes them (the worker falls back to its signature
defaults); each writes one revision row with the snapshot (None for a DELETE), in the same transaction,
serialised per worker by a transaction-scoped advisory lock so revision numbers never collide.
The resolver reads ``get_settings``: explicit request > persisted settings > signature default.
"""
from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Engine, text

from scrinalia.db.engine import one_statement
from scrinalia.domains.archive.queries import QUERIES

SETTING_KEYS = ("engine_name", "preset", "db_batch_size", "options", "engine_options")


class SettingsRevisionConflict(Exception):
    def __init__(self, worker_name: str, expected: int | None, actual: int | None) -> None:
        super().__init__(f"settings of {worker_name!r} are at revision {actual}, not {expected}")
        self.worker_name = worker_name
        self.expected = expected
        self.actual = actual


def _row_json(row: Any) -> dict[str, Any]:
    m = dict(row._mapping)
    for key, value in m.items():
        if isinstance(value, datetime):
            m[key] = value.isoformat()
    return m


_COLUMNS = "worker_name, engine_name, preset, db_batch_size, options, engine_options, revision, updated_at, updated_by"


def _settings_rows(engine_or_conn: Engine | Connection, where: str = "", **params: Any) -> list[Any]:
    stmt = text(f"SELECT {_COLUMNS} FROM archive_worker_settings {where}")
    if isinstance(engine_or_conn, Engine):
        with one_statement(engine_or_conn) as conn:
            return list(conn.execute(stmt, params).all())
    return list(engine_or_conn.execute(stmt, params).all())


_GET_SETTINGS = QUERIES["worker_settings"].text(settings_columns=_COLUMNS)


def get_settings(engine_or_conn: Engine | Connection, worker_name: str) -> dict[str, Any] | None:
    """The worker's persisted row (the named query ``worker_settings``), or None."""
    if isinstance(engine_or_conn, Engine):
        with one_statement(engine_or_conn) as conn:
            row = conn.execute(_GET_SETTINGS, {"w": worker_name}).one_or_none()
    else:
        row = engine_or_conn.execute(_GET_SETTINGS, {"w": worker_name}).one_or_none()
    return _row_json(row) if row is not None else None


def all_settings(engine_or_conn: Engine | Connection) -> dict[str, dict[str, Any]]:
    return {r.worker_name: _row_json(r) for r in _settings_rows(engine_or_conn)}


def _lock_and_current(conn: Connection, worker_name: str) -> tuple[int | None, int]:
    conn.execute(text("SELECT pg_advisory_xact_lock(hashtext('archive_worker_settings'), hashtext(:w))"),
                 {"w": worker_name})
    current = conn.execute(
        text("SELECT revision FROM archive_worker_settings WHERE worker_name = :w"), {"w": worker_name}
    ).scalar()
    last = conn.execute(
        text("SELECT COALESCE(max(revision), 0) FROM archive_worker_setting_revisions WHERE worker_name = :w"),
        {"w": worker_name},
    ).scalar_one()
    return current, int(last)


def put_settings(
    engine: Engine,
    worker_name: str,
    values: Mapping[str, Any],
    *,
    changed_by: str | None,
    expected_revision: int | None = None,
) -> dict[str, Any]:
    """Replace the worker's settings (already validated by the catalogue); returns the stored row."""
    clean = {k: values.get(k) for k in SETTING_KEYS}
    clean["options"] = dict(clean.get("options") or {})
    clean["engine_options"] = dict(clean.get("engine_options") or {})
    with engine.begin() as conn:
        current, last = _lock_and_current(conn, worker_name)
        if expected_revision is not None and expected_revision != (current or 0):
            raise SettingsRevisionConflict(worker_name, expected_revision, current)
        revision = last + 1
        row = conn.execute(
            text(
                f"""INSERT INTO archive_worker_settings
                        (worker_name, engine_name, preset, db_batch_size, options, engine_options,
                         revision, updated_at, updated_by)
                    VALUES (:w, :engine_name, :preset, :db_batch_size, CAST(:options AS jsonb),
                            CAST(:engine_options AS jsonb), :rev, now(), :by)
                    ON CONFLICT (worker_name) DO UPDATE SET
                        engine_name = EXCLUDED.engine_name, preset = EXCLUDED.preset,
                        db_batch_size = EXCLUDED.db_batch_size, options = EXCLUDED.options,
                        engine_options = EXCLUDED.engine_options, revision = EXCLUDED.revision,
                        updated_at = now(), updated_by = EXCLUDED.updated_by
                    RETURNING {_COLUMNS}"""
            ),
            {"w": worker_name, **clean, "options": json.dumps(clean["options"]),
             "engine_options": json.dumps(clean["engine_options"]), "rev": revision, "by": changed_by},
        ).one()
        conn.execute(
            text(
                """INSERT INTO archive_worker_setting_revisions (worker_name, revision, action, settings, changed_by)
                   VALUES (:w, :rev, 'PUT', CAST(:settings AS jsonb), :by)"""
            ),
            {"w": worker_name, "rev": revision, "settings": json.dumps(clean), "by": changed_by},
        )
    return _row_json(row)


def delete_settings(
    engine: Engine, worker_name: str, *, changed_by: str | None, expected_revision: int | None = None
) -> int | None:
    """Remove the worker's settings; returns the DELETE revision, or None when nothing was persisted."""
    with engine.begin() as conn:
        current, last = _lock_and_current(conn, worker_name)
        if current is None:
            return None
        if expected_revision is not None and expected_revision != current:
            raise SettingsRevisionConflict(worker_name, expected_revision, current)
        revision = last + 1
        conn.execute(text("DELETE FROM archive_worker_settings WHERE worker_name = :w"), {"w": worker_name})
        conn.execute(
            text(
                """INSERT INTO archive_worker_setting_revisions (worker_name, revision, action, settings, changed_by)
                   VALUES (:w, :rev, 'DELETE', NULL, :by)"""
            ),
            {"w": worker_name, "rev": revision, "by": changed_by},
        )
    return revision


def list_revisions(engine: Engine, worker_name: str, *, limit: int = 100) -> list[dict[str, Any]]:
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                """SELECT revision, action, settings, changed_at, changed_by
                     FROM archive_worker_setting_revisions WHERE worker_name = :w
                    ORDER BY revision DESC LIMIT :limit"""
            ),
            {"w": worker_name, "limit": limit},
        ).all()
    return [_row_json(r) for r in rows]
