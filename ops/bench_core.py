"""``bookline bench write|e2e|read``: the core library (log streams) end to end.

Each starts ZooKeeper + 3 bookies (real processes, fsync'd journals) in a temporary
directory unless ``--cluster`` names a running cluster's ``cluster.json``; streams use
E=Qw=3, Qa=2 and 100-byte records by default. The writer and reader run in this
process, on uvloop when installed.

* ``write``: ``write_many`` batches of ``--batch`` records (default), or per-record
  ``write_nowait`` with ``--inflight`` records outstanding (``--per-record``). Latency:
  per batch call, or per record from the call to its DLSN.
* ``e2e``: an open loop of ``--rate`` records/s; a tailing reader in the same process
  measures from the record's *scheduled* write time to its arrival (a stall is charged
  to every record it delays).
* ``read``: writes ``--records`` records first, then times a catch-up reader from the
  earliest position.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import functools
import os
import struct
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from ops.bench import Answers, latency_summary
from ops.pacing import open_loop

if TYPE_CHECKING:
    from bookline.core_config import NamespaceConfig
    from bookline.dlsn import DLSN
    from bookline.namespace import Namespace


_STAMP = struct.Struct(">d")


@contextlib.contextmanager
def cluster_layout(args: argparse.Namespace) -> Iterator[dict[str, Any]]:
    """``{"zk", "root"}`` of the cluster to use: --cluster, or 3 bookies we start."""
    from ops.local import bench_cluster

    with bench_cluster(args, bookies=3, prefix="bl-core-") as layout:
        yield layout


def _timer(latencies: list[float], started: float) -> Callable[[object], None]:
    """A done-callback recording the time since ``started``."""

    def done(_fut: object) -> None:
        latencies.append(time.perf_counter() - started)

    return done


def _config(args: argparse.Namespace) -> NamespaceConfig:
    from bookline.core_config import NamespaceConfig

    return NamespaceConfig(
        compression=args.compression,
        flush_interval_ms=args.flush_interval_ms,
        control_interval_ms=args.control_interval_ms,
    )


async def _open(layout: dict[str, Any], args: argparse.Namespace) -> tuple[Namespace, str]:
    from bookline.namespace import Namespace

    ns = await Namespace.open(layout["zk"], layout["root"], "bench", _config(args))
    stream = f"{args.bench}-{os.getpid()}-{int(time.time() * 1000)}"
    await ns.create_stream(stream)
    return ns, stream


async def _write_many(ns: Namespace, stream: str, args: argparse.Namespace) -> dict[str, Any]:
    from bookline.records import LogRecord

    payload = os.urandom(args.record_size)
    records = [LogRecord(payload) for _ in range(args.batch)]
    latencies: list[float] = []
    w = await ns.open_writer(stream)
    try:
        await w.write_many(records[:1000])  # warm up connections and code paths
        inflight: set[asyncio.Task[list[DLSN]]] = set()
        t0 = time.perf_counter()
        for _ in range(args.records // args.batch):
            started = time.perf_counter()
            task = asyncio.ensure_future(w.write_many(records))
            task.add_done_callback(_timer(latencies, started))
            inflight.add(task)
            task.add_done_callback(inflight.discard)
            if len(inflight) >= args.batches_in_flight:
                await asyncio.wait(inflight, return_when=asyncio.FIRST_COMPLETED)
        await asyncio.gather(*inflight)
        elapsed = time.perf_counter() - t0
    finally:
        await w.close()
    n = (args.records // args.batch) * args.batch
    return {"records": n, "elapsed_s": round(elapsed, 3), "records_per_s": round(n / elapsed, 1),
            **latency_summary(latencies)}  # fmt: skip


async def _write_each(ns: Namespace, stream: str, args: argparse.Namespace) -> dict[str, Any]:
    from bookline.records import LogRecord

    payload = os.urandom(args.record_size)
    latencies: list[float] = []
    w = await ns.open_writer(stream)
    try:
        await w.write(LogRecord(payload))
        # The window: at most --inflight records outstanding (a deque, not an
        # asyncio.Queue, whose bookkeeping cost more than the write being measured).
        window: collections.deque[asyncio.Future[DLSN]] = collections.deque()
        t0 = time.perf_counter()
        for _ in range(args.records):
            if len(window) >= args.inflight:
                await window.popleft()
            started = time.perf_counter()
            fut = w.write_nowait(LogRecord(payload))
            fut.add_done_callback(_timer(latencies, started))
            window.append(fut)
        while window:
            await window.popleft()
        elapsed = time.perf_counter() - t0
    finally:
        await w.close()
    return {"records": args.records, "elapsed_s": round(elapsed, 3),
            "records_per_s": round(args.records / elapsed, 1),
            **latency_summary(latencies)}  # fmt: skip


async def _e2e(ns: Namespace, stream: str, args: argparse.Namespace) -> dict[str, Any]:
    from bookline.records import LogRecord

    w = await ns.open_writer(stream)
    reader = await ns.open_reader(stream, "latest")
    filler = os.urandom(max(0, args.record_size - _STAMP.size))
    latencies: list[float] = []
    total = int(args.rate * args.duration_s)

    async def consume() -> None:
        while len(latencies) < total:
            for rec in await reader.read_many(10_000):
                latencies.append(time.perf_counter() - _STAMP.unpack_from(rec.payload)[0])

    await w.write(LogRecord(b"warm-up"))
    await reader.read_next(10)
    consumer = asyncio.create_task(consume())
    acks = Answers(total)  # the writer's acknowledgements: durable on the ack quorum

    def send(scheduled: float) -> None:
        fut = w.write_nowait(LogRecord(_STAMP.pack(scheduled) + filler))
        fut.add_done_callback(functools.partial(acks.record, started=scheduled))

    try:
        start = await open_loop(args.rate, total, send)
        await acks.finished
        await asyncio.wait_for(consumer, 60)
        elapsed = time.perf_counter() - start
    finally:
        consumer.cancel()
        await reader.close()
        await w.close()
    ack = {f"ack_{k}": v for k, v in latency_summary(acks.latencies).items()}
    return {"records": total, "rate": args.rate, "elapsed_s": round(elapsed, 3),
            "records_per_s": round(total / elapsed, 1), **latency_summary(latencies),
            **ack}  # fmt: skip


async def _read(ns: Namespace, stream: str, args: argparse.Namespace) -> dict[str, Any]:
    from bookline.records import LogRecord

    payload = os.urandom(args.record_size)
    w = await ns.open_writer(stream)
    batch = [LogRecord(payload) for _ in range(10_000)]
    for _ in range(args.records // len(batch)):
        await w.write_many(batch)
    await w.close()
    n = (args.records // len(batch)) * len(batch)
    reader = await ns.open_reader(stream, "earliest")
    latencies: list[float] = []
    got = 0
    t0 = time.perf_counter()
    try:
        while got < n:
            started = time.perf_counter()
            got += len(await reader.read_many(10_000, timeout_s=30))
            latencies.append(time.perf_counter() - started)
        elapsed = time.perf_counter() - t0
    finally:
        await reader.close()
    return {"records": n, "elapsed_s": round(elapsed, 3), "records_per_s": round(n / elapsed, 1),
            **latency_summary(latencies)}  # fmt: skip


async def _bench(layout: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    ns, stream = await _open(layout, args)
    try:
        if args.bench == "write":
            result = await (_write_each if args.per_record else _write_many)(ns, stream, args)
        elif args.bench == "e2e":
            result = await _e2e(ns, stream, args)
        else:
            result = await _read(ns, stream, args)
        await ns.delete_stream(stream)
    finally:
        await ns.close()
    mode = "per-record" if getattr(args, "per_record", False) else "write_many"
    return {"bench": args.bench, "record_size": args.record_size,
            **({"mode": mode} if args.bench == "write" else {}), **result}  # fmt: skip


def run(args: argparse.Namespace) -> dict[str, Any]:
    from ops.bench_bookie import asyncio_run

    with cluster_layout(args) as layout:
        return asyncio_run(_bench(layout, args))


def add_arguments(p: argparse.ArgumentParser, kind: str) -> None:
    p.add_argument("--cluster", default=None,
                   help="cluster.json of a running cluster (default: start our own)")  # fmt: skip
    p.add_argument("--dir", default=None, help="state directory (default: a temp dir)")
    p.add_argument("--record-size", type=int, default=100, help="bytes per record")
    p.add_argument("--compression", default="none", choices=("none", "lz4", "zstd"))
    p.add_argument("--flush-interval-ms", type=int, default=1, help="writer buffer timer")
    p.add_argument("--control-interval-ms", type=int, default=2,
                   help="idle time before a control record advances the LAC")  # fmt: skip
    if kind == "write":
        p.add_argument("--records", type=int, default=1_000_000, help="records to write")
        p.add_argument("--per-record", action="store_true",
                       help="single-record writes (write_nowait), not write_many")  # fmt: skip
        p.add_argument("--batch", type=int, default=10_000, help="records per write_many")
        p.add_argument("--batches-in-flight", type=int, default=4, help="write_many calls")
        p.add_argument("--inflight", type=int, default=20_000,
                       help="per-record mode: records outstanding")  # fmt: skip
    elif kind == "e2e":
        p.add_argument("--rate", type=float, default=10_000.0, help="records/s (open loop)")
        p.add_argument("--duration-s", type=float, default=10.0, help="how long to write")
    else:
        p.add_argument("--records", type=int, default=1_000_000, help="records to read")
