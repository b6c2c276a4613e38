"""Procrastinate's enqueue+fetch+finish cycle, measured like bench_ledger.py's, for a side-by-side figure.

Runs in a SEPARATE virtual environment (``pip install procrastinate`` under /tmp, never a dependency of
this project), against a database of the same cluster: ``bench_ledger.py --peer-python PYTHON``
starts it. Grows ``procrastinate_jobs`` to ``--history`` finished jobs with one INSERT ... SELECT
generate_series, then defers ``--samples`` jobs one at a time to one long-running worker, waiting for
each to succeed, so each cycle is one job through the queue, as in our cycle; WAL from
pg_current_wal_lsn() deltas, statements from pg_stat_statements (this database only), after a CHECKPOINT.
Usage: PYTHON bench/peer_procrastinate.py CONNINFO [--history 1000000] [--samples 300]
"""
import argparse
import asyncio
import json

import procrastinate
import psycopg


def sql(conninfo, query, params=None):
    with psycopg.connect(conninfo, autocommit=True) as conn:
        cur = conn.execute(query, params)
        return cur.fetchall() if cur.description else None


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("conninfo")
    parser.add_argument("--history", type=int, default=1_000_000)
    parser.add_argument("--samples", type=int, default=300)
    args = parser.parse_args()
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=args.conninfo))

    @app.task(name="noop", queue="bench")
    def noop():
        return None

    async with app.open_async():
        await app.schema_manager.apply_schema_async()
        sql(args.conninfo, "INSERT INTO procrastinate_jobs (queue_name, task_name, args, status, attempts) "
                           "SELECT 'bench', 'noop', '{}', 'succeeded', 1 FROM generate_series(1, %s)", (args.history,))
        sql(args.conninfo, "VACUUM ANALYZE procrastinate_jobs")
        # One long-running worker (LISTEN/NOTIFY on, as by default), jobs deferred one at a time and
        # each waited for: one job through the queue per cycle, as in bench_ledger.py.
        worker = asyncio.create_task(app.run_worker_async(queues=["bench"], install_signal_handlers=False))

        async def one_cycle() -> None:
            job_id = await noop.defer_async()
            while sql(args.conninfo, "SELECT status::text AS bench_poll FROM procrastinate_jobs WHERE id = %s",
                      (job_id,))[0][0] != "succeeded":
                await asyncio.sleep(0.005)

        for _ in range(5):  # warm-up
            await one_cycle()
        windows = []
        for label in ("after a checkpoint", "steady"):
            if label == "after a checkpoint":
                sql(args.conninfo, "CHECKPOINT")
            sql(args.conninfo, "SELECT pg_stat_statements_reset()")
            start = sql(args.conninfo, "SELECT pg_current_wal_lsn()")[0][0]
            for _ in range(args.samples):
                await one_cycle()
            end = sql(args.conninfo, "SELECT pg_current_wal_lsn()")[0][0]
            wal = sql(args.conninfo, "SELECT pg_wal_lsn_diff(%s, %s)", (end, start))[0][0]
            rows = sql(args.conninfo, "SELECT query, calls FROM pg_stat_statements WHERE dbid = "
                                      "(SELECT oid FROM pg_database WHERE datname = current_database()) "
                                      "AND query !~ 'pg_stat_statements|pg_current_wal_lsn|pg_wal_lsn_diff"
                                      "|bench_poll|CHECKPOINT' "
                                      "ORDER BY calls DESC")
            windows.append({"window": label, "wal_bytes_per_cycle": round(float(wal) / args.samples),
                            "statements_per_cycle": round(sum(r[1] for r in rows) / args.samples, 2),
                            "top_statements": [(" ".join(q.split())[:80], c) for q, c in rows[:6]]})
        worker.cancel()
        try:
            await worker
        except asyncio.CancelledError:
            pass
    print(json.dumps({"peer": f"procrastinate {procrastinate.__version__}", "history_rows": args.history,
                      "samples": args.samples, "windows": windows,
                      "note": "one long-running worker; the bench's own status polling is not counted"}))


asyncio.run(main())
