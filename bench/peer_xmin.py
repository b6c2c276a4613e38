"""Procrastinate's table growth per job while a REPEATABLE READ session pins the xmin horizon, for
bench_xmin.py's side-by-side figure.

Runs in a SEPARATE virtual environment (procrastinate installed with pip under /tmp, never a dependency of
this project), against its own database of the same cluster: ``bench_xmin.py --peer-python PYTHON`` starts
it. Applies the schema, runs ``--warmup`` jobs, opens a REPEATABLE READ session in this database and takes
its snapshot (VACUUM can then remove no row version written after it), then defers ``--jobs`` jobs one at a
time to one long-running worker, waiting for each to succeed; the growth is the change of
pg_total_relation_size (heap, indexes, TOAST) summed over procrastinate's tables, VACUUMed before and after,
and pgstattuple's live and dead heap bytes. ``--heartbeat`` and ``--beats``: the worker renews its row every
``--heartbeat`` seconds and each job lasts ``--beats`` of them, the cadence of bench_xmin's ledger jobs (0:
Procrastinate's default heartbeat and a job that returns at once).
Usage: PYTHON bench/peer_xmin.py CONNINFO [--jobs 300] [--warmup 20] [--heartbeat 0.1 --beats 2]
"""
import argparse
import asyncio
import json

import procrastinate
import psycopg

SIZE = ("SELECT COALESCE(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
        "WHERE c.relkind = 'r' AND c.relname LIKE 'procrastinate%%'")
HEAP = ("SELECT COALESCE(sum(s.tuple_len), 0), COALESCE(sum(s.dead_tuple_len), 0) FROM pg_class c "
        "CROSS JOIN LATERAL pgstattuple(c.oid) AS s WHERE c.relkind = 'r' AND c.relname LIKE 'procrastinate%%'")


def sql(conninfo, query, params=None):
    with psycopg.connect(conninfo, autocommit=True) as conn:
        cur = conn.execute(query, params)
        return cur.fetchall() if cur.description else None


def heap(conninfo):
    """Live and dead heap bytes of procrastinate's tables (pgstattuple), or None without the extension."""
    if not sql(conninfo, "SELECT 1 FROM pg_extension WHERE extname = 'pgstattuple'"):
        return None
    live, dead = sql(conninfo, HEAP)[0]
    return {"live": int(live), "dead": int(dead)}


def vacuum(conninfo):
    tables = [r[0] for r in sql(conninfo, "SELECT relname FROM pg_class WHERE relkind = 'r' "
                                          "AND relname LIKE 'procrastinate%%'")]
    for t in tables:
        sql(conninfo, f'VACUUM "{t}"')


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("conninfo")
    parser.add_argument("--jobs", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--heartbeat", type=float, default=0.0, help="the worker's heartbeat, seconds (0: its default)")
    parser.add_argument("--beats", type=int, default=0, help="each job lasts this many heartbeats")
    args = parser.parse_args()
    job_seconds = args.heartbeat * args.beats
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=args.conninfo))

    @app.task(name="noop", queue="bench")
    async def noop():
        if job_seconds:
            await asyncio.sleep(job_seconds)

    async with app.open_async():
        await app.schema_manager.apply_schema_async()
        cadence = {"update_heartbeat_interval": args.heartbeat} if args.heartbeat else {}
        worker = asyncio.create_task(app.run_worker_async(queues=["bench"], install_signal_handlers=False,
                                                          **cadence))

        async def one_job() -> None:
            job_id = await noop.defer_async()
            while sql(args.conninfo, "SELECT status::text AS bench_poll FROM procrastinate_jobs WHERE id = %s",
                      (job_id,))[0][0] != "succeeded":
                await asyncio.sleep(0.005)

        for _ in range(args.warmup):
            await one_job()
        vacuum(args.conninfo)
        before, heap_before = int(sql(args.conninfo, SIZE)[0][0]), heap(args.conninfo)
        with psycopg.connect(args.conninfo) as pin:
            pin.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            pin.execute("SELECT count(*) FROM procrastinate_jobs").fetchall()  # the snapshot is taken
            for _ in range(args.jobs):
                await one_job()
            vacuum(args.conninfo)  # removes nothing written after the pin's snapshot
            pinned, heap_pinned = int(sql(args.conninfo, SIZE)[0][0]), heap(args.conninfo)
            pin.rollback()
        worker.cancel()
        try:
            await worker
        except asyncio.CancelledError:
            pass
    print(json.dumps({"peer": f"procrastinate {procrastinate.__version__}", "jobs": args.jobs,
                      "bytes_before": before, "bytes_after": pinned,
                      "heartbeat_seconds": args.heartbeat or "default", "beats_per_job": args.beats,
                      "bytes_per_job": round((pinned - before) / args.jobs),
                      "heap_bytes_per_job": {k: round((heap_pinned[k] - heap_before[k]) / args.jobs)
                                             for k in heap_before} if heap_before else None}))


asyncio.run(main())
