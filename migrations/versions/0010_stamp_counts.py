"""The worker queues' counts kept by the statements that change them: ``archive_stamp_counts``.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01

``GET /system/workers`` answers pending / processed / failed per document worker. Counted live, that is
five partial-index counts, the eligible totals and the failed counts on every request (~30 ms of the
route's ~45 ms on 100k documents, docs/benchmarks.md). Here every statement that inserts, updates,
deletes or truncates ``archive_documents`` records what it changed in the counts, in the same
transaction, so the route reads a few rows and the answer stays exact (issue 14, decision 0075).

What a document contributes, per stamp key, is one group ``(stamp_key, governed, stale, failed,
ruleset)``:

* ``governed``: ``status <> 'HUMAN_APPROVED'`` (the governed queues count only these);
* ``stale``: the key's recorded stamp differs from the stamp the row would get now (for the four
  fixed-expression queues: the condition of ``ix_documents_pending_<key>`` without its governed part;
  for ``cleaning``: the text arm, ``cleaning_text_stamp`` differs from the text's stamp);
* ``failed``: the key's stamp is ERROR (for ``cleaning``: one of its rules' stamps is);
* ``ruleset``: ``cleaning`` only, the rule set the document was cleaned with ('' when never cleaned).
  The cleaning queue's pending count is the stale groups plus the groups whose rule set is not the
  current one (``archive_cleaning_ruleset()``, read with the counts), so a rule change needs no rewrite
  of the counts.

The conditions are written here, in SQL, as the workers' ``StampQueue``s define them in
``scrinalia/domains/archive/workers/stamps.py`` (``stamp_summary.SUMMARISED`` lists the queues they are
for; a queue of the catalogue that is not one of them is counted live, and a test compares the two).

Writers never wait for each other on the counts (decision 0075): a statement only INSERTs its net
change as new rows (one per group that changed, ``n`` signed); nothing updates a shared counter row, so
two transactions that write documents at the same time, however long, neither block nor deadlock on
the summary. The rows are folded (each group's rows replaced by their sum) now and then by a writer
that holds a transaction-scoped advisory lock, taken with ``pg_try_advisory_xact_lock`` so a writer
never waits for it either; a reader sums every visible row (a few dozen rows). The trigger functions are
SECURITY DEFINER with a pinned ``search_path``: the runner's role writes documents (its workers' stamps)
and so fires them, without any privilege on the summary itself.

``archive_stamp_counts_recompute()`` rebuilds the summary from the documents (here, and for a repair);
it blocks document writes while it runs (``SHARE`` lock).
"""
from collections.abc import Callable
from dataclasses import dataclass

from alembic import op
from sqlalchemy import text

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

#: Fold the rows once the table's identity crosses a multiple of this (about every FOLD_EVERY rows).
FOLD_EVERY = 64

TABLE = """
CREATE TABLE archive_stamp_counts (
    id BIGINT GENERATED ALWAYS AS IDENTITY,
    stamp_key TEXT NOT NULL,
    governed BOOLEAN NOT NULL,
    stale BOOLEAN NOT NULL,
    failed BOOLEAN NOT NULL,
    ruleset TEXT DEFAULT '' NOT NULL,
    n BIGINT NOT NULL,
    PRIMARY KEY (id)
);
-- The reads are sums over a few dozen rows (a sequential scan whatever the statistics say), and every
-- document write inserts rows: by the default threshold autovacuum would re-analyse it every ~50 writes.
ALTER TABLE archive_stamp_counts SET (autovacuum_analyze_threshold = 100000);
"""

@dataclass(frozen=True)
class StampKey:
    """One stamp key's state as SQL over a document ``{a}`` (``{s}``: the schema of the stamp functions).

    ``stale`` is computed lazily: a document without a recorded stamp is stale whatever its data (every
    stamp function returns a value), so an import computes no stamp at all."""

    name: str
    recorded: str  # the stamp the document records (NULL: never processed)
    stamp: str     # the stamp its data would get now
    inputs: str    # what ``stamp`` reads: equal inputs, equal stamps
    entry: str     # the key's whole record (stamp, status, run, rule set): equal entries, equal recorded state
    failed: str
    ruleset: str = "''"

    def sql(self, part: str, a: str, s: str) -> str:
        return getattr(self, part).format(a=a, s=s)

    def stale(self, a: str, s: str) -> str:
        rec = self.sql("recorded", a, s)
        return f"CASE WHEN {rec} IS NULL THEN true ELSE {rec} IS DISTINCT FROM {self.sql('stamp', a, s)} END"


