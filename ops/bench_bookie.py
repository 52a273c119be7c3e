"""``bookline bench bookie``: adds to one bookie from one pipelined client.

Starts its own ZooKeeper + one bookie (a real ``bookline bookie`` process, fsync on
every journal group) in a temporary directory unless ``--cluster`` names a running
cluster's ``cluster.json``. Two modes:

* closed loop (default): keep ``--inflight`` adds outstanding, as fast as possible;
* open loop (``--rate N``): start adds on a fixed schedule of N/s; latency is measured
  from the *scheduled* start, so a stall is charged to every add it delays.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import tempfile
import time
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

from bookie.client import BookieConnection
from ops.bench import latency_summary
from ops.local import LocalCluster

T = TypeVar("T")

# A bench ledger id far from anything a real cluster allocates.
BENCH_LEDGER_BASE = 1 << 60


@contextlib.contextmanager
def bookie_addresses(args: argparse.Namespace, bookies: int) -> Iterator[list[str]]:
    """Addresses of the bookies to use: from --cluster, or a cluster we start and stop."""
    if args.cluster:
        layout = json.loads(Path(args.cluster).read_text())
        yield [b["address"] for b in layout["bookies"]][:bookies]
        return
    with contextlib.ExitStack() as stack:
        base = args.dir or stack.enter_context(tempfile.TemporaryDirectory(prefix="bl-bench-"))
        cluster = LocalCluster(Path(base), bookies=bookies)
        cluster.start()
        stack.callback(cluster.stop)
        yield [b.address for b in cluster.bookies]


async def _closed_loop(
    conn: BookieConnection, ledger_id: int, count: int, payload: bytes, inflight: int
) -> list[float]:
    latencies: list[float] = []
    key = b"bench-master-key"
    next_id = 0

    async def worker() -> None:
        nonlocal next_id
        while next_id < count:
            entry_id = next_id
            next_id += 1
            t0 = time.perf_counter()
            await conn.add(ledger_id, entry_id, entry_id - 1, key, payload)
            latencies.append(time.perf_counter() - t0)

    await asyncio.gather(*(worker() for _ in range(min(inflight, count))))
    return latencies


async def _open_loop(
    conn: BookieConnection, ledger_id: int, count: int, payload: bytes, rate: float
) -> list[float]:
    latencies: list[float] = []
    key = b"bench-master-key"
    interval = 1.0 / rate
    start = time.perf_counter()
    tasks: set[asyncio.Task[None]] = set()

    async def one(entry_id: int, scheduled: float) -> None:
        await conn.add(ledger_id, entry_id, entry_id - 1, key, payload)
        latencies.append(time.perf_counter() - scheduled)

    for entry_id in range(count):
        scheduled = start + entry_id * interval
        delay = scheduled - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        task = asyncio.create_task(one(entry_id, scheduled))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    if tasks:
        await asyncio.gather(*tasks)
    return latencies


async def _bench(address: str, args: argparse.Namespace) -> dict[str, Any]:
    conn = BookieConnection(address)
    try:
        await conn.connect()
        ledger_id = BENCH_LEDGER_BASE + (os.getpid() << 16) + int(time.time()) % 65536
        payload = os.urandom(args.entry_size)
        # Warm up the connection and the bookie's code paths.
        await _closed_loop(conn, ledger_id - 1, min(2000, args.entries), payload, args.inflight)
        t0 = time.perf_counter()
        if args.rate > 0:
            latencies = await _open_loop(conn, ledger_id, args.entries, payload, args.rate)
        else:
            latencies = await _closed_loop(conn, ledger_id, args.entries, payload, args.inflight)
        elapsed = time.perf_counter() - t0
    finally:
        await conn.close()
    return {
        "bench": "bookie",
        "entries": args.entries,
        "entry_size": args.entry_size,
        "inflight": args.inflight,
        "rate": args.rate,
        "elapsed_s": round(elapsed, 3),
        "entries_per_s": round(args.entries / elapsed, 1),
        "mb_per_s": round(args.entries * args.entry_size / elapsed / 1e6, 2),
        **latency_summary(latencies),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    with bookie_addresses(args, bookies=1) as addresses:
        return asyncio_run(_bench(addresses[0], args))


def asyncio_run(coro: Coroutine[Any, Any, T]) -> T:
    """Run on uvloop when installed (as the servers do)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    result: T = uvloop.run(coro)
    return result
