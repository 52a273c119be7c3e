"""The chaos workload: writer processes recording their history, and the final reads.

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
  partition) to a second topic.

Every value is unique (``<writer>.<incarnation>.<seq>``). A writer records the attempt
in its history file *before* the request is sent, then its outcome: ``ok`` with the
DLSN (or the topic offset), ``failed`` only for refusals that certainly wrote nothing
(:data:`DEFINITE_FAILURE_CODES`), ``unknown`` for everything else. Retries are the
clients' own (the thin client's idempotent retries, the topic producer's); a core
write whose outcome is unknown is never retried blindly (that could duplicate), as a
careful user would not either.

Final phase (:func:`final_phase`, after the nemesis healed everything and the writers
stopped): one *final* write per stream through that stream's own path makes a writer
take the stream over -- recovering a segment a killed writer left open, so every
acknowledged entry becomes readable -- and marks the end each reader must reach. Then
every stream is read in full through the core library (``LogReader``) and the read
proxy (catch-up record sets; a topic's partitions by offset), and every entry of every
segment's ledger is read from each bookie of its write set and its digest checked
(``replica:<bookie>`` readers), all recorded as ``read`` events for the checker.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import logging
import random
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from foundation.errors import (
    BadRequestError,
    BooklineError,
    ForbiddenError,
    InvalidNameError,
    NoEntryError,
    NotFoundError,
    TooLargeError,
    UnauthenticatedError,
    UnknownPartitionError,
)
from foundation.names import partition_stream
from groups.producer import ProducerConfig, TopicProducer
from ledger.reader import LedgerReader
from metadata.segments import SegmentMetadata
from ops.chaos.checker import Attempt, HistoryWriter, Outcome, Read, ReadEnd, ReaderKind, Status
from streams.config import NamespaceConfig
from streams.namespace import Namespace
from streams.reader import LogReader
from streams.records import LogRecord, ReadRecord
from streams.recordset import decode_read_records
from streams.writer import LogWriter
from thinclient.config import ClientConfig
from thinclient.proxy_client import ProxyClient

log = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_LAYOUT",
    "WRITER_KINDS",
    "Layout",
    "WriterSpec",
    "final_phase",
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
# An operation without an answer after this long is recorded as unknown and left.
OP_TIMEOUT_S: Final = 60.0
# On SIGTERM a writer waits this long for its operations in flight, then exits.
DRAIN_S: Final = 15.0
# Writes in flight per writer (the thin client pipelines them, in order).
IN_FLIGHT_MAX: Final = 8
# Distinct keys of a topic writer (each stays in one partition).
TOPIC_KEYS: Final = 8
# The final phase: each final write is retried this long while the cluster recovers;
# a full read gives up after this long without reaching its stream's final write.
FINAL_WRITE_DEADLINE_S: Final = 180.0
FULL_READ_DEADLINE_S: Final = 180.0
# Records per read request of the final reads; replica reads in flight at once.
READ_BATCH: Final = 1_000
REPLICA_READS_IN_FLIGHT: Final = 32
# The read paths that read every stream in full at the end.
FULL_READERS: Final = ("core", "readproxy")


@dataclass(frozen=True, slots=True)
class Layout:
    """Which streams and topics a run writes, and through which path."""

    thin_streams: tuple[str, ...] = ("chaos-thin-a", "chaos-thin-b")
    core_streams: tuple[str, ...] = ("chaos-core-a",)
    topic: str = "chaos-topic"
    core_topic: str = "chaos-topic-core"
    partitions: int = 2

    def targets(self, kind: str) -> tuple[str, ...]:
        return {
            "thin": self.thin_streams,
            "core": self.core_streams,
            "topic": (self.topic,),
            "topic-core": (self.core_topic,),
        }[kind]

    def partition_streams(self, topic: str) -> list[str]:
        return [partition_stream(topic, p) for p in range(self.partitions)]


DEFAULT_LAYOUT: Final = Layout()


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


# -- the final phase ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _StreamPlan:
    """One stream of the run: how its final write goes and how it is read."""

    stream: str
    path: str  # a writer kind
    topic: str | None = None
    partition: int | None = None


def _plans(layout: Layout) -> list[_StreamPlan]:
    plans = [_StreamPlan(s, "thin") for s in layout.thin_streams]
    plans += [_StreamPlan(s, "core") for s in layout.core_streams]
    for kind, topic in (("topic", layout.topic), ("topic-core", layout.core_topic)):
        plans += [
            _StreamPlan(partition_stream(topic, p), kind, topic, p)
            for p in range(layout.partitions)
        ]
    return plans


async def _retrying(what: str, op: Callable[[], Awaitable[tuple[str, str]]]) -> tuple[str, str]:
    """``op`` until it succeeds or :data:`FINAL_WRITE_DEADLINE_S` passes."""
    deadline = time.monotonic() + FINAL_WRITE_DEADLINE_S
    delay = 0.5
    while True:
        try:
            return await op()
        except BooklineError as exc:
            if time.monotonic() > deadline:
                raise
            log.info("final write to %s: %s; again in %.1fs", what, exc, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)


class _Final:
    """The final phase's clients and its history file."""

    def __init__(
        self, cluster_file: Path, history: HistoryWriter, layout: Layout, *, proxies: bool
    ) -> None:
        self.cluster_file = cluster_file
        self.history = history
        self.layout = layout
        self._client: ProxyClient | None = None
        if proxies:
            self._client = ProxyClient.from_cluster_file(
                cluster_file, config=ClientConfig(retry_deadline_ms=60_000)
            )
        self.ns: Namespace | None = None
        self.finals: dict[str, str] = {}  # stream -> its final value

    @property
    def client(self) -> ProxyClient:
        if self._client is None:
            raise ValueError("this final phase runs without the proxies")
        return self._client

    async def open(self) -> None:
        if self._client is not None:
            await self._client.start()
        self.ns = await Namespace.from_cluster_file(self.cluster_file, config=namespace_config())

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()
        if self.ns is not None:
            await self.ns.close()

    # -- final writes ------------------------------------------------------------------
    async def final_write(self, plan: _StreamPlan, seq: int) -> None:
        value = f"final.{plan.stream}"
        producer = f"final.{plan.path}"
        self.history.record(Attempt(value, "final", producer, plan.stream, seq, time.time()))
        try:
            position, stream = await _retrying(plan.stream, lambda: self._write(plan, value))
        except BooklineError as exc:
            status, error = classify(exc)
            self.history.record(Outcome(value, status, None, None, error, time.time()))
            raise
        self.history.record(Outcome(value, "ok", position, stream, None, time.time()))
        self.finals[plan.stream] = value

    async def _write(self, plan: _StreamPlan, value: str) -> tuple[str, str]:
        assert self.ns is not None
        if plan.path == "thin":
            return str(await self.client.write(plan.stream, value)), plan.stream
        if plan.path == "topic":
            assert plan.topic is not None
            _p, offset = await self.client.send(plan.topic, value, partition=plan.partition)
            return f"offset:{offset}", plan.stream
        # core and topic-core: a writer of our own takes the stream (recovering it)
        writer = await self.ns.open_writer(plan.stream, "final", lock_timeout_s=LOCK_TIMEOUT_S)
        try:
            if plan.path == "core":
                return str(await writer.write(LogRecord(value.encode()))), plan.stream
            _dlsns, offsets = await writer.write_many_offsets([LogRecord(value.encode())])
            return f"offset:{offsets[0]}", plan.stream
        finally:
            await writer.close()

    # -- full reads --------------------------------------------------------------------
    async def read_full(
        self, plan: _StreamPlan, reader: str, rows: Callable[[], Awaitable[list[tuple[str, str]]]]
    ) -> None:
        """Read the stream again until its final value is in it (the LAC may lag a
        moment behind the final write), then record every row."""
        final = self.finals.get(plan.stream)
        deadline = time.monotonic() + FULL_READ_DEADLINE_S
        error = "the final write failed: the end is unknown"
        got: list[tuple[str, str]] = []
        while final is not None:
            try:
                got = await rows()
            except BooklineError as exc:
                error = f"{exc.name}: {exc.message}"
                log.warning("%s read of %s: %s", reader, plan.stream, error)
            else:
                if any(value == final for _p, value in got):
                    break
                error = f"the final value was not reached ({len(got)} records read)"
            if time.monotonic() > deadline:
                break
            await asyncio.sleep(1.0)
        for position, value in got:
            self.history.record(Read(reader, "full", plan.stream, position, value))
        complete = final is not None and any(value == final for _p, value in got)
        self.history.record(
            ReadEnd(reader, "full", plan.stream, complete, None if complete else error)
        )

    async def core_rows(self, plan: _StreamPlan) -> list[tuple[str, str]]:
        assert self.ns is not None
        final = self.finals[plan.stream]
        reader: LogReader = await self.ns.open_reader(plan.stream, "earliest")
        out: list[tuple[str, str]] = []
        try:
            while True:
                batch = await reader.read_many(READ_BATCH, timeout_s=5.0)
                if not batch:
                    return out  # nothing more within the timeout
                out += [(_position(plan, r), _text(r.payload)) for r in batch]
                if out[-1][1] == final:
                    return out
        finally:
            await reader.close()

    async def proxy_rows(self, plan: _StreamPlan) -> list[tuple[str, str]]:
        final = self.finals[plan.stream]
        if plan.topic is None:
            out: list[tuple[str, str]] = []
            # A catch-up of a stream still open answers empty batches at its end.
            async for batch in self.client.catch_up(plan.stream):
                out += [(str(r.dlsn), _text(r.payload)) for r in batch]
                if not batch or out[-1][1] == final:
                    break
            return out
        assert plan.partition is not None
        rows: list[tuple[str, str]] = []
        offset = await self.client.partition_offset(plan.topic, plan.partition, "earliest")
        while True:
            page = await self.client.read_partition(plan.topic, plan.partition, offset, READ_BATCH)
            rows += [(f"offset:{row[0]}", _text(row[3])) for row in page.rows]
            if not page.rows or rows[-1][1] == final:
                return rows
            offset = page.next_offset

    # -- replicas ----------------------------------------------------------------------
    async def read_replicas(self, plan: _StreamPlan) -> dict[str, int]:
        """Every entry of every segment from each bookie of its write set; returns
        counts of entries read, missing on a replica and unreadable."""
        assert self.ns is not None
        counts = {"replica_entries": 0, "replica_missing": 0, "replica_errors": 0}
        limit = asyncio.Semaphore(REPLICA_READS_IN_FLIGHT)
        for seg, _v in await self.ns.context.segments(plan.stream):
            reader = await self.ns.context.open_segment_reader(seg)
            last = reader.metadata.last_entry_id if reader.is_closed else await reader.read_lac()
            jobs = [
                self._replica_entry(plan, seg, reader, bookie, entry_id, counts, limit)
                for entry_id in range(last + 1)
                for bookie in reader.metadata.replicas(entry_id)
            ]
            await asyncio.gather(*jobs)
        return counts

    async def _replica_entry(  # noqa: PLR0917 - one job of read_replicas
        self,
        plan: _StreamPlan,
        seg: SegmentMetadata,
        reader: LedgerReader,
        bookie: str,
        entry_id: int,
        counts: dict[str, int],
        limit: asyncio.Semaphore,
    ) -> None:
        async with limit:
            try:
                payload = await read_replica(reader, bookie, entry_id)
            except NoEntryError:
                counts["replica_missing"] += 1
                return
            except BooklineError as exc:
                counts["replica_errors"] += 1
                log.warning("replica %s of %s entry %d: %s", bookie, plan.stream, entry_id, exc)
                return
        counts["replica_entries"] += 1
        _h, records, _eos = decode_read_records(
            payload, plan.stream, seg.seqno, entry_id, seg.start_sequence_id
        )
        kind: ReaderKind = "replica"
        for r in records:
            self.history.record(
                Read(f"replica:{bookie}", kind, plan.stream, _position(plan, r), _text(r.payload))
            )