_FIELDS = "{a}.title, {a}.scope_and_content, {a}.admin_biographical_history, {a}.provenance"
_TEXT_STAMP = "{s}.archive_text_stamp(" + _FIELDS + ")"


def _fixed(name: str, stamp: str, inputs: str) -> StampKey:
    return StampKey(name, recorded=f"({{a}}.execution_log #>> '{{{{{name},stamp}}}}')", stamp=stamp, inputs=inputs,
                    entry=f"({{a}}.execution_log -> '{name}')",
                    failed=f"(({{a}}.execution_log #>> '{{{{{name},status}}}}') IS NOT DISTINCT FROM 'ERROR')")


# The queues' conditions (stamps.py's StampQueue, stamp_summary.SUMMARISED), without their governed part.
KEYS = (
    _fixed("embedding", _TEXT_STAMP, "ROW(" + _FIELDS + ")"),
    _fixed("ner", _TEXT_STAMP, "ROW(" + _FIELDS + ")"),
    _fixed("typology", "md5({a}.title)", "{a}.title"),
    _fixed("quality-validator",
           "{s}.archive_quality_stamp(" + _FIELDS + ", {a}.date_text, {a}.date_start, {a}.date_end, {a}.execution_log)",
           "ROW(" + _FIELDS + ", {a}.date_text, {a}.date_start, {a}.date_end, {a}.execution_log #>> '{{ner,run_id}}', "
           "{a}.execution_log #>> '{{typology,run_id}}')"),
    StampKey("cleaning", recorded="{a}.cleaning_text_stamp",
             stamp="{s}.archive_cleaning_text_stamp(" + _FIELDS + ")", inputs="ROW(" + _FIELDS + ")",
             entry="ROW({a}.execution_log -> 'cleaning', {a}.cleaning_text_stamp, {a}.cleaning_ruleset)",
             failed="jsonb_path_exists({a}.execution_log, '$.cleaning.*.status ? (@ == \"ERROR\")')",
             ruleset="coalesce({a}.cleaning_ruleset, '')"),
)

GOVERNED = "({a}.status <> 'HUMAN_APPROVED')"
GROUP = "stamp_key, governed, stale, failed, ruleset"


def _contributions(rows: str, sign: int, s: str) -> str:
    """Each document of ``rows`` (alias d) as one row per stamp key, ``n`` = ``sign``."""
    values = ",\n    ".join(f"('{k.name}', {k.stale('d', s)}, {k.sql('failed', 'd', s)}, {k.sql('ruleset', 'd', s)})"
                           for k in KEYS)
    return (f"SELECT v.stamp_key, {GOVERNED.format(a='d')} AS governed, v.stale, v.failed, v.ruleset, {sign} AS n "
            f"FROM {rows} AS d CROSS JOIN LATERAL (VALUES\n    {values}) AS v(stamp_key, stale, failed, ruleset)")


def _by_key(s: str, sql: Callable[[StampKey], str]) -> str:
    """``sql(key)`` of the stamp key of the current row of ``k`` (a CASE: only that key's is evaluated)."""
    return "CASE k.stamp_key " + " ".join(f"WHEN '{key.name}' THEN {sql(key)}" for key in KEYS) + " END"


