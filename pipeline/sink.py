"""Batch and streaming writes of the ``bookline`` data source, exactly once per batch id.

Each row becomes one record: ``value`` (required) is the payload; ``key``, ``headers``
and ``stream`` / ``topic`` (the target; else the ``stream`` / ``topic`` option) are
optional. Strings are written as UTF-8.

Exactly once. Spark re-runs a task after a failure and replays a whole micro-batch
after a restart, so a task may find its rows already (partly) written. Every record a
task writes carries the header ``bookline.spark`` = ``"<query>:<batch>:<partition>"``
(the query id is stable across restarts from a checkpoint; a batch write uses a fresh
id and batch 0, or the options ``writeId`` and ``batchId`` - what ``foreachBatch``
should pass, so a replayed micro-batch is skipped). Writes to a stream are serialised
by its single-writer lock, and a task holds the lock while it checks what is there and
writes:

1. A *sink marker* per (query, partition, stream) - a subscription named
   ``spark-sink.<query>.<partition>`` - points at the last record of the last task that
   *completed* (before the first batch: at the stream's end, or before every record of
   an empty stream). If that record's tag says batch >= ours, the batch is already
   written: skip every row.
2. Otherwise the records after the marker are scanned for our tag; their digests
   (key, value, headers) form a multiset, and a row whose digest is in it is skipped
   once. This covers a task that died after writing some or all rows but before moving
   the marker, and does not depend on the replayed rows coming in the same order.
3. After writing, the marker moves to our last tagged record.

Costs and limits: step 2 reads the records written since this partition's previous
batch (usually one batch of all partitions); the first batch of a query on an existing
stream starts from the stream's end (the marker is set before writing). Speculative
execution (two live attempts of one task) is not supported. A partition holding rows
for several streams writes them in runs, releasing a stream's lock between runs, so
two tasks never wait on each other's locks; repartition by stream for fewer switches.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import logging
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import (
    DataSourceStreamWriter,
    DataSourceWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from foundation.errors import (
    AlreadyExistsError,
    BadRequestError,
    LockOwnedError,
)
from pipeline import client
from pipeline.options import SinkOptions, parse_sink_options
from pipeline.schema import SINK_COLUMNS
from streams.dlsn import DLSN
from streams.records import LogRecord, ReadRecord

if TYPE_CHECKING:
    from streams.sync import SyncNamespace

log = logging.getLogger(__name__)

__all__ = [
    "TAG_HEADER",
    "BooklineBatchWriter",
    "BooklineStreamWriter",
    "check_sink_schema",
    "parse_sink_options",
]

# The header that tags every record a Spark task writes: "<query>:<batch>:<partition>".
TAG_HEADER = "bookline.spark"
# Spark's task-local properties naming the streaming query and micro-batch.
QUERY_ID_PROPERTY = "sql.streaming.queryId"
BATCH_ID_PROPERTY = "streaming.sql.batchId"
# Records per write_many call: pipelines writes without holding a whole partition.
WRITE_BATCH_RECORDS = 2_000
# Entries per read_entries call while scanning for already-written rows.
SCAN_BATCH_ENTRIES = 256
# Sink marker of a (query, partition) that started on an empty stream: before every
# record (segment seqnos start at 1), so it never names a record of ours.
BEFORE_ALL = DLSN(0, 0, 0)


def check_sink_schema(schema: StructType, overwrite: bool) -> None:
    names = schema.fieldNames()
    if "value" not in names:
        raise BadRequestError("a DataFrame written to bookline needs a 'value' column")
    extra = sorted(set(names) - SINK_COLUMNS)
    if extra:
        raise BadRequestError(
            f"columns {extra} cannot be written to bookline (allowed: {sorted(SINK_COLUMNS)})"
        )
    if overwrite:
        raise BadRequestError("bookline streams are append-only: use mode 'append'")


def _bytes(value: object, column: str) -> bytes | None:
    if value is None:
        return None
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8")
    raise BadRequestError(f"column {column!r} must be binary or string, got {type(value).__name__}")


def _headers(value: object) -> dict[str, bytes]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise BadRequestError(f"column 'headers' must be a map, got {type(value).__name__}")
    out: dict[str, bytes] = {}
    for k, v in value.items():
        if k == TAG_HEADER:
            raise BadRequestError(f"header {TAG_HEADER!r} is reserved for exactly-once writes")
        b = _bytes(v, "headers")
        out[str(k)] = b if b is not None else b""
    return out


def digest(key: bytes | None, payload: bytes, headers: dict[str, bytes] | None) -> bytes:
    """Identity of a row's content, ignoring the tag header (order-independent dedup)."""
    h = hashlib.blake2b(digest_size=16)
    h.update(b"k" + (key if key is not None else b"\xff"))
    h.update(len(payload).to_bytes(8, "big") + payload)
    for name in sorted(headers or {}):
        if name != TAG_HEADER:
            value = (headers or {})[name]
            h.update(name.encode() + b"\x00" + len(value).to_bytes(8, "big") + value)
    return h.digest()


