"""``bookline bench ledger``: adds through the replicated ledger client.

Starts ZooKeeper + 3 bookies (``ops.cluster.local.LocalCluster``) unless ``--cluster`` names a
running one's ``cluster.json``; creates one ledger with E=Qw=3, Qa=2 and adds
``--entries`` entries of ``--entry-size`` bytes. Closed loop (``--rate 0``): the writer
keeps ``--inflight`` adds outstanding, latency from submit to acknowledgement. Open loop
(``--rate R``): adds start on a fixed schedule and latency counts from the *scheduled*
start, so a stalled client cannot hide queueing (no coordinated omission).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import dataclasses
import functools
import os
import time
from collections.abc import Iterator
from typing import Any

from ledger.client import LedgerClient
from ledger.config import LedgerConfig
from ledger.writer import LedgerWriter
from ops.bench.common import Answers, asyncio_run, latency_summary
from ops.bench.pacing import open_loop
from ops.cluster.local import CLUSTER_ROOT, bench_cluster

# Entries added (closed loop) before measuring: connections, caches, the JIT-less warm-up
# of the bookies' code paths.
_WARMUP_ENTRIES_MAX = 2_000


@contextlib.contextmanager
def cluster_endpoints(args: argparse.Namespace, bookies: int = 3) -> Iterator[tuple[str, str]]:
    """(zk connect string, cluster root): from --cluster, or a cluster we start and stop."""
    with bench_cluster(args, bookies=bookies) as layout:
        yield layout["zk"], layout.get("root", CLUSTER_ROOT)


async def _closed_loop(w: LedgerWriter, count: int, payload: bytes) -> list[float]:
    latencies: list[float] = []
    perf = time.perf_counter

    def on_done(fut: asyncio.Future[int], t0: float) -> None:
        if not fut.cancelled() and fut.exception() is None:
            latencies.append(perf() - t0)

    futs = []
    for _ in range(count):
        t0 = perf()
        fut = w.submit_nowait(payload)  # the hot path: no coroutine per entry
        while fut is None:
            await w.wait_for_room()  # the writer's in-flight bound
            fut = w.submit_nowait(payload)
        fut.add_done_callback(functools.partial(on_done, t0=t0))
        futs.append(fut)
    await asyncio.gather(*futs)
    return latencies


async def _open_loop(w: LedgerWriter, count: int, payload: bytes, rate: float) -> list[float]:
    answers = Answers(count)
    backlog: collections.deque[float] = collections.deque()  # waiting at the in-flight bound
    drainers: list[asyncio.Task[None]] = []

    def track(fut: asyncio.Future[int], scheduled: float) -> None:
        fut.add_done_callback(functools.partial(answers.record, started=scheduled))

    async def drain() -> None:  # submits the backlog in the schedule's order
        while backlog:
            track(await w.submit(payload), backlog.popleft())

    def send(scheduled: float) -> None:
        fut = None if backlog else w.submit_nowait(payload)
        if fut is not None:
            track(fut, scheduled)
            return
        backlog.append(scheduled)
        if len(backlog) == 1:
            drainers.append(asyncio.ensure_future(drain()))

    await open_loop(rate, count, send)
    await asyncio.gather(*drainers)
    if count:
        await answers.finished
    return answers.latencies


async def _bench(zk: str, root: str, args: argparse.Namespace) -> dict[str, Any]:
    config = dataclasses.replace(
        LedgerConfig(ensemble_size=3, write_quorum=3, ack_quorum=2),
        adds_in_flight_max=args.inflight,
    )
    payload = os.urandom(args.entry_size)
    async with await LedgerClient.connect(zk, root, config) as client:
        warm = await client.create_ledger()
        await _closed_loop(warm, min(_WARMUP_ENTRIES_MAX, args.entries), payload)
        await warm.close()
        w = await client.create_ledger()
        t0 = time.perf_counter()
        if args.rate > 0:
            latencies = await _open_loop(w, args.entries, payload, args.rate)
        else:
            latencies = await _closed_loop(w, args.entries, payload)
        elapsed = time.perf_counter() - t0
        await w.close()
        changes = w.ensemble_changes
    return {
        "bench": "ledger",
        "entries": args.entries,
        "entry_size": args.entry_size,
        "ensemble": "E=3 Qw=3 Qa=2",
        "mode": f"open loop {args.rate:g}/s" if args.rate > 0 else f"closed loop {args.inflight}",
        "elapsed_s": round(elapsed, 3),
        "entries_per_s": round(args.entries / elapsed, 1),
        "mb_per_s": round(args.entries * args.entry_size / elapsed / 1e6, 2),
        "ensemble_changes": changes,
        **latency_summary(latencies),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    with cluster_endpoints(args) as (zk, root):
        return asyncio_run(_bench(zk, root, args))  # uvloop when installed, as services run