def _update_changes(s: str) -> str:
    """The net change of an UPDATE, as one small query: the statements of a trigger with transition
    tables are planned on every call, and this one plans in about a millisecond (a UNION of one branch
    per key took ~10: its planning, not its execution, was what a one-document UPDATE paid).

    The old and new rows are paired by id (a FULL JOIN: a row whose id was set to DEFAULT has no
    partner and counts whole), then per pair only the stamp keys whose state may differ (governed, the
    key's record, or its stamp's inputs changed: the others would cancel out), each as -1 old state +1
    new state. The new row's stamp is computed once (``sn``, fenced by OFFSET 0) and reused for the old
    row when the inputs are equal: a worker's batch computes one stamp per document, for the key it
    wrote (and for quality-validator when ner or typology wrote theirs)."""
    def pair(key: StampKey, part: str) -> tuple[str, str]:
        return key.sql(part, "o", s), key.sql(part, "n", s)

    def same_inputs(key: StampKey) -> str:
        o, n = pair(key, "inputs")
        return f"{o} IS NOT DISTINCT FROM {n}"

    def changed(key: StampKey) -> str:
        (eo, en) = pair(key, "entry")
        return (f"o.id IS NULL OR n.id IS NULL OR {GOVERNED.format(a='o')} <> {GOVERNED.format(a='n')} "
                f"OR {eo} IS DISTINCT FROM {en} OR NOT ({same_inputs(key)})")

    def row(key: StampKey) -> str:
        (ro, rn), (fo, fn), (so, sn_) = pair(key, "recorded"), pair(key, "failed"), pair(key, "ruleset")
        same = f"n.id IS NOT NULL AND {same_inputs(key)}"
        return f"('{key.name}', {changed(key)}, {same}, {ro}, {rn}, {fo}, {fn}, {so}, {sn_})"

    stamp_o = _by_key(s, lambda k: k.sql("stamp", "o", s))
    stamp_n = _by_key(s, lambda k: k.sql("stamp", "n", s))
    # the new row's stamp, when the new row or (equal inputs) the old row records one
    needed = "n.id IS NOT NULL AND (k.rec_n IS NOT NULL OR (k.same AND k.rec_o IS NOT NULL))"
    stale_o = (f"CASE WHEN k.rec_o IS NULL THEN true WHEN k.same THEN k.rec_o IS DISTINCT FROM sn.stamp "
               f"ELSE k.rec_o IS DISTINCT FROM {stamp_o} END")
    stale_n = "CASE WHEN k.rec_n IS NULL THEN true ELSE k.rec_n IS DISTINCT FROM sn.stamp END"
    keys = ",\n         ".join(row(key) for key in KEYS)
    return f"""
    SELECT k.stamp_key, side.governed, side.stale, side.failed, side.ruleset, side.n
      FROM old_rows AS o FULL JOIN new_rows AS n ON n.id = o.id
     CROSS JOIN LATERAL (VALUES
         {keys}
     ) AS k(stamp_key, changed, same, rec_o, rec_n, failed_o, failed_n, ruleset_o, ruleset_n)
     CROSS JOIN LATERAL (SELECT CASE WHEN {needed} THEN {stamp_n} END AS stamp OFFSET 0) AS sn
     CROSS JOIN LATERAL (VALUES
         (o.id IS NOT NULL, {GOVERNED.format(a='o')}, {stale_o}, k.failed_o, k.ruleset_o, -1),
         (n.id IS NOT NULL, {GOVERNED.format(a='n')}, {stale_n}, k.failed_n, k.ruleset_n, 1)
     ) AS side(present, governed, stale, failed, ruleset, n)
     WHERE k.changed AND side.present"""


