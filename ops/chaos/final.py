"""The chaos run's final phase: make every stream's end readable, then read it all back.

After the nemesis healed everything and the writers stopped, for every stream (and
every topic partition) of the run's :class:`~ops.chaos.workload.Layout`:

1. one *final* write through that stream's own path (thin client, a core writer, a
   send to the partition) makes a writer take the stream over -- recovering a segment a
   killed writer left open, so every acknowledged entry becomes readable -- and marks
   the end each reader must reach;
2. full reads through the core library (``LogReader``) and the read proxy (catch-up
   record sets; a topic's partitions by offset), each repeated until it reaches the
   final value;
3. every entry of every segment's ledger read from each bookie of its write set, its
   digest checked (``replica:<bookie>`` readers);
4. with the Kafka workload, the consumer group drained to the end by a last member
   (:func:`ops.chaos.kafka_clients.drain_group`: ``consumed`` and ``group_end`` events).

All of it is recorded as ``attempt``/``outcome``/``read``/``read_end`` events in
``history/final.jsonl`` for :mod:`ops.chaos.checker`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from foundation.backoff import BackoffPolicy, retry
from foundation.errors import BooklineError, NoEntryError
from foundation.names import partition_stream
from ledger.reader import LedgerReader
from metadata.segments import SegmentMetadata
from ops.chaos.checker import Attempt, HistoryWriter, Outcome, Read, ReadEnd, ReaderKind
from ops.chaos.kafka_clients import drain_group
from ops.chaos.workload import (
    DEFAULT_LAYOUT,
    LOCK_TIMEOUT_S,
    Layout,
    classify,
    namespace_config,
)
from streams.namespace import Namespace
from streams.reader import LogReader
from streams.records import LogRecord, ReadRecord
from streams.recordset import decode_read_records
from thinclient.config import ClientConfig
from thinclient.proxy_client import ProxyClient

log = logging.getLogger(__name__)

__all__ = ["FULL_READERS", "final_phase", "read_replica"]

# The final phase: each final write is retried this long while the cluster recovers;
# a full read gives up after this long without reaching its stream's final write.
FINAL_WRITE_DEADLINE_S: Final = 180.0
FULL_READ_DEADLINE_S: Final = 180.0
# The Kafka workload's group drains to the end within this (a killed member's session
# expires first, then the group rebalances onto the drain).
GROUP_DRAIN_DEADLINE_S: Final = 180.0
# Records per read request of the final reads; replica reads in flight at once.
READ_BATCH: Final = 1_000
REPLICA_READS_IN_FLIGHT: Final = 32
# The read paths that read every stream in full at the end.
FULL_READERS: Final = ("core", "readproxy")


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
    if layout.kafka_topic is not None:  # its final writes are thin-client sends
        topic = layout.kafka_topic
        plans += [
            _StreamPlan(partition_stream(topic, p), "topic", topic, p)
            for p in range(layout.kafka_partitions)
        ]
    return plans


async def _retrying(what: str, op: Callable[[], Awaitable[tuple[str, str]]]) -> tuple[str, str]:
    """``op`` until it succeeds or :data:`FINAL_WRITE_DEADLINE_S` passes."""
    policy = BackoffPolicy(delay_s=0.5, max_delay_s=5.0, deadline_s=FINAL_WRITE_DEADLINE_S)

    def note(exc: BaseException, delay_s: float) -> None:
        log.info("final write to %s: %s; again in %.1fs", what, exc, delay_s)

    return await retry(op, policy, retry_on=(BooklineError,), on_retry=note)


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


def _text(payload: bytes | None) -> str:
    return "<null>" if payload is None else payload.decode(errors="backslashreplace")


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
            if layout.kafka_topic is not None:
                drained = await asyncio.to_thread(
                    drain_group, cluster_file, layout.kafka_topic, layout.kafka_partitions,
                    history, GROUP_DRAIN_DEADLINE_S,
                )  # fmt: skip
                counts["group_drained"] = int(drained)
        finally:
            await final.close()
    return counts