@dataclass(frozen=True, slots=True)
class Tag:
    query: str
    batch: int
    partition: int

    def encode(self) -> bytes:
        return f"{self.query}:{self.batch}:{self.partition}".encode()

    @classmethod
    def decode(cls, raw: bytes | None) -> Tag | None:
        if raw is None:
            return None
        try:
            query, batch, partition = raw.decode().rsplit(":", 2)
            return cls(query, int(batch), int(partition))
        except (UnicodeDecodeError, ValueError):
            return None  # a header somebody else set; not ours

    def subscriber(self) -> str:
        return f"spark-sink.{self.query}.{self.partition}"


@dataclass
class _StreamState:
    """What one task attempt knows about one target stream."""

    stream: str
    skip_all: bool = False
    already: collections.Counter[bytes] = field(default_factory=collections.Counter)
    last_tagged: DLSN | None = None
    written: int = 0
    skipped: int = 0


@dataclass
class BooklineCommitMessage(WriterCommitMessage):
    written: dict[str, int]
    skipped: dict[str, int]


def _open_writer(ns: SyncNamespace, stream: str, identity: str, wait_ms: int) -> Any:
    """Open the stream's writer, waiting up to ``wait_ms`` for a lock another task holds
    (or a crashed task's ZooKeeper session holds until it expires)."""
    try:
        return ns.open_writer(stream, identity=identity, lock_timeout_s=wait_ms / 1000.0)
    except LockOwnedError as exc:
        raise LockOwnedError(
            f"stream {stream!r}: writer lock still held by {exc.owner!r} after {wait_ms} ms "
            "(option lockWaitMs)",
            owner=exc.owner,
        ) from exc


def _records_after(ns: SyncNamespace, stream: str, marker: DLSN) -> Iterator[ReadRecord]:
    """Every readable record at or after ``marker``, straight from the segments.

    The caller holds the writer lock, so the segments before the writer's own are sealed
    and their last entries final: the walk ends without waiting for anything.
    """
    for seg in ns.segments(stream):
        if seg.seqno < marker.segment_seqno or seg.truncated or seg.last_entry_id < 0:
            continue
        first = marker.entry_id if seg.seqno == marker.segment_seqno else 0
        if seg.min_active_dlsn is not None:
            first = max(first, seg.min_active_dlsn.entry_id)
        for lo in range(first, seg.last_entry_id + 1, SCAN_BATCH_ENTRIES):
            hi = min(seg.last_entry_id, lo + SCAN_BATCH_ENTRIES - 1)
            for rec in ns.read_entries(stream, seg.seqno, lo, hi):
                if rec.dlsn >= marker:
                    yield rec


def _scan(ns: SyncNamespace, state: _StreamState, tag: Tag) -> None:
    """Steps 1 and 2 of the module docstring (the caller holds the writer lock)."""
    marker = ns.committed(state.stream, tag.subscriber())
    if marker is None:
        # First batch of this (query, partition) here: nothing of ours can be there yet.
        # Later scans start at today's end (BEFORE_ALL on an empty stream).
        end = ns.stream_info(state.stream).last_dlsn
        ns.commit(state.stream, tag.subscriber(), end if end is not None else BEFORE_ALL)
        return
    for rec in _records_after(ns, state.stream, marker):
        found = Tag.decode((rec.headers or {}).get(TAG_HEADER))
        if found is None:
            continue
        if (
            rec.dlsn == marker
            and (found.query, found.partition) == (tag.query, tag.partition)
            and found.batch >= tag.batch
        ):
            state.skip_all = True
            return
        if found == tag:
            state.already[digest(rec.key, rec.payload, rec.headers)] += 1
            state.last_tagged = rec.dlsn


