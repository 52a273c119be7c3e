"""``bookline bench kafka``: Bookline through its Kafka listener, driven by librdkafka
(confluent-kafka), as a Kafka user's producers and consumers would (issue 25).

Starts its own cluster (ZooKeeper, 3 bookies, one write proxy with the Kafka listener
on; each a process) in a temporary directory unless ``--cluster`` names a running one
(its ``cluster.json`` must carry ``kafka_bootstrap``; auth off), and measures:

* **produce** -- an idempotent producer (``enable.idempotence``, ``acks=all``: every
  acknowledged record fsynced on Bookline's ack quorum) sends ``--records`` keyed
  records of ``--record-size`` bytes (100) to a ``--partitions`` (6) topic, as fast as
  it takes them: records/s from the first send to the last acknowledgement, and the
  CPU time the write proxies used per record meanwhile (``proxy_cpu_us_per_record``,
  from ``/proc``: far less noisy than records/s on a shared machine; None for a
  ``--cluster`` whose proxies are not local processes).
* **consume** -- a consumer assigned every partition from the beginning reads those
  ``--records`` records back (1,000,000 by default): records/s from ``assign`` to the
  last one.
* **latency** -- open loop at ``--rate`` records/s (1,000) for ``--seconds`` (10) to a
  fresh topic, records stamped with their *scheduled* send time: the producer's
  acknowledgement latency (``ack_p50_ms``, ``ack_p99_ms``) and the end-to-end latency
  to a consumer in its own process (``e2e_p50_ms``, ``e2e_p99_ms``), both charged from
  the schedule (no coordinated omission) and kept in HdrHistogram, as ``bench
  compare`` does; and the write proxies' CPU time per record meanwhile
  (``proxy_cpu_us_per_record``: the warm-up and the consumer's fetches included).

``--phases`` runs some of them (``--phases latency``: the latency run alone; consume
reads what produce wrote, so it needs produce). The last stdout line is one JSON object.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final

from ops.bench.common import asyncio_run, local_cluster
from ops.bench.compare.common import (
    Latencies,
    TailProcess,
    e2e_with_reader,
    stamp_of,
    stamped,
    throughput,
)
from ops.bench.cpu import cpu_seconds

__all__ = ["add_arguments", "run"]

_KEYS: Final = 10_000  # distinct keys of the produce run (as bench produce)
_TIMEOUT_S: Final = 120.0  # a client call that takes longer fails the run
# Records asked of librdkafka per consume() call: amortises the Python call per record.
_CONSUME_BATCH: Final = 10_000
# The bench's phases, in the order they run (``--phases`` picks some).
PHASES: Final = ("produce", "consume", "latency")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cluster", default=None, help="cluster.json of a running cluster")
    p.add_argument("--dir", default=None, help="state directory (default: a temp dir)")
    p.add_argument("--records", type=int, default=1_000_000, help="records produced and read")
    p.add_argument("--record-size", type=int, default=100, help="bytes per record (value)")
    p.add_argument("--partitions", type=int, default=6, help="partitions of the topics")
    p.add_argument("--rate", type=float, default=1_000.0, help="latency run: records/s")
    p.add_argument("--seconds", type=float, default=10.0, help="latency run: its length")
    p.add_argument(
        "--phases",
        type=_phases,
        default=set(PHASES),
        help=f"comma-separated phases to run, of {','.join(PHASES)} (default: all)",
    )


def _phases(spec: str) -> set[str]:
    """``--phases``: the phases named, each one of :data:`PHASES`."""
    phases = {p.strip() for p in spec.split(",") if p.strip()}
    if not phases or phases - set(PHASES):
        raise argparse.ArgumentTypeError(f"{spec!r}: pick from {', '.join(PHASES)}")
    if "consume" in phases and "produce" not in phases:
        raise argparse.ArgumentTypeError("consume reads what produce wrote: name both")
    return phases


def _producer_config(bootstrap: str, linger_ms: int) -> dict[str, Any]:
    return {
        "bootstrap.servers": bootstrap,
        "enable.idempotence": True,
        "acks": "all",
        "linger.ms": linger_ms,
    }


def _write_proxy_pids(cluster_file: Path) -> list[int]:
    doc = json.loads(cluster_file.read_text())
    return [int(p["pid"]) for p in doc.get("write_proxies", []) if p.get("pid")]


def _cpu_s(pids: list[int]) -> float | None:
    """The CPU seconds ``pids`` used so far, None if one is not a local process."""
    used = [cpu_seconds(pid) for pid in pids]
    return None if not used or None in used else sum(u for u in used if u is not None)


def _bootstrap(cluster_file: Path) -> str:
    doc = json.loads(cluster_file.read_text())
    servers = doc.get("kafka_bootstrap")
    if not servers:
        raise RuntimeError(f"{cluster_file} has no kafka_bootstrap: the Kafka listener is off")
    return str(servers)


@contextmanager
def _topic(bootstrap: str, partitions: int) -> Iterator[str]:
    """A new topic of ``partitions``, deleted after."""
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    admin = AdminClient({"bootstrap.servers": bootstrap})
    name = f"bench-kafka-{uuid.uuid4().hex[:8]}"
    admin.create_topics([NewTopic(name, partitions)])[name].result(_TIMEOUT_S)
    try:
        yield name
    finally:
        admin.delete_topics([name])[name].result(_TIMEOUT_S)


def _warm_up(producer: Any, topic: str, partitions: int) -> None:
    """One record to every partition, acknowledged: the partitions are owned, the
    producer id assigned and the connections open before anything is timed."""
    for p in range(partitions):
        producer.produce(topic, b"warm-up", partition=p)
    if producer.flush(_TIMEOUT_S) != 0:
        raise RuntimeError("the warm-up records were not acknowledged")


def _produce(
    bootstrap: str, topic: str, args: argparse.Namespace, proxies: list[int]
) -> dict[str, Any]:
    from confluent_kafka import Producer

    errors: list[Any] = []
    producer = Producer(
        _producer_config(bootstrap, linger_ms=5) | {"delivery.report.only.error": True}
    )
    _warm_up(producer, topic, args.partitions)
    value, keys = b"v" * args.record_size, [b"key-%08d" % k for k in range(_KEYS)]
    produce, poll = producer.produce, producer.poll
    cpu_before = _cpu_s(proxies)
    start = time.perf_counter()
    for i in range(args.records):
        while True:
            try:
                produce(topic, value, keys[i % _KEYS], on_delivery=lambda e, _m: errors.append(e))
                break
            except BufferError:  # librdkafka's queue is full: serve its reports, retry
                poll(0.01)
    left = producer.flush(_TIMEOUT_S)
    elapsed = time.perf_counter() - start
    cpu_after = _cpu_s(proxies)
    if left or errors:
        raise RuntimeError(f"produce: {left} records unacknowledged, errors {errors[:3]}")
    cpu = None
    if cpu_before is not None and cpu_after is not None:
        cpu = round((cpu_after - cpu_before) / args.records * 1e6, 2)
    return throughput(args.records, args.record_size, elapsed) | {"proxy_cpu_us_per_record": cpu}


def _consume(bootstrap: str, topic: str, args: argparse.Namespace) -> dict[str, Any]:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-{topic}",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 100,
        }
    )
    total = args.records + args.partitions  # and the warm-up records
    try:
        start = time.perf_counter()
        parts = [TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(args.partitions)]
        consumer.assign(parts)
        got, deadline = 0, start + _TIMEOUT_S
        while got < total:
            batch = consumer.consume(_CONSUME_BATCH, 1.0)
            for msg in batch:
                if msg.error() is not None:
                    raise RuntimeError(f"consume: {msg.error()}")
            got += len(batch)
            if not batch and time.perf_counter() > deadline:
                raise TimeoutError(f"consume: {got} of {total} records after {_TIMEOUT_S} s")
            deadline = time.perf_counter() + _TIMEOUT_S if batch else deadline
        elapsed = time.perf_counter() - start
    finally:
        consumer.close()
    return throughput(total, args.record_size, elapsed)


async def tail_kafka(params: dict[str, Any], total: int, ready: Callable[[], None]) -> Latencies:
    """The e2e reader (in its own process): every partition from the beginning, the
    warm-up records first, then ``total`` stamped records."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    from foundation.gctune import settle_heap

    topic, partitions = params["topic"], params["partitions"]
    consumer = Consumer(
        {
            "bootstrap.servers": params["bootstrap"],
            "group.id": f"bench-e2e-{topic}",
            "enable.auto.commit": False,
            "fetch.wait.max.ms": 100,
        }
    )
    lat, perf = Latencies(), time.perf_counter
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        warm = got = 0
        while got < total:
            # poll, one record at a time: consume(n, timeout) would hold records back
            # until n arrived or the timeout passed, and charge that to the system.
            msg = consumer.poll(0.1)
            if msg is None:
                continue
            if msg.error() is not None:
                raise RuntimeError(f"e2e reader: {msg.error()}")
            if warm < partitions:  # the warm-up records come first on each partition
                warm += 1
                if warm == partitions:
                    settle_heap()
                    ready()
                continue
            lat.add_s(perf() - stamp_of(msg.value()))
            got += 1
        return lat
    finally:
        consumer.close()


