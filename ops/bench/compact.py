"""``bookline bench compact``: compaction of one stream, Kafka's way of testing a
compacted topic -- ``--keys`` keys each written ``--rounds`` times (``--value-size``
bytes), then ``--tombstones`` of them deleted (a null value), in sealed segments. The
tombstones are younger than ``delete.retention.ms`` (a day), so they stay.
Starts ZooKeeper + 3 bookies unless ``--cluster`` names a running one. Reports the
records compacted per second (records read by the run over its time), the records and
bytes it removed, and a check that a full read holds one record per key.
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

from ops.bench.common import asyncio_run
from ops.bench.ledger import cluster_endpoints

__all__ = ["add_arguments", "run"]


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cluster", default=None, help="cluster.json of a running cluster")
    p.add_argument("--dir", default=None, help="state directory (default: a temp dir)")
    p.add_argument("--keys", type=int, default=10_000, help="distinct keys")
    p.add_argument("--rounds", type=int, default=20, help="values written per key")
    p.add_argument("--value-size", type=int, default=100, help="bytes per value")
    p.add_argument("--tombstones", type=int, default=1_000, help="keys deleted at the end")
    p.add_argument("--segment-bytes", type=int, default=4 << 20, help="segment roll size")


def run(args: argparse.Namespace) -> dict[str, Any]:
    with cluster_endpoints(args) as (zk, root):
        return asyncio_run(_bench(zk, root, args))


async def _bench(zk: str, root: str, args: argparse.Namespace) -> dict[str, Any]:
    from metadata.streams import StreamOptions
    from streams.compaction_plan import CompactionPolicy
    from streams.config import NamespaceConfig
    from streams.namespace import Namespace
    from streams.records import LogRecord

    ns = await Namespace.open(zk, root, "bench", NamespaceConfig())
    try:
        name = f"compact-{os.getpid()}"
        await ns.create_stream(name, StreamOptions(segment_rollover_bytes=args.segment_bytes))
        w = await ns.open_writer(name)
        value = os.urandom(args.value_size)
        for _r in range(args.rounds):
            await w.write_many([LogRecord(value, key=b"%d" % k) for k in range(args.keys)])
        await w.write_many([LogRecord(None, key=b"%d" % k) for k in range(args.tombstones)])
        await w.close()
        t0 = time.perf_counter()
        report = await ns.compact(name, CompactionPolicy(compact=True))
        seconds = time.perf_counter() - t0
        reader = await ns.open_reader(name, "earliest")
        kept = 0
        while kept < args.keys:
            batch = await reader.read_many(10_000, timeout_s=30)
            if not batch:
                break
            kept += len(batch)
        await reader.close()
        return {
            "keys": args.keys,
            "rounds": args.rounds,
            "tombstones": args.tombstones,
            "value_bytes": args.value_size,
            "segments_rewritten": report.segments_rewritten,
            "records_read": report.records_read,
            "records_removed": report.records_removed,
            "seconds": round(seconds, 2),
            "records_compacted_per_s": round(report.records_read / seconds),
            "bytes_before": report.bytes_before,
            "bytes_after": report.bytes_after,
            "bytes_reclaimed": report.bytes_reclaimed,
            "records_after": kept,
            "one_record_per_key": kept == args.keys,
        }
    finally:
        await ns.close()