class _TaskWrite:
    """One task attempt writing its rows in per-stream runs (see module docstring)."""

    def __init__(self, opts: SinkOptions, columns: Sequence[str], tag: Tag) -> None:
        self.opts = opts
        self.columns = set(columns)
        self.tag = tag
        self.ns = client.namespace_for(opts.connection)
        self.states: dict[str, _StreamState] = {}
        self.writer: Any = None
        self.current: _StreamState | None = None
        self.pending: list[LogRecord] = []

    def _target(self, row: Any) -> str:
        for column in ("stream", "topic"):
            if column in self.columns and row[column] is not None:
                return client.check_stream_name(row[column])
        if self.opts.stream is None:
            raise BadRequestError("no target stream: add a 'stream' column or option")
        return self.opts.stream

    def _ensure_stream(self, stream: str) -> None:
        if not self.opts.create_streams:
            return
        if not self.ns.exists(stream):
            # Another task may create it first: that is fine, it exists either way.
            with contextlib.suppress(AlreadyExistsError):
                self.ns.create_stream(stream)

    def _switch(self, stream: str) -> _StreamState:
        self._flush()
        self._close_writer()
        state = self.states.get(stream)
        if state is None:
            self._ensure_stream(stream)
        self.writer = _open_writer(
            self.ns, stream, f"spark:{self.tag.encode().decode()}", self.opts.lock_wait_ms
        )
        if state is None:
            state = _StreamState(stream)
            if self.opts.idempotent:
                _scan(self.ns, state, self.tag)
            self.states[stream] = state
        self.current = state
        return state

    def _flush(self) -> None:
        if not self.pending:
            return
        state = self.current
        assert state is not None
        assert self.writer is not None
        dlsns: list[DLSN] = self.writer.write_many(self.pending)
        state.written += len(self.pending)
        state.last_tagged = dlsns[-1]
        self.pending = []

    def _close_writer(self) -> None:
        if self.writer is not None:
            writer, self.writer = self.writer, None
            writer.close()

    def add(self, row: Any) -> None:
        stream = self._target(row)
        state = self.current
        if state is None or state.stream != stream:
            state = self._switch(stream)
        key = _bytes(row["key"], "key") if "key" in self.columns else None
        value = _bytes(row["value"], "value")
        if value is None:
            raise BadRequestError("column 'value' must not be null")
        headers = _headers(row["headers"]) if "headers" in self.columns else {}
        if state.skip_all:
            state.skipped += 1
            return
        if self.opts.idempotent:
            d = digest(key, value, headers)
            if state.already[d] > 0:
                state.already[d] -= 1
                state.skipped += 1
                return
        headers[TAG_HEADER] = self.tag.encode()
        self.pending.append(LogRecord(value, key=key, headers=headers))
        if len(self.pending) >= WRITE_BATCH_RECORDS:
            self._flush()

    def finish(self) -> BooklineCommitMessage:
        try:
            self._flush()
        finally:
            self._close_writer()
        if self.opts.idempotent:
            for state in self.states.values():
                if state.last_tagged is not None:
                    self.ns.commit(state.stream, self.tag.subscriber(), state.last_tagged)
        return BooklineCommitMessage(
            written={s.stream: s.written for s in self.states.values()},
            skipped={s.stream: s.skipped for s in self.states.values()},
        )

    def abandon(self) -> None:
        """The task failed: release the lock; what was written is found by the retry."""
        self.pending = []
        self._close_writer()


def _write_rows(
    opts: SinkOptions, columns: Sequence[str], tag: Tag, rows: Iterable[Any]
) -> BooklineCommitMessage:
    task = _TaskWrite(opts, columns, tag)
    try:
        for row in rows:
            task.add(row)
    except BaseException:
        task.abandon()
        raise
    return task.finish()


def _task_context() -> Any:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None:
        raise BadRequestError("bookline writes must run inside a Spark task")
    return ctx


def _totals(messages: Iterable[object]) -> tuple[dict[str, int], dict[str, int]]:
    written: collections.Counter[str] = collections.Counter()
    skipped: collections.Counter[str] = collections.Counter()
    for m in messages:
        if isinstance(m, BooklineCommitMessage):
            written.update(m.written)
            skipped.update(m.skipped)
    return dict(written), dict(skipped)


class BooklineBatchWriter(DataSourceWriter):
    """``df.write.format("bookline")``: a retried task does not write its rows twice."""

    def __init__(self, opts: SinkOptions, columns: Sequence[str]) -> None:
        self.opts = opts
        self.columns = list(columns)
        # Made on the driver, pickled to every task: names this write job's records.
        self.write_id = opts.write_id or f"batch-{uuid.uuid4()}"
        self.batch_id = opts.batch_id or 0

    def write(self, iterator: Iterator[Any]) -> BooklineCommitMessage:
        ctx = _task_context()
        tag = Tag(self.write_id, self.batch_id, int(ctx.partitionId()))
        return _write_rows(self.opts, self.columns, tag, iterator)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        written, skipped = _totals(messages)
        log.info(
            "bookline write %s committed: written %s, skipped %s", self.write_id, written, skipped
        )

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        written, _skipped = _totals(messages)
        log.warning(
            "bookline write %s aborted; records already written stay: %s", self.write_id, written
        )


class BooklineStreamWriter(DataSourceStreamWriter):
    """``writeStream.format("bookline")``: each micro-batch written exactly once."""

    def __init__(self, opts: SinkOptions, columns: Sequence[str]) -> None:
        self.opts = opts
        self.columns = list(columns)

    def write(self, iterator: Iterator[Any]) -> BooklineCommitMessage:
        ctx = _task_context()
        query = ctx.getLocalProperty(QUERY_ID_PROPERTY)
        batch = ctx.getLocalProperty(BATCH_ID_PROPERTY)
        if query is None or batch is None:
            raise BadRequestError(
                f"Spark did not pass {QUERY_ID_PROPERTY!r}/{BATCH_ID_PROPERTY!r} to the task; "
                "cannot write exactly once"
            )
        tag = Tag(str(query), int(batch), int(ctx.partitionId()))
        return _write_rows(self.opts, self.columns, tag, iterator)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        written, skipped = _totals(messages)
        log.info(
            "bookline micro-batch %d committed: written %s, skipped (replayed) %s",
            batchId,
            written,
            skipped,
        )

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        written, _skipped = _totals(messages)
        log.warning(
            "bookline micro-batch %d aborted; written so far %s (a replay skips them)",
            batchId,
            written,
        )