def _functions(s: str) -> str:
    states_new = _contributions("new_rows", 1, s)
    states_old = _contributions("old_rows", -1, s)
    insert = f"INSERT INTO {s}.archive_stamp_counts ({GROUP}, n) SELECT {GROUP}, sum(n) FROM ("
    tail = f") AS delta GROUP BY {GROUP} HAVING sum(n) <> 0 ORDER BY {GROUP} RETURNING id"
    return f"""
CREATE FUNCTION {s}.archive_stamp_counts_track() RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, {s}, pg_temp
AS $track$
DECLARE
  last_id bigint;
  added bigint;
BEGIN
  IF TG_OP = 'TRUNCATE' THEN
    DELETE FROM {s}.archive_stamp_counts;
    RETURN NULL;
  ELSIF TG_OP = 'INSERT' THEN
    WITH ins AS ({insert}{states_new}{tail}) SELECT max(id), count(*) INTO last_id, added FROM ins;
  ELSIF TG_OP = 'DELETE' THEN
    WITH ins AS ({insert}{states_old}{tail}) SELECT max(id), count(*) INTO last_id, added FROM ins;
  ELSE
    WITH ins AS ({insert}{_update_changes(s)}{tail})
    SELECT max(id), count(*) INTO last_id, added FROM ins;
  END IF;
  -- Fold about every {FOLD_EVERY} rows: only in READ COMMITTED (its DELETE sees what other folds
  -- committed) and only when no other transaction holds the fold (it never waits for one).
  IF added > 0 AND last_id / {FOLD_EVERY} <> (last_id - added) / {FOLD_EVERY}
     AND current_setting('transaction_isolation') = 'read committed'
     AND pg_try_advisory_xact_lock(hashtext('archive_stamp_counts'), 0) THEN
    PERFORM {s}.archive_stamp_counts_fold();
  END IF;
  RETURN NULL;
END
$track$;

CREATE FUNCTION {s}.archive_stamp_counts_fold() RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog, {s}, pg_temp
AS $fold$
DECLARE
  rows_folded bigint;
BEGIN
  -- One fold at a time (the trigger already holds this lock: it is re-entrant). Taken before the
  -- statement, so the statement's snapshot sees what the previous fold committed.
  PERFORM pg_advisory_xact_lock(hashtext('archive_stamp_counts'), 0);
  WITH many AS (
  SELECT {GROUP} FROM {s}.archive_stamp_counts GROUP BY {GROUP} HAVING count(*) > 1 OR sum(n) = 0
), gone AS (
  DELETE FROM {s}.archive_stamp_counts AS c USING many AS m
   WHERE (c.stamp_key, c.governed, c.stale, c.failed, c.ruleset)
       = (m.stamp_key, m.governed, m.stale, m.failed, m.ruleset)
  RETURNING c.stamp_key, c.governed, c.stale, c.failed, c.ruleset, c.n
), folded AS (
  INSERT INTO {s}.archive_stamp_counts ({GROUP}, n)
  SELECT {GROUP}, sum(n) FROM gone GROUP BY {GROUP} HAVING sum(n) <> 0 ORDER BY {GROUP}
  RETURNING 1
  )
  SELECT count(*) INTO rows_folded FROM gone;
  RETURN rows_folded;
END
$fold$;

CREATE FUNCTION {s}.archive_stamp_counts_recompute() RETURNS bigint
LANGUAGE plpgsql SET search_path = pg_catalog, {s}, pg_temp
AS $recompute$
DECLARE
  groups bigint;
BEGIN
  LOCK TABLE {s}.archive_documents IN SHARE MODE;
  PERFORM pg_advisory_xact_lock(hashtext('archive_stamp_counts'), 0);
  DELETE FROM {s}.archive_stamp_counts;
  INSERT INTO {s}.archive_stamp_counts ({GROUP}, n)
  SELECT {GROUP}, sum(n) FROM ({_contributions(f"{s}.archive_documents", 1, s)}) AS now_
   GROUP BY {GROUP} ORDER BY {GROUP};
  GET DIAGNOSTICS groups = ROW_COUNT;
  RETURN groups;
END
$recompute$;

REVOKE ALL ON FUNCTION {s}.archive_stamp_counts_track() FROM PUBLIC;
REVOKE ALL ON FUNCTION {s}.archive_stamp_counts_fold() FROM PUBLIC;
REVOKE ALL ON FUNCTION {s}.archive_stamp_counts_recompute() FROM PUBLIC;
"""


def _triggers(s: str) -> str:
    run = f"FOR EACH STATEMENT EXECUTE FUNCTION {s}.archive_stamp_counts_track()"
    return f"""
CREATE TRIGGER archive_stamp_counts_insert AFTER INSERT ON {s}.archive_documents
  REFERENCING NEW TABLE AS new_rows {run};
CREATE TRIGGER archive_stamp_counts_update AFTER UPDATE ON {s}.archive_documents
  REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows {run};
CREATE TRIGGER archive_stamp_counts_delete AFTER DELETE ON {s}.archive_documents
  REFERENCING OLD TABLE AS old_rows {run};
CREATE TRIGGER archive_stamp_counts_truncate AFTER TRUNCATE ON {s}.archive_documents {run};
"""


_SCHEMA_OF_FUNCTIONS = text(
    "SELECT pronamespace::regnamespace::text FROM pg_catalog.pg_proc WHERE proname = 'archive_composed_text'"
)


def upgrade() -> None:
    schema = op.get_bind().execute(_SCHEMA_OF_FUNCTIONS).scalar_one()  # regnamespace::text is quoted
    op.execute(TABLE)
    op.execute(_functions(schema))
    # The triggers first, then the backfill, in this transaction: the recompute's SHARE lock waits for
    # the writers in flight and holds new ones until the commit, so none is counted twice or missed.
    op.execute(_triggers(schema))
    op.execute(f"SELECT {schema}.archive_stamp_counts_recompute()")


def downgrade() -> None:
    op.execute(
        """
        DROP TRIGGER IF EXISTS archive_stamp_counts_insert ON archive_documents;
        DROP TRIGGER IF EXISTS archive_stamp_counts_update ON archive_documents;
        DROP TRIGGER IF EXISTS archive_stamp_counts_delete ON archive_documents;
        DROP TRIGGER IF EXISTS archive_stamp_counts_truncate ON archive_documents;
        DROP FUNCTION IF EXISTS archive_stamp_counts_recompute();
        DROP FUNCTION IF EXISTS archive_stamp_counts_fold();
        DROP FUNCTION IF EXISTS archive_stamp_counts_track();
        DROP TABLE IF EXISTS archive_stamp_counts;
        """
    )
