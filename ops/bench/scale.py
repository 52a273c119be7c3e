"""``bookline bench scale``: how Bookline's figures hold as the load grows.

* ``--curve stored``: one core writer appends ``write_many`` batches of
  ``--record-size`` records (1 KiB) to one stream until ``--stored-gb`` (10) of records
  are stored -- on each of the 3 bookies, so three times that on this disk, plus the
  journals until checkpoints free them; the throughput of each ``--window-mb`` (100 MB)
  is recorded against the data stored before it. Appends must stay O(1): the median
  window of the last GB within 10 % of the first GB's (after the first 100 MB, written
  before any checkpoint). The free disk space is checked first (``df``): the
  run refuses to start without room for 3x the data plus a 10 GB margin. Everything is
  deleted after.
* ``--curve readers``: 1, 10 and 100 core tailing readers (in one reader process) on
  one stream written at ``--rate`` (1,000/s) for ``--seconds``: end-to-end latency
  over every reader's records, and the records/s delivered.

The cluster is ours (ZooKeeper + 3 bookies, fsync before ack) in ``--dir`` or a
temporary directory on the disk measured. The last stdout line is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import time
from collections.abc import Callable
from typing import Any, Final

from foundation.gctune import settle_heap
from ops.bench.compare.common import (
    Latencies,
    TailProcess,
    e2e_with_reader,
    future_sender,
    stamp_of,
)

GB: Final = 1_000_000_000
MB: Final = 1_000_000
#: Left free on the disk besides the 3 copies (the journals, the neighbours).
DISK_MARGIN_BYTES: Final = 10 * GB
BATCH_BYTES: Final = 1 << 20
BATCHES_IN_FLIGHT: Final = 4


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--curve", choices=("stored", "readers"), default="stored")
    p.add_argument("--dir", default=None, help="state directory (default: a temp dir)")
    p.add_argument("--cluster", default=None, help="cluster.json of a running cluster")
    p.add_argument("--stored-gb", type=float, default=10.0, help="stored: data to write")
    p.add_argument("--window-mb", type=float, default=100.0, help="stored: a point per window")
    p.add_argument("--record-size", type=int, default=1024, help="stored: bytes per record")
    p.add_argument("--readers", default="1,10,100", help="readers: counts to try")
    p.add_argument("--rate", type=float, default=1_000.0, help="readers: records/s written")
    p.add_argument("--seconds", type=float, default=10.0, help="readers: seconds per count")


def _check_disk(path: str, stored_bytes: float) -> dict[str, Any]:
    usage = shutil.disk_usage(path)
    need = 3 * stored_bytes + DISK_MARGIN_BYTES
    if usage.free < need:
        raise SystemExit(
            f"bench scale: {usage.free / GB:.1f} GB free under {path}, "
            f"{need / GB:.1f} GB needed (3 copies + margin); lower --stored-gb"
        )
    return {"disk_free_gb_before": round(usage.free / GB, 1)}


async def _stored(layout: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    from streams.config import NamespaceConfig
    from streams.namespace import Namespace
    from streams.records import LogRecord

    ns = await Namespace.open(layout["zk"], layout["root"], "scale", NamespaceConfig())
    name = f"scale-{os.getpid()}"
    await ns.create_stream(name)
    w = await ns.open_writer(name)
    per_call = max(1, BATCH_BYTES // args.record_size)
    batch = [LogRecord(os.urandom(args.record_size)) for _ in range(per_call)]
    call_bytes = per_call * args.record_size
    target = int(args.stored_gb * GB)
    window = int(args.window_mb * MB)
    points: list[dict[str, float]] = []
    stored = 0
    inflight: set[asyncio.Future[Any]] = set()
    settle_heap()
    t_window, at_window = time.perf_counter(), 0

    def done(_f: asyncio.Future[Any]) -> None:
        nonlocal stored, t_window, at_window
        stored += call_bytes
        if stored - at_window >= window:
            now = time.perf_counter()
            mb_s = (stored - at_window) / (now - t_window) / MB
            points.append({"stored_mb": round(at_window / MB), "mb_per_s": round(mb_s, 1),
                           "records_per_s": round(mb_s * MB / args.record_size)})  # fmt: skip
            t_window, at_window = now, stored

    try:
        sent = 0
        while sent < target:
            task = asyncio.ensure_future(w.write_many(batch))
            task.add_done_callback(inflight.discard)
            task.add_done_callback(done)
            inflight.add(task)
            sent += call_bytes
            if len(inflight) >= BATCHES_IN_FLIGHT:
                await asyncio.wait(inflight, return_when=asyncio.FIRST_COMPLETED)
        await asyncio.gather(*inflight)
    finally:
        await w.close()
        await ns.delete_stream(name)
        await ns.close()
    # Windows swing with checkpoints (and the neighbours): compare the median of the
    # windows of the first GB after the first 100 MB (the memtable's first checkpoint)
    # with the median of the last GB's.
    span = min(1_000.0, args.stored_gb * 1_000 / 10)
    first_gb = [p["mb_per_s"] for p in points if window / MB <= p["stored_mb"] < window / MB + span]
    last_gb = [p["mb_per_s"] for p in points if p["stored_mb"] >= target / MB - span]
    head_med = statistics.median(first_gb) if first_gb else 0.0
    tail_med = statistics.median(last_gb) if last_gb else 0.0
    return {
        "curve": "stored",
        "record_size": args.record_size,
        "stored_gb": args.stored_gb,
        "first_window_mb_per_s": points[0]["mb_per_s"] if points else 0.0,
        "first_gb_median_mb_per_s": round(head_med, 1),
        "last_gb_median_mb_per_s": round(tail_med, 1),
        "last_over_first": round(tail_med / head_med, 3) if head_med else None,
        "points": points,
    }


async def tail_many(params: dict[str, Any], total: int, ready: Callable[[], None]) -> Latencies:
    """``params["readers"]`` core tailing readers in this process; every reader's
    records count (``total`` is per reader)."""
    from streams.config import NamespaceConfig
    from streams.namespace import Namespace

    ns = await Namespace.open(params["zk"], params["root"], "scale", NamespaceConfig())
    lat = Latencies()
    add, perf = lat.add_s, time.perf_counter
    try:
        readers = [
            await ns.open_reader(params["stream"], "earliest") for _ in range(params["readers"])
        ]
        for r in readers:
            await r.read_next(30)  # the warm-up record
        settle_heap()
        ready()

        async def follow(reader: Any) -> None:
            got = 0
            while got < total:
                for rec in await reader.read_many(10_000):
                    add(perf() - stamp_of(rec.payload))
                    got += 1

        try:
            await asyncio.gather(*(follow(r) for r in readers))
        finally:
            for r in readers:
                await r.close()
        return lat
    finally:
        await ns.close()


async def _readers(layout: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    from streams.config import NamespaceConfig
    from streams.namespace import Namespace
    from streams.records import LogRecord

    ns = await Namespace.open(layout["zk"], layout["root"], "scale", NamespaceConfig())
    points = []
    filler = os.urandom(92)
    try:
        for count in (int(c) for c in args.readers.split(",")):
            name = f"scale-readers-{count}-{os.getpid()}"
            await ns.create_stream(name)
            w = await ns.open_writer(name)
            total = int(args.rate * args.seconds)
            params = {"zk": layout["zk"], "root": layout["root"], "stream": name,
                      "readers": count}  # fmt: skip

            def submit(payload: bytes, w: Any = w) -> asyncio.Future[Any]:
                return w.write_nowait(LogRecord(payload))  # type: ignore[no-any-return]

            send = future_sender(submit, filler)

            async def warm_up(w: Any = w) -> None:
                await w.write(LogRecord(b"warm-up"))

            started = time.perf_counter()
            try:
                result = await e2e_with_reader(
                    args.rate, args.seconds, TailProcess(tail_many, params, total), warm_up,
                    send, result_timeout_s=args.seconds * 30 + 60,
                )  # fmt: skip
            except (TimeoutError, RuntimeError) as exc:  # a point that fails is reported
                result = {"error": repr(exc)}
            finally:
                await w.close()
                await ns.delete_stream(name)
            result.pop("hist", None)
            took = time.perf_counter() - started
            points.append({"readers": count, **result, "seconds_taken": round(took, 1),
                           "delivered_per_s": round(count * total / took)})  # fmt: skip
    finally:
        await ns.close()
    return {"curve": "readers", "rate": args.rate, "points": points}


def run(args: argparse.Namespace) -> dict[str, Any]:
    from ops.bench.common import asyncio_run
    from ops.cluster.local import bench_cluster

    extra: dict[str, Any] = {}
    if args.curve == "stored":
        extra = _check_disk(args.dir or "/tmp", args.stored_gb * GB)
    with bench_cluster(args, bookies=3, prefix="bl-scale-") as layout:
        body = _stored if args.curve == "stored" else _readers
        result = asyncio_run(body(layout, args))
    return {"bench": "scale", **extra, **result}
