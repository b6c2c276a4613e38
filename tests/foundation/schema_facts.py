"""What code written for one schema relies on, read off a migrated database as comparable facts.

Expand/contract (decision 0125): a release's migrations only add, so everything the previous release
reads or writes is still there at the new head. ``schema_facts`` lists what such code can depend on, as
short strings ("column auth_users.locked_until timestamp with time zone", "nullable auth_users.locked_until",
"enum user_role VIEWER", ...); ``removed`` says which facts of an older snapshot a newer one lost, with the
CHECK constraints compared by meaning (a wider IN-list accepts every row the narrower one did).

Not facts: plain (non-unique) indexes (a dropped one costs time, never a statement), function bodies
(the signature is what a caller names) and triggers (their effect on old writes is proven by running
the previous release: tests/foundation/test_previous_release.py).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from sqlalchemy import Connection, text

_COLUMNS = text(
    """SELECT c.relname, a.attname, format_type(a.atttypid, a.atttypmod), NOT a.attnotnull,
              (a.atthasdef OR a.attidentity <> '' OR a.attgenerated <> '') AS has_default
         FROM pg_catalog.pg_attribute a
         JOIN pg_catalog.pg_class c ON c.oid = a.attrelid
         JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p') AND a.attnum > 0 AND NOT a.attisdropped
          AND c.relname <> 'alembic_version'"""
)
_ENUMS = text(
    """SELECT t.typname, e.enumlabel FROM pg_catalog.pg_enum e
         JOIN pg_catalog.pg_type t ON t.oid = e.enumtypid
         JOIN pg_catalog.pg_namespace n ON n.oid = t.typnamespace WHERE n.nspname = current_schema()"""
)
_FUNCTIONS = text(
    """SELECT p.proname || '(' || pg_catalog.pg_get_function_identity_arguments(p.oid) || ')'
         FROM pg_catalog.pg_proc p JOIN pg_catalog.pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname = current_schema()"""
)
_UNIQUE = text(
    """SELECT c.relname, i.relname, regexp_replace(pg_catalog.pg_get_indexdef(x.indexrelid), ' ON \\S+\\.', ' ON ')
         FROM pg_catalog.pg_index x
         JOIN pg_catalog.pg_class i ON i.oid = x.indexrelid
         JOIN pg_catalog.pg_class c ON c.oid = x.indrelid
         JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = current_schema() AND x.indisunique AND c.relname <> 'alembic_version'"""
)
_CHECKS = text(
    """SELECT c.relname, k.conname, pg_catalog.pg_get_constraintdef(k.oid)
         FROM pg_catalog.pg_constraint k
         JOIN pg_catalog.pg_class c ON c.oid = k.conrelid
         JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = current_schema() AND k.contype = 'c'"""
)
# A table whose rows every role sees as before: no row security, or a permissive policy for PUBLIC that
# lets every row through for every command.
_OPEN_ROWS = text(
    """SELECT c.relname FROM pg_catalog.pg_class c
         JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p') AND c.relname <> 'alembic_version'
          AND (NOT c.relrowsecurity OR EXISTS (
               SELECT 1 FROM pg_catalog.pg_policies p
                WHERE p.schemaname = n.nspname AND p.tablename = c.relname AND p.permissive = 'PERMISSIVE'
                  AND p.cmd = 'ALL' AND p.roles = '{public}' AND p.qual = 'true' AND p.with_check = 'true'))"""
)

# pg_get_constraintdef of an IN-list: CHECK ((col = ANY (ARRAY['a'::text, 'b'::text])))
_IN_LIST = re.compile(r"^CHECK \(\((\w+) = ANY \(\(?ARRAY\[(.*)\]\)?(?:::\w+(?:\[\])?)?\)\)\)$")
_LABEL = re.compile(r"'((?:[^']|'')*)'")


@dataclass(frozen=True)
class Snapshot:
    facts: frozenset[str]
    checks: dict[str, str]  # "table.constraint" -> definition
    tables: frozenset[str]
    columns_without_default: frozenset[str]  # "table.column": NOT NULL and no default (an INSERT must name it)


def schema_facts(conn: Connection) -> Snapshot:
    facts: set[str] = set()
    tables: set[str] = set()
    required: set[str] = set()
    for table, column, type_, nullable, has_default in conn.execute(_COLUMNS):
        tables.add(table)
        facts.add(f"table {table}")
        facts.add(f"column {table}.{column} {type_}")
        if nullable:
            facts.add(f"nullable {table}.{column}")
        if has_default:
            facts.add(f"default {table}.{column}")
        if not nullable and not has_default:
            required.add(f"{table}.{column}")
    facts.update(f"enum {t} {label}" for t, label in conn.execute(_ENUMS))
    facts.update(f"function {signature}" for (signature,) in conn.execute(_FUNCTIONS))
    facts.update(f"unique {t}.{name}: {definition}" for t, name, definition in conn.execute(_UNIQUE))
    facts.update(f"every role sees every row of {t}" for (t,) in conn.execute(_OPEN_ROWS))
    checks = {f"{t}.{name}": definition for t, name, definition in conn.execute(_CHECKS)}
    return Snapshot(frozenset(facts), checks, frozenset(tables), frozenset(required))


def _in_list(definition: str) -> tuple[str, frozenset[str]] | None:
    match = _IN_LIST.match(definition)
    if match is None:
        return None
    return match.group(1), frozenset(_LABEL.findall(match.group(2)))


def check_accepts_as_much(old: str, new: str) -> bool:
    """Whether the CHECK ``new`` accepts every row ``old`` did, as far as this can be told: the same
    definition, or IN-lists over the same column where the new one holds every old value."""
    if old == new:
        return True
    old_list, new_list = _in_list(old), _in_list(new)
    return (old_list is not None and new_list is not None and old_list[0] == new_list[0]
            and old_list[1] <= new_list[1])


def removed(before: Snapshot, after: Snapshot) -> set[str]:
    """What code written against ``before`` may rely on that ``after`` no longer has."""
    lost = set(before.facts - after.facts)
    for name, definition in before.checks.items():
        if name in after.checks and not check_accepts_as_much(definition, after.checks[name]):
            lost.add(f"check {name} accepts {definition}")
    for name, definition in after.checks.items():
        if name not in before.checks and name.split(".", 1)[0] in before.tables:
            lost.add(f"check {name} is new on an existing table: {definition}")
    for column in after.columns_without_default - before.columns_without_default:
        if column.split(".", 1)[0] in before.tables:
            lost.add(f"an INSERT that does not name {column} (NOT NULL, no default)")
    return lost