class _Poller:
    """Serves a producer's delivery reports on its own thread as they come (librdkafka
    calls them only from ``poll``)."""

    def __init__(self, producer: Any) -> None:
        self._producer = producer
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="bench-kafka-poll", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self._producer.poll(0.05)

    def __enter__(self) -> _Poller:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()


async def _latency(bootstrap: str, topic: str, args: argparse.Namespace) -> dict[str, Any]:
    from confluent_kafka import Producer

    loop = asyncio.get_running_loop()
    # linger 0: each record is sent as it comes, as a latency-minded producer is set.
    producer = Producer(_producer_config(bootstrap, linger_ms=0))
    filler = os.urandom(max(0, args.record_size - 8))
    total = max(1, int(args.rate * args.seconds))
    reader = TailProcess(
        tail_kafka, {"bootstrap": bootstrap, "topic": topic, "partitions": args.partitions}, total
    )

    async def warm_up() -> None:
        await asyncio.to_thread(_warm_up, producer, topic, args.partitions)

    def send(scheduled: float, lat: Latencies, done: Callable[..., None]) -> None:
        def delivered(err: Any, _msg: Any) -> None:  # on the poller's thread
            if err is None:
                lat.since(scheduled)
            failure = None if err is None else RuntimeError(f"produce: {err}")
            loop.call_soon_threadsafe(done, failure)

        producer.produce(topic, stamped(scheduled, filler), on_delivery=delivered)

    with _Poller(producer):
        result = await e2e_with_reader(args.rate, args.seconds, reader, warm_up, send)
    result.pop("hist", None)
    return result