async def read_replica(reader: LedgerReader, bookie: str, entry_id: int) -> bytes:
    """One entry's payload as ``bookie`` stores it, its digest verified: the ledger
    reader's own transport, key and digest, asked of one replica only (a reader
    normally takes the first replica that answers)."""
    env = reader._env
    answer = await env.transport.read(
        bookie,
        reader.ledger_id,
        entry_id,
        fence=False,
        master_key=getattr(reader, "_key", b""),
        timeout_s=env.read_timeout_s,
    )
    return reader._digest.verify(answer.data, entry_id).payload


def _position(plan: _StreamPlan, record: ReadRecord) -> str:
    """A topic partition's records by offset (what sends are acknowledged with)."""
    return f"offset:{record.sequence_id}" if plan.topic is not None else str(record.dlsn)


def _text(payload: bytes) -> str:
    return payload.decode(errors="backslashreplace")


async def final_phase(
    cluster_file: Path,
    history_dir: Path,
    layout: Layout = DEFAULT_LAYOUT,
    *,
    full_readers: Sequence[str] = FULL_READERS,
) -> dict[str, int]:
    """Final writes, then full reads through every path and replica reads of every
    stream, into ``history_dir/final.jsonl``; returns the replica counts. Without
    proxies (``layout`` has only core streams, ``full_readers`` only ``core``) it needs
    just ZooKeeper and the bookies."""
    counts = {"replica_entries": 0, "replica_missing": 0, "replica_errors": 0}
    plans = _plans(layout)
    proxies = "readproxy" in full_readers or any(p.path in ("thin", "topic") for p in plans)
    with HistoryWriter(history_dir / "final.jsonl") as history:
        final = _Final(cluster_file, history, layout, proxies=proxies)
        await final.open()
        try:
            for seq, plan in enumerate(plans):
                with contextlib.suppress(BooklineError):  # recorded; its reads say so
                    await final.final_write(plan, seq)
            for plan in plans:
                for reader in full_readers:
                    rows = final.core_rows if reader == "core" else final.proxy_rows
                    await final.read_full(plan, reader, functools.partial(rows, plan))
                for name, n in (await final.read_replicas(plan)).items():
                    counts[name] += n
        finally:
            await final.close()
    return counts


# -- the writer process's command line ---------------------------------------------------


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m ops.chaos.workload")
    sub = parser.add_subparsers(dest="command", required=True)
    w = sub.add_parser("writer", help="one writer process of a chaos run")
    w.add_argument("--name", required=True)
    w.add_argument("--kind", required=True, choices=WRITER_KINDS)
    w.add_argument("--incarnation", type=int, required=True)
    w.add_argument("--cluster", required=True, help="cluster.json")
    w.add_argument("--history", required=True, help="history directory")
    w.add_argument("--seed", type=int, required=True)
    w.add_argument("--rate", type=float, required=True, help="writes per second")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    return asyncio.run(_writer_main(args))


if __name__ == "__main__":
    sys.exit(main())
