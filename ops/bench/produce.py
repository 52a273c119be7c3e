"""``bookline bench produce``: keyed records through the thin client to a topic.

Starts its own cluster (ZooKeeper, 3 bookies, one write proxy; each a process) in a
temporary directory unless ``--cluster`` names a running one, creates a topic of
``--partitions`` partitions (6), and sends ``--records`` records of ``--record-size``
bytes (100) with keys drawn from ``--keys`` distinct keys, ``--batch`` records per
``send_many`` call with ``--concurrency`` calls outstanding. Every record is keyed, so
each call is split by Kafka's partitioner over every partition. Latency is per call.
The last stdout line is one JSON object with ``records_per_s``, ``p50_ms`` and
``p99_ms``.
"""

from __future__ import annotations

import argparse
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ops.bench.common import asyncio_run, closed_loop, latency_summary, local_cluster

if TYPE_CHECKING:
    from thinclient.client import ProxyClient


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cluster", default=None, help="cluster.json of a running cluster")
    p.add_argument("--dir", default=None, help="state directory (default: a temp dir)")
    p.add_argument("--records", type=int, default=600_000, help="records to send")
    p.add_argument("--record-size", type=int, default=100, help="bytes per record (value)")
    p.add_argument("--partitions", type=int, default=6, help="partitions of the topic")
    p.add_argument("--keys", type=int, default=10_000, help="distinct keys")
    p.add_argument("--batch", type=int, default=1_000, help="records per send_many call")
    p.add_argument("--concurrency", type=int, default=8, help="send_many calls outstanding")


def _batches(args: argparse.Namespace) -> list[list[Any]]:
    """Distinct keyed batches, reused round-robin (building records is the caller's
    cost in any application; it is kept out of the timed loop as bench proxy does)."""
    from httpapi.writes import WireRecord

    value = b"v" * args.record_size
    out = []
    for b in range(max(1, min(16, args.records // args.batch))):
        start = b * args.batch
        out.append(
            [WireRecord(value, b"key-%08d" % ((start + i) % args.keys)) for i in range(args.batch)]
        )
    return out


async def _produce(client: ProxyClient, args: argparse.Namespace, topic: str) -> dict[str, Any]:

    batches = _batches(args)
    calls = max(1, args.records // args.batch)
    for p in range(args.partitions):  # acquire every partition before timing
        await client.send(topic, b"warm-up", partition=p)
    latencies: list[float] = []
    elapsed = await closed_loop(
        calls,
        args.concurrency,
        lambda i: client.send_many(topic, batches[i % len(batches)]),
        latencies,
    )
    records = calls * args.batch
    return {
        "records": records,
        "seconds": round(elapsed, 3),
        "records_per_s": round(records / elapsed),
        **latency_summary(latencies),
    }


async def _measure(cluster_file: Path, args: argparse.Namespace) -> dict[str, Any]:
    from thinclient.client import ClientConfig, ProxyClient  # aiohttp: only when measuring

    config = ClientConfig(request_timeout_ms=30_000, retry_deadline_ms=60_000)
    async with ProxyClient.from_cluster_file(cluster_file, config=config) as client:
        topic = f"bench-produce-{uuid.uuid4().hex[:8]}"
        await client.create_topic(topic, args.partitions)
        try:
            result = await _produce(client, args, topic)
        finally:
            await client.delete_topic(topic)
    return {
        "bench": "produce",
        "partitions": args.partitions,
        "record_size": args.record_size,
        "keys": args.keys,
        "batch": args.batch,
        **result,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    with local_cluster(args, write_proxies=1) as cluster_file:
        return asyncio_run(_measure(cluster_file, args))
