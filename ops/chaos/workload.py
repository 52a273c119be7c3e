"""The chaos workload: writer processes recording their history.

Writers (``python -m ops.chaos.workload writer ...``, one OS process each, so the
nemesis can ``kill -9`` one; restarted as a new *incarnation* with a new producer id):

* ``thin`` -- :class:`~thinclient.proxy_client.ProxyClient` ``write`` through the write
  proxies (idempotent producer: its own retries never duplicate) to the thin streams;
* ``core`` -- the core library's :class:`~streams.writer.LogWriter` to the core
  stream (a failed writer is closed and opened again; a new incarnation waits for the
  killed one's ZooKeeper session to expire before it gets the stream's lock);
* ``topic`` -- thin client ``send`` to a topic (keyed, so a producer's records of one
  key stay in one partition, in order);
* ``topic-core`` -- :class:`~groups.producer.TopicProducer` (core writers per
  partition) to a second topic;
* ``kafka-producer`` and ``kafka-consumer`` -- librdkafka's idempotent producer and a
  consumer group's members over the Kafka listeners (:mod:`ops.chaos.kafka_clients`;
  the ``kafka`` workload, :data:`KAFKA_LAYOUT`).

Every value is unique (``<writer>.<incarnation>.<seq>``). A writer records the attempt
in its history file *before* the request is sent, then its outcome: ``ok`` with the
DLSN (or the topic offset), ``failed`` only for refusals that certainly wrote nothing
(:data:`DEFINITE_FAILURE_CODES`), ``unknown`` for everything else. Retries are the
clients' own (the thin client's idempotent retries, the topic producer's); a core
write whose outcome is unknown is never retried blindly (that could duplicate), as a
careful user would not either.

The final phase (reading everything back) is :mod:`ops.chaos.final`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import random
import signal
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from foundation.errors import (
    BadRequestError,
    BooklineError,
    ForbiddenError,
    InvalidNameError,
    NotFoundError,
    TooLargeError,
    UnauthenticatedError,
    UnknownPartitionError,
)
from foundation.names import partition_stream
from groups.producer import ProducerConfig, TopicProducer
from ops.chaos.checker import Attempt, HistoryWriter, Outcome, Status
from ops.chaos.kafka_clients import KAFKA_KINDS, KafkaSpec, run_kafka_writer
from streams.config import NamespaceConfig
from streams.namespace import Namespace
from streams.records import LogRecord
from streams.writer import LogWriter
from thinclient.proxy_client import ProxyClient

log = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_LAYOUT",
    "DRAIN_S",
    "KAFKA_LAYOUT",
    "LOCK_TIMEOUT_S",
    "WORKLOADS",
    "WRITER_KINDS",
    "Layout",
    "WriterSpec",
    "classify",
    "namespace_config",
    "run_writer",
    "writer_argv",
]

WRITER_KINDS: Final = ("thin", "core", "topic", "topic-core")
# Refusals that certainly wrote nothing; any other error leaves the outcome unknown.
DEFINITE_FAILURE_CODES: Final = frozenset(
    cls.code
    for cls in (
        BadRequestError,
        InvalidNameError,
        TooLargeError,
        NotFoundError,
        UnknownPartitionError,
        UnauthenticatedError,
        ForbiddenError,
    )
)
# ZooKeeper session of the core writers: how long a killed writer keeps its stream's
# lock from its next incarnation.
WRITER_SESSION_TIMEOUT_MS: Final = 4_000
# A new incarnation waits this long for a killed one's lock (its session expiring).
LOCK_TIMEOUT_S: Final = 30.0
# On SIGTERM a writer waits this long for its operations in flight, then exits.
DRAIN_S: Final = 15.0
# Writes in flight per writer (the thin client pipelines them, in order).
IN_FLIGHT_MAX: Final = 8
# Distinct keys of a topic writer (each stays in one partition).
TOPIC_KEYS: Final = 8


@dataclass(frozen=True, slots=True)
class Layout:
    """Which streams and topics a run writes, and through which path."""

    thin_streams: tuple[str, ...] = ("chaos-thin-a", "chaos-thin-b")
    core_streams: tuple[str, ...] = ("chaos-core-a",)
    topic: str = "chaos-topic"
    core_topic: str = "chaos-topic-core"
    partitions: int = 2  # of both topics above (0: no topics)
    # The Kafka workload's topic (written and consumed over the Kafka listeners).
    kafka_topic: str | None = None
    kafka_partitions: int = 6
    # The writer processes, by kind (a kind may come more than once).
    writers: tuple[str, ...] = WRITER_KINDS

    def targets(self, kind: str) -> tuple[str, ...]:
        return {
            "thin": self.thin_streams,
            "core": self.core_streams,
            "topic": (self.topic,),
            "topic-core": (self.core_topic,),
            "kafka-producer": (self.kafka_topic or "",),
            "kafka-consumer": (self.kafka_topic or "",),
        }[kind]

    def partition_streams(self, topic: str) -> list[str]:
        return [partition_stream(topic, p) for p in range(self.partitions)]

    def writer_names(self) -> list[tuple[str, str]]:
        """(name, kind) of every writer process: ``w-KIND``, numbered when repeated."""
        out = []
        for i, kind in enumerate(self.writers):
            repeated = self.writers.count(kind) > 1
            number = self.writers[: i + 1].count(kind)
            out.append((f"w-{kind}-{number}" if repeated else f"w-{kind}", kind))
        return out


DEFAULT_LAYOUT: Final = Layout()
# ``bookline chaos --workload kafka``: two idempotent librdkafka producers and a group
# of three librdkafka consumers on one 6-partition topic, nothing else.
KAFKA_LAYOUT: Final = Layout(
    thin_streams=(), core_streams=(), partitions=0, kafka_topic="chaos-kafka",
    writers=("kafka-producer", "kafka-producer", "kafka-consumer", "kafka-consumer",
             "kafka-consumer"),
)  # fmt: skip
WORKLOADS: Final = {"bookline": DEFAULT_LAYOUT, "kafka": KAFKA_LAYOUT}


def classify(exc: BaseException) -> tuple[Status, str]:
    """(status, error) of a failed operation: ``failed`` only when nothing was written."""
    if isinstance(exc, BooklineError):
        status: Status = "failed" if exc.code in DEFINITE_FAILURE_CODES else "unknown"
        return status, f"{exc.name}: {exc.message}"[:300]
    return "unknown", repr(exc)[:300]


def namespace_config() -> NamespaceConfig:
    return NamespaceConfig(session_timeout_ms=WRITER_SESSION_TIMEOUT_MS)


# -- one writer process -------------------------------------------------------------------


class _Path:
    """How one kind of writer writes a value: returns (position, stream)."""

    async def open(self) -> None: ...

    async def write(self, target: str, value: str, seq: int) -> tuple[str, str]:
        raise NotImplementedError

    async def close(self) -> None: ...


class _ThinPath(_Path):
    def __init__(self, cluster_file: Path, producer: str, topic: bool) -> None:
        # A new process is a new producer: the client picks a fresh producer id.
        self._client = ProxyClient.from_cluster_file(cluster_file)
        self._topic = topic

    async def open(self) -> None:
        await self._client.start()

    async def warm(self, topic: str) -> None:
        """Learn the partition count before the first send: sends waiting for it
        would go out in whatever order they wake."""
        await self._client.partitions_for(topic)

    async def write(self, target: str, value: str, seq: int) -> tuple[str, str]:
        if self._topic:
            p, offset = await self._client.send(target, value, key=f"k{seq % TOPIC_KEYS}")
            return f"offset:{offset}", partition_stream(target, p)
        dlsn = await self._client.write(target, value)
        return str(dlsn), target

    async def close(self) -> None:
        await self._client.close()


class _CorePath(_Path):
    """LogWriters per stream; a failed one is closed and opened again (in order: the
    lock is FIFO, and the write is handed over before the lock is let go)."""

    def __init__(self, cluster_file: Path, producer: str) -> None:
        self._cluster_file = cluster_file
        self._producer = producer
        self._ns: Namespace | None = None
        self._writers: dict[str, LogWriter] = {}
        self._lock = asyncio.Lock()

    async def open(self) -> None:
        self._ns = await Namespace.from_cluster_file(self._cluster_file, config=namespace_config())

    async def _writer(self, stream: str) -> LogWriter:
        assert self._ns is not None
        writer = self._writers.get(stream)
        if writer is not None and writer.failed is not None:
            log.info("writer of %s failed (%s): opening another", stream, writer.failed)
            del self._writers[stream]
            with contextlib.suppress(BooklineError):
                await writer.close()
            writer = None
        if writer is None:
            writer = await self._ns.open_writer(
                stream, self._producer, lock_timeout_s=LOCK_TIMEOUT_S
            )
            self._writers[stream] = writer
        return writer

    async def write(self, target: str, value: str, seq: int) -> tuple[str, str]:
        async with self._lock:
            writer = await self._writer(target)
            fut = writer.write_nowait(LogRecord(value.encode()))
        return str(await fut), target

    async def close(self) -> None:
        for writer in self._writers.values():
            with contextlib.suppress(BooklineError):
                await writer.close()
        if self._ns is not None:
            await self._ns.close()


class _TopicCorePath(_Path):
    def __init__(self, cluster_file: Path, producer: str) -> None:
        self._cluster_file = cluster_file
        self._producer = producer
        self._ns: Namespace | None = None
        self._tp: TopicProducer | None = None

    async def open(self) -> None:
        self._ns = await Namespace.from_cluster_file(self._cluster_file, config=namespace_config())
        self._tp = TopicProducer(
            self._ns, config=ProducerConfig(lock_timeout_s=LOCK_TIMEOUT_S), identity=self._producer
        )

    async def write(self, target: str, value: str, seq: int) -> tuple[str, str]:
        assert self._tp is not None
        p, offset = await self._tp.send(target, value, key=f"k{seq % TOPIC_KEYS}")
        return f"offset:{offset}", partition_stream(target, p)

    async def close(self) -> None:
        if self._tp is not None:
            with contextlib.suppress(BooklineError):
                await self._tp.close()
        if self._ns is not None:
            await self._ns.close()


def _make_path(kind: str, cluster_file: Path, producer: str) -> _Path:
    if kind in ("thin", "topic"):
        return _ThinPath(cluster_file, producer, topic=kind == "topic")
    if kind == "core":
        return _CorePath(cluster_file, producer)
    return _TopicCorePath(cluster_file, producer)


@dataclass
class _WriterRun:
    name: str
    producer: str
    targets: tuple[str, ...]
    path: _Path
    history: HistoryWriter
    rng: random.Random
    rate_per_s: float

    async def one(self, target: str, value: str, seq: int) -> None:
        try:
            position, stream = await self.path.write(target, value, seq)
        except (BooklineError, OSError, TimeoutError) as exc:  # recorded; the run goes on
            status, error = classify(exc)
            self.history.record(Outcome(value, status, None, None, error, time.time()))
            return
        self.history.record(Outcome(value, "ok", position, stream, None, time.time()))

    async def run(self, stop: asyncio.Event) -> None:
        in_flight = asyncio.Semaphore(IN_FLIGHT_MAX)
        tasks: set[asyncio.Task[None]] = set()
        seq = 0
        while not stop.is_set():
            await in_flight.acquire()
            target = self.rng.choice(self.targets)
            value = f"{self.producer}.{seq}"
            self.history.record(Attempt(value, self.name, self.producer, target, seq, time.time()))
            task = asyncio.create_task(self.one(target, value, seq))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            task.add_done_callback(lambda _t: in_flight.release())
            seq += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.rng.expovariate(self.rate_per_s))
        if tasks:
            await asyncio.wait(tasks, timeout=DRAIN_S)


@dataclass(frozen=True, slots=True)
class WriterSpec:
    """One incarnation of one writer."""

    name: str
    kind: str
    incarnation: int
    cluster_file: Path
    history_dir: Path
    seed: int
    rate_per_s: float
    layout: Layout = DEFAULT_LAYOUT

    @property
    def producer(self) -> str:
        return f"{self.name}.{self.incarnation}"


async def run_writer(spec: WriterSpec, stop: asyncio.Event) -> None:
    """Write until ``stop`` is set, then wait up to :data:`DRAIN_S` for what is in
    flight; the history goes to ``<history_dir>/<name>.<incarnation>.jsonl``."""
    rng = random.Random(f"{spec.seed}/{spec.name}/{spec.incarnation}")
    history = HistoryWriter(spec.history_dir / f"{spec.producer}.jsonl")
    path = _make_path(spec.kind, spec.cluster_file, spec.producer)
    try:
        await path.open()
        if isinstance(path, _ThinPath) and spec.kind == "topic":
            await path.warm(spec.layout.topic)  # the sends that follow keep their order
        print(f"writer {spec.producer} ready", flush=True)
        targets = spec.layout.targets(spec.kind)
        run = _WriterRun(spec.name, spec.producer, targets, path, history, rng, spec.rate_per_s)
        await run.run(stop)
    finally:
        with contextlib.suppress(BooklineError, TimeoutError):
            await asyncio.wait_for(path.close(), DRAIN_S)
        history.close()


def _kafka_writer_main(args: argparse.Namespace) -> int:
    """librdkafka's clients are synchronous: a plain loop, SIGTERM sets ``stop``."""
    topic = KAFKA_LAYOUT.kafka_topic
    assert topic is not None
    spec = KafkaSpec(args.name, args.kind, args.incarnation, Path(args.cluster),
                     Path(args.history), args.rate, topic, args.seed)  # fmt: skip
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda _n, _f: stop.set())
    run_kafka_writer(spec, stop)
    return 0