def _measure(bootstrap: str, args: argparse.Namespace, proxies: list[int]) -> dict[str, Any]:
    phases: set[str] = args.phases
    produced: dict[str, Any] = {}
    consumed: dict[str, Any] = {}
    latency: dict[str, Any] = {}
    if "produce" in phases:
        with _topic(bootstrap, args.partitions) as topic:
            produced = _produce(bootstrap, topic, args, proxies)
            if "consume" in phases:
                consumed = _consume(bootstrap, topic, args)
    if "latency" in phases:
        with _topic(bootstrap, args.partitions) as topic:
            cpu_before = _cpu_s(proxies)
            latency = asyncio_run(_latency(bootstrap, topic, args))
            cpu_after = _cpu_s(proxies)
        if cpu_before is not None and cpu_after is not None:
            used = (cpu_after - cpu_before) / max(1, latency["records"]) * 1e6
            latency["proxy_cpu_us_per_record"] = round(used, 2)
    return {
        "bench": "kafka",
        "client": "librdkafka (confluent-kafka), idempotent, acks=all",
        "partitions": args.partitions,
        "record_size": args.record_size,
        "records": args.records,
        "phases": [p for p in PHASES if p in phases],
        "produce_records_per_s": produced.get("records_per_s"),
        "produce_proxy_cpu_us_per_record": produced.get("proxy_cpu_us_per_record"),
        "consume_records_per_s": consumed.get("records_per_s"),
        "ack_p50_ms": latency.get("ack_p50_ms"),
        "ack_p99_ms": latency.get("ack_p99_ms"),
        "e2e_p50_ms": latency.get("p50_ms"),
        "e2e_p99_ms": latency.get("p99_ms"),
        "produce": produced,
        "consume": consumed,
        "latency": latency,
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    with local_cluster(args, write_proxies=1, kafka=True) as cluster_file:
        return _measure(_bootstrap(cluster_file), args, _write_proxy_pids(cluster_file))
