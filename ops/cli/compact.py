"""``bookline topic compact NAME [--namespace NS] [--json]``: compact a topic now.

Compaction is a job run here, not by the proxies: it opens the namespace from the
cluster file (ZooKeeper and the bookies, with the credentials the file names), rewrites
every partition's cleanable sealed segments (:mod:`streams.compaction`) and prints what
it reclaimed. The partitions' writers keep writing meanwhile (the job touches sealed
segments only). A topic whose ``cleanup.policy`` lacks ``compact`` is refused (exit 1,
BAD_REQUEST).
``--metrics-file PATH`` also writes the run's counters in Prometheus' text format (for a
node exporter's textfile collector: a batch job has no endpoint to scrape).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from foundation.names import validate_name
from ops.cli.compact_metrics import CompactionMetrics

__all__ = ["register_compact"]


def register_compact(
    ops: argparse._SubParsersAction[argparse.ArgumentParser],
    common: Callable[[argparse.ArgumentParser], None],
    check_cluster: Callable[[argparse.Namespace], None],
) -> None:
    q = ops.add_parser("compact", help="compact a topic now (cleanup.policy compact)")
    common(q)
    q.add_argument("name", help="topic name")
    q.add_argument("--namespace", default="default", help="the namespace the proxies serve")
    q.add_argument("--metrics-file", default=None, help="write the run's metrics here")

    def run(args: argparse.Namespace) -> int:
        check_cluster(args)
        validate_name(args.name, "topic")
        return asyncio.run(_compact(args))

    q.set_defaults(handler=run)


async def _compact(args: argparse.Namespace) -> int:
    from streams.compaction import compact_topic
    from streams.namespace import Namespace

    metrics = CompactionMetrics()
    started = time.monotonic()
    async with await Namespace.from_cluster_file(args.cluster, args.namespace) as ns:
        try:
            policy, report = await compact_topic(ns.context, args.name)
        except BaseException:
            metrics.failed(args.name)
            _write_metrics(metrics, args.metrics_file)
            raise
    seconds = time.monotonic() - started
    metrics.record(args.name, report, seconds)
    _write_metrics(metrics, args.metrics_file)
    out: dict[str, Any] = {
        "topic": args.name,
        "delete_retention_ms": policy.delete_retention_ms,
        "segments_scanned": report.segments_scanned,
        "segments_rewritten": report.segments_rewritten,
        "records_read": report.records_read,
        "records_removed": report.records_removed,
        "tombstones_removed": report.tombstones_removed,
        "bytes_before": report.bytes_before,
        "bytes_after": report.bytes_after,
        "bytes_reclaimed": report.bytes_reclaimed,
        "seconds": round(seconds, 3),
    }
    if args.json:
        print(json.dumps(out))
    else:
        print(
            f"compacted topic {args.name}: {report.segments_rewritten} of "
            f"{report.segments_scanned} segment(s) rewritten, {report.records_removed} of "
            f"{report.records_read} records removed ({report.tombstones_removed} tombstones), "
            f"{report.bytes_reclaimed} bytes reclaimed"
        )
    return 0


def _write_metrics(metrics: CompactionMetrics, path: str | None) -> None:
    if path:
        Path(path).write_bytes(metrics.exposition())