async def _writer_main(args: argparse.Namespace) -> int:
    spec = WriterSpec(args.name, args.kind, args.incarnation, Path(args.cluster),
                      Path(args.history), args.seed, args.rate)  # fmt: skip
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await run_writer(spec, stop)
    return 0


def writer_argv(
    *, name: str, kind: str, incarnation: int, cluster_file: Path, history: Path, seed: int,
    rate_per_s: float,
) -> list[str]:  # fmt: skip
    """The command line of one writer process."""
    return [
        sys.executable, "-m", "ops.chaos.workload", "writer", "--name", name, "--kind", kind,
        "--incarnation", str(incarnation), "--cluster", str(cluster_file),
        "--history", str(history), "--seed", str(seed), "--rate", str(rate_per_s),
    ]  # fmt: skip


# -- the writer process's command line ---------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m ops.chaos.workload")
    sub = parser.add_subparsers(dest="command", required=True)
    w = sub.add_parser("writer", help="one writer process of a chaos run")
    w.add_argument("--name", required=True)
    w.add_argument("--kind", required=True, choices=(*WRITER_KINDS, *KAFKA_KINDS))
    w.add_argument("--incarnation", type=int, required=True)
    w.add_argument("--cluster", required=True, help="cluster.json")
    w.add_argument("--history", required=True, help="history directory")
    w.add_argument("--seed", type=int, required=True)
    w.add_argument("--rate", type=float, required=True, help="writes per second")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if args.kind in KAFKA_KINDS:
        return _kafka_writer_main(args)
    return asyncio.run(_writer_main(args))


if __name__ == "__main__":
    sys.exit(main())
