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
import functools
import os
import time
from collections.abc import Iterator
from typing import Any, TypeVar

from bookie.client import BookieConnection
from ops.bench.common import Answers, asyncio_run, latency_summary
from ops.bench.pacing import open_loop
from ops.cluster.local import bench_cluster

T = TypeVar("T")

# A bench ledger id far from anything a real cluster allocates.
BENCH_LEDGER_BASE = 1 << 60
_MASTER_KEY = b"bench-master-key"


@contextlib.contextmanager
def bench_layout(args: argparse.Namespace, bookies: int) -> Iterator[dict[str, Any]]:
    """The layout (``cluster.json``) of the cluster to use: from --cluster, or one we
    start and stop."""
    with bench_cluster(args, bookies=bookies) as layout:
        yield layout


async def register_bench_ledgers(layout: dict[str, Any], ledger_ids: list[int]) -> None:
    """Create the benchmark ledgers' metadata under ``_MASTER_KEY``: a bookie takes the
    first add of a ledger only when it exists, under its key (bookie/access.py)."""
    from foundation.config import MetadataConfig
    from metadata.client import MetadataClient
    from metadata.ledger_metadata import LedgerMetadata, Segment, master_key_check

    md = MetadataClient(MetadataConfig(zk=layout["zk"], root=layout["root"]))
    await md.connect()
    try:
        for ledger_id in ledger_ids:
            await md.ledgers.create(
                LedgerMetadata(
                    ledger_id=ledger_id,
                    ensemble_size=1,
                    write_quorum=1,
                    ack_quorum=1,
                    segments=(Segment(0, ("bench",)),),
                    key_check=master_key_check(_MASTER_KEY),
                )
            )
    finally:
        await md.close()


async def _closed_loop(
    conn: BookieConnection, ledger_id: int, count: int, payload: bytes, inflight: int
) -> list[float]:
    """Keep ``inflight`` adds outstanding: each answer starts the next add (no task or
    coroutine per add, as the ledger layer's write path does with its adders)."""
    answers = Answers(count)
    adder = conn.adder(ledger_id, _MASTER_KEY)
    next_id = 0
    perf = time.perf_counter

    def start_one() -> None:
        nonlocal next_id
        entry_id = next_id
        next_id += 1
        t0 = perf()
        fut = adder.add(entry_id, entry_id - 1, payload)
        fut.add_done_callback(functools.partial(on_done, t0=t0))

    def on_done(fut: asyncio.Future[None], t0: float) -> None:
        if answers.record(fut, t0) and next_id < count:
            start_one()

    for _ in range(min(inflight, count)):
        start_one()
    await answers.finished
    return answers.latencies


async def _open_loop(
    conn: BookieConnection, ledger_id: int, count: int, payload: bytes, rate: float
) -> list[float]:
    """Start adds on a fixed schedule; latency counts from the scheduled start."""
    answers = Answers(count)
    entry_ids = iter(range(count))
    adder = conn.adder(ledger_id, _MASTER_KEY)

    def send(scheduled: float) -> None:
        entry_id = next(entry_ids)
        fut = adder.add(entry_id, entry_id - 1, payload)
        fut.add_done_callback(functools.partial(answers.record, started=scheduled))

    await open_loop(rate, count, send)
    if count:
        await answers.finished
    return answers.latencies


async def _bench(layout: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    conn = BookieConnection(layout["bookies"][0]["address"])
    try:
        await conn.connect()
        ledger_id = BENCH_LEDGER_BASE + (os.getpid() << 16) + int(time.time()) % 65536
        await register_bench_ledgers(layout, [ledger_id - 1, ledger_id])
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
    from ops.cluster.client_env import use_cluster_credentials

    use_cluster_credentials(args)  # --cluster: its token for bookies with auth on
    with bench_layout(args, bookies=1) as layout:
        return asyncio_run(_bench(layout, args))
