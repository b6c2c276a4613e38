"""Procrastinate's pick-up, measured like bench_pickup.py's: enqueue's commit -> the task's first line.

Runs in a SEPARATE virtual environment (``pip install procrastinate`` under /tmp, never a dependency of
this project), against a database of the same cluster: ``bench_pickup.py --peer-python PYTHON`` starts
it. One long-running worker process (LISTEN/NOTIFY on, its default 5 s polling as the safety net, as our
daemon's) runs a task whose first line takes ``time.time()`` and writes it to a table; this process
defers one job at a time after a random pause (a random phase against the worker's polling), takes
``time.time()`` once the defer's transaction has committed, and reads the stamp back. One host: one clock.
Usage: PYTHON bench/peer_pickup.py CONNINFO [--samples 25]
"""
import argparse
import asyncio
import json
import random
import subprocess
import sys
import time

import procrastinate
import psycopg


def make_app(conninfo: str) -> procrastinate.App:
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=conninfo))

    @app.task(name="stamp", queue="bench")
    async def stamp(job_key: str) -> None:
        first_line_at = time.time()
        async with await psycopg.AsyncConnection.connect(conninfo, autocommit=True) as conn:
            await conn.execute("INSERT INTO peer_pickup_stamp VALUES (%s, %s)", (job_key, first_line_at))

    return app


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


async def work(conninfo: str) -> None:
    async with make_app(conninfo).open_async() as app:
        await app.run_worker_async(queues=["bench"], concurrency=1, listen_notify=True)


async def measure(conninfo: str, samples: int) -> dict:
    app = make_app(conninfo)
    values = []
    async with app.open_async():
        for i in range(samples + 1):
            await asyncio.sleep(random.uniform(0.1, 2.1))
            key = f"job-{i}"
            await app.tasks["stamp"].defer_async(job_key=key)
            committed = time.time()
            with psycopg.connect(conninfo, autocommit=True) as conn:
                for _ in range(2000):
                    row = conn.execute("SELECT first_line_at FROM peer_pickup_stamp WHERE job_key = %s",
                                       (key,)).fetchone()
                    if row:
                        break
                    time.sleep(0.002)
                else:
                    raise SystemExit(f"{key}: no first line within 4 s")
            if i:  # the first one warms the caches
                values.append((row[0] - committed) * 1000)
    return {"peer": "procrastinate", "version": procrastinate.__version__, "samples": len(values),
            "p50": round(percentile(values, 0.5), 1), "p95": round(percentile(values, 0.95), 1),
            "max": round(max(values), 1)}


def _wait_registered(conninfo: str) -> None:
    """The worker is serving once it has registered (procrastinate_workers), after its LISTEN."""
    with psycopg.connect(conninfo, autocommit=True) as conn:
        for _ in range(300):
            if conn.execute("SELECT 1 FROM procrastinate_workers").fetchone() is not None:
                time.sleep(0.5)  # its fetch loop past the first poll
                return
            time.sleep(0.1)
    raise SystemExit("the worker did not register within 30 s")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("conninfo")
    parser.add_argument("--samples", type=int, default=25)
    parser.add_argument("--worker", action="store_true", help="(internal) be the worker process")
    args = parser.parse_args()
    if args.worker:
        asyncio.run(work(args.conninfo))
        return
    app = make_app(args.conninfo)
    app.open()
    app.schema_manager.apply_schema()
    app.close()
    with psycopg.connect(args.conninfo, autocommit=True) as conn:
        conn.execute("CREATE TABLE peer_pickup_stamp (job_key text PRIMARY KEY, first_line_at double precision)")
    worker = subprocess.Popen([sys.executable, __file__, args.conninfo, "--worker"])
    try:
        _wait_registered(args.conninfo)
        print(json.dumps(asyncio.run(measure(args.conninfo, args.samples))))
    finally:
        worker.terminate()
        worker.wait(timeout=30)


if __name__ == "__main__":
    main()
