"""Batch and streaming writes of the ``bookline`` data source, exactly once per batch id.

Rows (Arrow record batches from Spark) become records: ``value`` (required) is the
payload; ``key``, ``headers`` (Kafka's ``array<struct<key,value>>`` or a map) are
optional. The target of a row, first match wins: its ``stream`` column; its ``topic``
column or the ``topic`` option -- partition ``p`` of a topic is the stream ``t~p``, ``p``
from the ``partition`` column, else Kafka's murmur2 of the key
(``partition_for_key``), else of the value (deterministic, so a replayed row goes to the
same partition); a name that is a plain stream is one partition -- ; the ``stream``
option. Missing plain streams are created (``createStreams``). A task buffers its rows
per target stream (up to ``bufferBytesMax``, then its largest stream is written early)
and writes them at its end, one writer per stream, streams in a rotation that starts
at its partition number: concurrent tasks start on different streams, so rows for
many streams in any order cost no more than sorted ones. A task waits for a lock only
while holding none, so two tasks cannot deadlock.

Exactly once, whatever the partitioning of a replay. Every record carries the header
``bookline.spark`` = ``"<query>:<batch>:<run>:<partition>"``: the query id (stable
across restarts from a checkpoint; a batch write uses a fresh id and batch 0, or the
options ``writeId``/``batchId``, which is what ``foreachBatch`` should pass), the batch,
the *run* (a fresh id per driver-side writer: a restart is a new run) and the Spark
partition. Per (query, target stream) one *sink marker* (the subscription
``spark-sink.<query>``) points at the last record of the last batch the driver
committed; before a query's first write to a stream it is set at the stream's end.

1. *Batch done*: the marker's record is tagged with this query and a batch >= ours (the
   driver died after committing the batch to us but before Spark logged it): skip
   every row; no writer is opened.
2. Otherwise, holding the stream's writer lock, the task reads the records after the
   marker tagged with this query and batch, up to the first record of the current run:
   those of *earlier runs* form a multiset W of content digests (key, value, headers
   without the tag); on a retried attempt it also collects its own earlier attempt's
   records (same run and partition), skipped first. A row whose digest is in W is
   skipped (once per copy) and counted in the commit message.
3. The driver's commit adds the counts up per stream: a digest skipped more often than
   W holds it (rows with equal content spread over several tasks of the new layout)
   is written again, copying W's record, so the stream ends with exactly the batch's
   multiset of rows; then it moves the marker to the batch's last record. A driver that
   dies during that leaves a state the next run resolves the same way.

Small tasks (at most ``driverWriteBytesMax`` bytes of rows, default 256 KiB, and no
early write) hand their rows to the driver in their commit message instead: the
driver's commit writes them with one writer per stream (steps 1-2 as a task does them,
its skips added to step 3's counts), so a batch of many small tasks starts one segment
per stream, not one per task.

One-shot batch writes (no ``writeId``) delete their markers at commit or abort.
Limits: speculative execution (two live attempts of one task) is not supported; a
zombie task of a dead driver writing after the new run started is not detected.
Costs: a task scans the records written after the marker only up to the first one of
its own run (nothing in steady state), and a retried attempt its partition's records.
Every task that writes a stream itself opens a writer, and a writer is a segment (the
core's single writer per stream): large tasks start one segment each per stream.
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

from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from foundation.errors import (
    AlreadyExistsError,
    BadRequestError,
    BooklineError,
    LockOwnedError,
    NotFoundError,
)
from pipeline import client
from pipeline.options import SinkOptions, parse_sink_options
from pipeline.schema import SINK_COLUMNS, TAG_HEADER
from streams.dlsn import DLSN
from streams.records import LogRecord, ReadRecord

if TYPE_CHECKING:
    import pyarrow as pa

    from streams.sync import SyncNamespace

try:  # Spark >= 4.1: streaming writers get Arrow batches too
    from pyspark.sql.datasource import DataSourceStreamArrowWriter as _StreamWriterBase

    STREAM_ARROW = True
except ImportError:  # pragma: no cover - Spark 4.0: rows, batched here
    from pyspark.sql.datasource import (  # type: ignore[assignment]
        DataSourceStreamWriter as _StreamWriterBase,
    )

    STREAM_ARROW = False

log = logging.getLogger(__name__)

__all__ = [
    "TAG_HEADER",
    "BooklineBatchWriter",
    "BooklineStreamWriter",
    "Tag",
    "check_sink_schema",
    "parse_sink_options",
]

# Spark's task-local properties naming the streaming query and micro-batch.
QUERY_ID_PROPERTY = "sql.streaming.queryId"
BATCH_ID_PROPERTY = "streaming.sql.batchId"
# Records per write_many call: pipelines writes without holding a whole partition.
WRITE_BATCH_RECORDS = 2_000
# Bookkeeping bytes counted per buffered row (tuple, key, headers), roughly.
ROW_OVERHEAD_BYTES = 128
# Entries per read_entries call while scanning for already-written rows.
SCAN_BATCH_ENTRIES = 256
# Sink marker of a query that started on an empty stream: before every record
# (segment seqnos start at 1), so it never names a record of ours.
BEFORE_ALL = DLSN(0, 0, 0)
# The partition field of records the driver writes when it repairs a replay.
DRIVER_PARTITION = -1
MARKER_PREFIX = "spark-sink."


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
    if isinstance(value, bytes):
        return value
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    if isinstance(value, str):
        return value.encode("utf-8")
    raise BadRequestError(f"column {column!r} must be binary or string, got {type(value).__name__}")


def _headers(value: object) -> dict[str, bytes]:
    """A row's headers (a map, or Kafka's list of key/value structs) without our tag: a
    tag copied from a Spark-written stream is replaced by this write's."""
    if value is None:
        return {}
    if isinstance(value, dict):
        items: Iterable[tuple[object, object]] = value.items()
    elif isinstance(value, list):
        items = [(h["key"], h["value"]) if isinstance(h, dict) else (h[0], h[1]) for h in value]
    else:
        raise BadRequestError("column 'headers' must be a map or an array of key/value structs")
    out: dict[str, bytes] = {}
    for k, v in items:
        if k is None:
            raise BadRequestError("column 'headers': a header needs a key")
        if k == TAG_HEADER:
            continue
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
    run: str
    partition: int

    def encode(self) -> bytes:
        return f"{self.query}:{self.batch}:{self.run}:{self.partition}".encode()

    @classmethod
    def decode(cls, raw: bytes | None) -> Tag | None:
        if raw is None:
            return None
        try:
            query, batch, run, partition = raw.decode().rsplit(":", 3)
            return cls(query, int(batch), run, int(partition))
        except (UnicodeDecodeError, ValueError):
            return None  # a header somebody else set (or an older format); not ours

    @property
    def marker(self) -> str:
        return marker_name(self.query)


def marker_name(query: str) -> str:
    return f"{MARKER_PREFIX}{query}"


def _tag_of(rec: ReadRecord) -> Tag | None:
    return Tag.decode((rec.headers or {}).get(TAG_HEADER))


def _content(rec: ReadRecord) -> bytes:
    return digest(rec.key, rec.payload, rec.headers)


# -- reading what is there -------------------------------------------------------------


def _records_after(ns: SyncNamespace, stream: str, marker: DLSN) -> Iterator[ReadRecord]:
    """Every readable record after ``marker``, straight from the segments (sealed ones
    up to their last entry, the in-progress one up to its LAC)."""
    for seg in ns.segments(stream):
        if seg.seqno < marker.segment_seqno or seg.truncated or seg.last_entry_id < 0:
            continue
        first = marker.entry_id if seg.seqno == marker.segment_seqno else 0
        if seg.min_active_dlsn is not None:
            first = max(first, seg.min_active_dlsn.entry_id)
        for lo in range(first, seg.last_entry_id + 1, SCAN_BATCH_ENTRIES):
            hi = min(seg.last_entry_id, lo + SCAN_BATCH_ENTRIES - 1)
            for rec in ns.read_entries(stream, seg.seqno, lo, hi):
                if rec.dlsn > marker:
                    yield rec


def _record_at(ns: SyncNamespace, stream: str, dlsn: DLSN) -> ReadRecord | None:
    if dlsn == BEFORE_ALL:
        return None
    try:
        recs = ns.read_entries(stream, dlsn.segment_seqno, dlsn.entry_id, dlsn.entry_id)
    except BooklineError as exc:  # truncated, deleted: then it tells nothing
        log.debug("%s: sink marker %s unreadable: %s", stream, dlsn, exc)
        return None
    return next((r for r in recs if r.dlsn == dlsn), None)


def batch_done(ns: SyncNamespace, stream: str, tag: Tag) -> bool:
    """Step 1: the marker names a record of this query with a batch >= ours."""
    marker = ns.committed(stream, tag.marker)
    if marker is None:
        return False
    rec = _record_at(ns, stream, marker)
    found = _tag_of(rec) if rec is not None else None
    return found is not None and found.query == tag.query and found.batch >= tag.batch


@dataclass
class Found:
    """What step 2 found after the marker: earlier runs' records of our batch (W) and
    our own earlier attempt's."""

    prior: collections.Counter[bytes] = field(default_factory=collections.Counter)
    prior_records: dict[bytes, ReadRecord] = field(default_factory=dict)
    own: collections.Counter[bytes] = field(default_factory=collections.Counter)
    last: DLSN | None = None  # the last record of our batch seen


def scan(ns: SyncNamespace, stream: str, tag: Tag, *, whole: bool, keep: bool = False) -> Found:
    """Step 2 (the caller holds the writer lock). ``whole``: do not stop at the first
    record of the current run (a retried attempt looks for its own records)."""
    found = Found()
    marker = ns.committed(stream, tag.marker)
    if marker is None:
        # The query's first write here: nothing of it can be there yet. Later scans
        # start at today's end (BEFORE_ALL on an empty stream).
        end = ns.stream_info(stream).last_dlsn
        ns.commit(stream, tag.marker, end if end is not None else BEFORE_ALL)
        return found
    for rec in _records_after(ns, stream, marker):
        t = _tag_of(rec)
        if t is None or t.query != tag.query or t.batch != tag.batch:
            continue
        found.last = rec.dlsn
        if t.run != tag.run:
            d = _content(rec)
            found.prior[d] += 1
            if keep:
                found.prior_records.setdefault(d, rec)
        elif t.partition == tag.partition:
            found.own[_content(rec)] += 1
        elif not whole:
            break  # the current run's records follow; earlier runs' come before them
    return found


# -- one task ----------------------------------------------------------------------


# A buffered row: key, value, headers (without the tag).
Row = tuple[bytes | None, bytes, dict[str, bytes]]


@dataclass
class _StreamState:
    """What one task attempt knows about one target stream."""

    stream: str
    writer: Any = None
    prepared: bool = False  # exists; step 1 done
    checked: bool = False  # steps 1-2 done holding the writer
    skip_all: bool = False
    found: Found = field(default_factory=Found)
    prior_skips: collections.Counter[bytes] = field(default_factory=collections.Counter)
    pending: list[Row] = field(default_factory=list)
    last: DLSN | None = None  # our last written record, or the last of the batch seen
    written: int = 0
    skipped: int = 0


@dataclass
class BooklineCommitMessage(WriterCommitMessage):
    # The task's query and run (the driver's commit runs in a writer of its own).
    query: str
    run: str
    written: dict[str, int]
    skipped: dict[str, int]
    # Per stream: the last record of the batch the task wrote or saw.
    last: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    # Per stream: rows skipped because an earlier run wrote them (digest -> count).
    prior_skips: dict[str, dict[bytes, int]] = field(default_factory=dict)
    # Per stream: rows handed to the driver's commit to write (a small task's).
    rows: dict[str, list[Row]] = field(default_factory=dict)


class _Router:
    """A row's target stream (see the module docstring); topic metadata cached."""

    def __init__(self, ns: SyncNamespace, opts: SinkOptions) -> None:
        self.ns = ns
        self.opts = opts
        self._partitions: dict[str, int | None] = {}

    def _count(self, topic: str) -> int | None:
        if topic not in self._partitions:
            self._partitions[topic] = client.topic_partitions(self.ns, topic)
        return self._partitions[topic]

    def target(
        self, stream: object, topic: object, partition: object, key: bytes | None, value: bytes
    ) -> str:
        from foundation.names import partition_stream, validate_stream_name
        from foundation.partitioner import murmur2, partition_for_key, to_positive

        if stream is not None:
            return validate_stream_name(stream)
        name = topic if topic is not None else self.opts.topic
        if name is None:
            if self.opts.stream is None:
                raise BadRequestError("no target: add a 'topic' or 'stream' column or option")
            return self.opts.stream
        if not isinstance(name, str):
            raise BadRequestError(f"column 'topic' must be a string, got {name!r}")
        count = self._count(name)
        if count is None:  # a plain stream: one partition
            if partition not in (None, 0):
                raise BadRequestError(
                    f"{name!r} is a stream, not a topic: no partition {partition}"
                )
            return validate_stream_name(name)
        if partition is not None:
            if not isinstance(partition, int) or not 0 <= partition < count:
                raise BadRequestError(f"topic {name!r} has no partition {partition!r} ({count})")
            p = partition
        elif key is not None:
            p = partition_for_key(key, count)
        else:
            p = to_positive(murmur2(value)) % count
        return partition_stream(name, p)


class _TaskWrite:
    """One task attempt (see the module docstring). Rows are buffered per target stream
    and written at the end of the task, streams in an order that starts at the task's
    partition (so concurrent tasks start on different streams and rarely wait); a
    buffer past ``BUFFER_BYTES_MAX`` writes its largest stream early. A task waits for
    a lock only while holding none, so tasks cannot deadlock."""

    def __init__(self, opts: SinkOptions, tag: Tag, attempt: int) -> None:
        self.opts = opts
        self.tag = tag
        self.attempt = attempt
        self.ns = client.namespace_for(opts.connection, create=opts.create_streams)
        self.router = _Router(self.ns, opts)
        self.states: dict[str, _StreamState] = {}
        self.identity = f"spark:{tag.encode().decode()}"
        self.buffered_bytes = 0
        self.wrote_early = False  # the buffer overflowed: the task writes itself

    # -- locks and checks ----------------------------------------------------------

    def _ensure_stream(self, stream: str) -> None:
        if self.ns.exists(stream):
            return
        if not self.opts.create_streams:
            raise NotFoundError(f"stream {stream!r} does not exist (createStreams=false)")
        from foundation.names import is_internal

        if is_internal(stream):
            raise NotFoundError(f"topic partition {stream!r} does not exist")
        with contextlib.suppress(AlreadyExistsError):  # another task was first: fine
            self.ns.create_stream(stream)

    def _try_open(self, state: _StreamState) -> bool:
        """Take the stream's writer if it is free now."""
        try:
            state.writer = self.ns.open_writer(state.stream, identity=self.identity)
        except LockOwnedError:
            return False
        return True

    def _open_waiting(self, state: _StreamState) -> None:
        """Release every writer we hold, then wait for this stream's."""
        self._release_all()
        try:
            state.writer = self.ns.open_writer(
                state.stream,
                identity=self.identity,
                lock_timeout_s=self.opts.lock_wait_ms / 1000.0,
            )
        except LockOwnedError as exc:
            raise LockOwnedError(
                f"stream {state.stream!r}: writer lock still held by {exc.owner!r} after "
                f"{self.opts.lock_wait_ms} ms (option lockWaitMs)",
                owner=exc.owner,
            ) from exc

    def _prepare(self, state: _StreamState) -> None:
        """Before the first write: the stream exists; step 1 (no lock needed)."""
        if state.prepared:
            return
        state.prepared = True
        self._ensure_stream(state.stream)
        if self.opts.idempotent and batch_done(self.ns, state.stream, self.tag):
            state.skip_all = True

    def _check(self, state: _StreamState) -> None:
        """Step 1 again and step 2, once per stream, holding its writer."""
        if state.checked or not self.opts.idempotent:
            return
        state.checked = True
        if batch_done(self.ns, state.stream, self.tag):
            state.skip_all = True
            return
        state.found = scan(self.ns, state.stream, self.tag, whole=self.attempt > 0)
        state.last = state.found.last

    # -- rows ------------------------------------------------------------------------

    def add(self, stream: str, key: bytes | None, value: bytes, headers: dict[str, bytes]) -> None:
        state = self.states.get(stream)
        if state is None:
            state = self.states[stream] = _StreamState(stream)
        state.pending.append((key, value, headers))
        self.buffered_bytes += len(value) + ROW_OVERHEAD_BYTES
        if self.buffered_bytes > self.opts.buffer_bytes_max:
            self._make_room()

    def _make_room(self) -> None:
        """Write the largest buffered stream: held, else free now, else waited for."""
        self.wrote_early = True
        state = max(self.states.values(), key=lambda s: len(s.pending))
        self._prepare(state)
        if state.writer is None and not state.skip_all and not self._try_open(state):
            self._open_waiting(state)
        self._flush(state)

    def _keep(self, state: _StreamState, key: bytes | None, value: bytes,
              headers: dict[str, bytes]) -> bool:  # fmt: skip
        """Step 2's verdict on one row: False when an earlier attempt or run wrote it."""
        found = state.found
        if not (found.own or found.prior):
            return True
        d = digest(key, value, headers)
        if found.own[d] > 0:
            found.own[d] -= 1
            return False
        if found.prior[d] > 0:
            found.prior[d] -= 1
            state.prior_skips[d] += 1
            return False
        return True

    def _flush(self, state: _StreamState) -> None:
        """Write the stream's buffered rows (its writer is held, or it is skipped)."""
        rows, state.pending = state.pending, []
        self.buffered_bytes -= sum(len(v) + ROW_OVERHEAD_BYTES for _k, v, _h in rows)
        if not state.skip_all:
            self._check(state)
        if state.skip_all:
            state.skipped += len(rows)
            return
        tag = self.tag.encode()
        records: list[LogRecord] = []
        for key, value, headers in rows:
            if not self._keep(state, key, value, headers):
                state.skipped += 1
                continue
            headers[TAG_HEADER] = tag
            records.append(LogRecord(value, key=key, headers=headers))
        for lo in range(0, len(records), WRITE_BATCH_RECORDS):
            chunk = records[lo : lo + WRITE_BATCH_RECORDS]
            dlsns: Sequence[DLSN] = state.writer.write_many(chunk)
            state.written += len(chunk)
            state.last = dlsns[-1]

    def _close(self, state: _StreamState) -> None:
        if state.writer is not None:
            writer, state.writer = state.writer, None
            writer.close()

    def _release_all(self) -> None:
        for state in self.states.values():
            self._close(state)

    def _write_all(self) -> None:
        """The end of the task: every stream's rows, in rotation from our partition."""
        names = sorted(s for s, st in self.states.items() if st.pending)
        if names:
            first = self.tag.partition % len(names)
            names = names[first:] + names[:first]
        todo = [self.states[n] for n in names]
        while todo:
            ready = [s for s in todo if s.writer is not None]
            for state in todo:
                self._prepare(state)
                if state.skip_all and state not in ready:
                    ready.append(state)
            if not ready:
                ready = next(([s] for s in todo if self._try_open(s)), [])
            if not ready:
                self._open_waiting(todo[0])
                ready = [todo[0]]
            for state in ready:
                self._flush(state)
                self._close(state)
                todo.remove(state)

    def _for_the_driver(self) -> bool:
        return (
            self.opts.idempotent
            and not self.wrote_early
            and self.buffered_bytes <= self.opts.driver_write_bytes_max
        )

    def finish(self) -> BooklineCommitMessage:
        if self._for_the_driver():
            rows = {s.stream: s.pending for s in self.states.values() if s.pending}
            return BooklineCommitMessage(
                query=self.tag.query, run=self.tag.run, written={}, skipped={}, rows=rows
            )
        try:
            self._write_all()
        finally:
            self.abandon()
        states = self.states.values()
        return BooklineCommitMessage(
            query=self.tag.query,
            run=self.tag.run,
            written={s.stream: s.written for s in states},
            skipped={s.stream: s.skipped for s in states},
            last={s.stream: tuple(s.last) for s in states if s.last is not None},  # type: ignore[misc]
            prior_skips={s.stream: dict(s.prior_skips) for s in states if s.prior_skips},
        )

    def abandon(self) -> None:
        """Release every lock; what was written is found by a retry or a replay."""
        for state in self.states.values():
            state.pending = []
            try:
                self._close(state)
            except BooklineError as exc:
                log.warning("closing the writer of %s failed: %s", state.stream, exc)


def _columns(batch: pa.RecordBatch) -> dict[str, list[Any]]:
    return {name: batch.column(i).to_pylist() for i, name in enumerate(batch.schema.names)}


def write_batches(
    opts: SinkOptions, tag: Tag, batches: Iterable[pa.RecordBatch], attempt: int = 0
) -> BooklineCommitMessage:
    """One task: every row of ``batches`` to its target, exactly once for ``tag``."""
    task = _TaskWrite(opts, tag, attempt)
    try:
        for batch in batches:
            cols = _columns(batch)
            n = batch.num_rows
            values = cols["value"]
            keys = cols.get("key") or [None] * n
            heads = cols.get("headers") or [None] * n
            streams, topics, parts = (cols.get(c) for c in ("stream", "topic", "partition"))
            fixed = None
            if streams is None and topics is None and parts is None and opts.topic is None:
                fixed = task.router.target(None, None, None, None, b"")
            for i in range(n):
                value = _bytes(values[i], "value")
                if value is None:
                    raise BadRequestError("column 'value' must not be null")
                key = _bytes(keys[i], "key")
                target = fixed or task.router.target(
                    None if streams is None else streams[i],
                    None if topics is None else topics[i],
                    None if parts is None else parts[i],
                    key,
                    value,
                )
                task.add(target, key, value, _headers(heads[i]))
    except BaseException:
        task.abandon()
        raise
    return task.finish()


def write_rows(
    opts: SinkOptions, tag: Tag, rows: Sequence[dict[str, Any]], attempt: int = 0
) -> BooklineCommitMessage:
    """:func:`write_batches` of plain dict rows (tests, tools)."""
    import pyarrow as pa

    names = sorted({k for r in rows for k in r})
    batch = pa.RecordBatch.from_pylist(list(rows), schema=None) if rows else None
    if batch is not None:
        batch = batch.select(names)
    return write_batches(opts, tag, [] if batch is None else [batch], attempt)


# -- the driver's side -------------------------------------------------------------


def _task_context() -> Any:
    from pyspark import TaskContext

    ctx = TaskContext.get()
    if ctx is None:
        raise BadRequestError("bookline writes must run inside a Spark task")
    return ctx


@dataclass
class _Merged:
    written: dict[str, int]
    skipped: dict[str, int]
    last: dict[str, DLSN]
    prior: dict[str, collections.Counter[bytes]]
    rows: dict[str, list[Row]]


def _merge(messages: Iterable[object]) -> _Merged:
    written: collections.Counter[str] = collections.Counter()
    skipped: collections.Counter[str] = collections.Counter()
    last: dict[str, DLSN] = {}
    prior: dict[str, collections.Counter[bytes]] = {}
    rows: dict[str, list[Row]] = {}
    for m in messages:
        if not isinstance(m, BooklineCommitMessage):
            continue
        for stream, some in m.rows.items():
            rows.setdefault(stream, []).extend(some)
        written.update(m.written)
        skipped.update(m.skipped)
        for stream, raw in m.last.items():
            dlsn = DLSN(*raw)
            last[stream] = max(last.get(stream, dlsn), dlsn)
        for stream, counts in m.prior_skips.items():
            prior.setdefault(stream, collections.Counter()).update(counts)
    return _Merged(dict(written), dict(skipped), last, prior, rows)


def _ensure_stream(ns: SyncNamespace, opts: SinkOptions, stream: str) -> None:
    if ns.exists(stream):
        return
    from foundation.names import is_internal

    if not opts.create_streams or is_internal(stream):
        raise NotFoundError(f"stream {stream!r} does not exist")
    with contextlib.suppress(AlreadyExistsError):
        ns.create_stream(stream)


def driver_write(
    ns: SyncNamespace,
    opts: SinkOptions,
    stream: str,
    tag: Tag,
    *,
    task_skips: collections.Counter[bytes],
    rows: list[Row],
) -> DLSN | None:
    """The driver's part of a batch on one stream, holding its writer: the rows small
    tasks handed over (steps 1-2 as a task does them), then step 3 (rows skipped more
    often, by the tasks and here, than earlier runs wrote them are written again).
    Returns the batch's last record in the stream, if any."""
    if rows:
        _ensure_stream(ns, opts, stream)
    if batch_done(ns, stream, tag):
        return None
    writer = ns.open_writer(stream, identity=f"spark-driver:{tag.encode().decode()}",
                            lock_timeout_s=opts.lock_wait_ms / 1000.0)  # fmt: skip
    try:
        if batch_done(ns, stream, tag):
            return None
        found = scan(ns, stream, tag, whole=True, keep=True)
        earlier = collections.Counter(found.prior)
        skips = collections.Counter(task_skips)
        enc = tag.encode()
        records: list[LogRecord] = []
        for key, value, headers in rows:
            if found.prior:
                d = digest(key, value, headers)
                if found.prior[d] > 0:
                    found.prior[d] -= 1
                    skips[d] += 1
                    continue
            headers[TAG_HEADER] = enc
            records.append(LogRecord(value, key=key, headers=headers))
        again = 0
        for d, count in skips.items():
            rec = found.prior_records.get(d)
            missing = count - earlier[d]
            if missing <= 0 or rec is None:
                continue
            headers = {k: v for k, v in (rec.headers or {}).items() if k != TAG_HEADER}
            headers[TAG_HEADER] = enc
            records += [LogRecord(rec.payload, key=rec.key, headers=dict(headers))] * missing
            again += missing
        if again:
            log.info("%s: re-writing %d rows skipped by more than one task", stream, again)
        last = found.last
        for lo in range(0, len(records), WRITE_BATCH_RECORDS):
            last = writer.write_many(records[lo : lo + WRITE_BATCH_RECORDS])[-1]
        return last
    finally:
        writer.close()


def commit_batch(
    opts: SinkOptions, tag: Tag, messages: Iterable[object], *, one_shot: bool
) -> None:
    """The driver's commit: small tasks' rows and repairs (:func:`driver_write`), then
    the markers moved (or, for a one-shot write, deleted)."""
    m = _merge(messages)
    log.info(
        "bookline %s batch %d: written %s, skipped %s, by the driver %s",
        tag.query, tag.batch, m.written, m.skipped, {s: len(r) for s, r in m.rows.items()},
    )  # fmt: skip
    if not opts.idempotent or not (m.last or m.prior or m.rows):
        return
    ns = client.namespace_for(opts.connection, create=opts.create_streams)
    driver_tag = Tag(tag.query, tag.batch, tag.run, DRIVER_PARTITION)
    touched = set(m.last)
    for stream in sorted(set(m.prior) | set(m.rows)):
        touched.add(stream)
        skips = m.prior.get(stream, collections.Counter())
        rows = m.rows.get(stream, [])
        dlsn = driver_write(ns, opts, stream, driver_tag, task_skips=skips, rows=rows)
        if dlsn is not None:
            m.last[stream] = max(m.last.get(stream, dlsn), dlsn)
    for stream in sorted(touched):
        if one_shot:
            drop_marker(ns, stream, tag.query)
        elif stream in m.last:
            ns.commit(stream, tag.marker, m.last[stream])


def drop_marker(ns: SyncNamespace, stream: str, query: str) -> None:
    with contextlib.suppress(NotFoundError):
        ns.runner.call(ns.ns.delete_subscriber(stream, marker_name(query)))


def _task_tag(messages: Sequence[object], batch: int) -> Tag | None:
    """The tasks' query and run, from their messages (None: no task reported)."""
    for m in messages:
        if isinstance(m, BooklineCommitMessage):
            return Tag(m.query, batch, m.run, 0)
    return None


def _schema_names(schema: StructType | Sequence[str]) -> list[str]:
    return list(schema.fieldNames() if isinstance(schema, StructType) else schema)


class BooklineBatchWriter(DataSourceArrowWriter):
    """``df.write.format("bookline")``: a retried task does not write its rows twice."""

    def __init__(self, opts: SinkOptions, schema: StructType | Sequence[str]) -> None:
        self.opts = opts
        self.columns = _schema_names(schema)
        # Made on the driver, pickled to every task: names this write job's records.
        self.write_id = opts.write_id or f"batch-{uuid.uuid4()}"
        self.batch_id = opts.batch_id or 0
        self.run = uuid.uuid4().hex[:12]

    def _tag(self, partition: int) -> Tag:
        return Tag(self.write_id, self.batch_id, self.run, partition)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> BooklineCommitMessage:
        ctx = _task_context()
        tag = self._tag(int(ctx.partitionId()))
        return write_batches(self.opts, tag, iterator, int(ctx.attemptNumber()))

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        tag = _task_tag(messages, self.batch_id) or self._tag(0)
        commit_batch(self.opts, tag, messages, one_shot=self.opts.write_id is None)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        m = _merge(messages)
        log.warning("bookline write %s aborted; records written stay: %s", self.write_id, m.written)
        if self.opts.write_id is None and m.last:
            ns = client.namespace_for(self.opts.connection)
            for stream in m.last:
                drop_marker(ns, stream, self.write_id)


def _row_batches(rows: Iterable[Any], size: int = WRITE_BATCH_RECORDS) -> Iterator[pa.RecordBatch]:
    """Spark 4.0's streaming writers get Rows: as Arrow batches for write_batches."""
    import pyarrow as pa

    chunk: list[dict[str, Any]] = []
    for row in rows:
        chunk.append(row.asDict())
        if len(chunk) >= size:
            yield pa.RecordBatch.from_pylist(chunk)
            chunk = []
    if chunk:
        yield pa.RecordBatch.from_pylist(chunk)


class BooklineStreamWriter(_StreamWriterBase):
    """``writeStream.format("bookline")``: each micro-batch written exactly once."""

    def __init__(self, opts: SinkOptions, schema: StructType | Sequence[str]) -> None:
        self.opts = opts
        self.columns = _schema_names(schema)
        self.run = uuid.uuid4().hex[:12]

    def write(self, iterator: Iterator[pa.RecordBatch]) -> BooklineCommitMessage:
        ctx = _task_context()
        query = ctx.getLocalProperty(QUERY_ID_PROPERTY)
        batch = ctx.getLocalProperty(BATCH_ID_PROPERTY)
        if query is None or batch is None:
            raise BadRequestError(
                f"Spark did not pass {QUERY_ID_PROPERTY!r}/{BATCH_ID_PROPERTY!r} to the task; "
                "cannot write exactly once"
            )
        tag = Tag(str(query), int(batch), self.run, int(ctx.partitionId()))
        batches = iterator if STREAM_ARROW else _row_batches(iterator)
        return write_batches(self.opts, tag, batches, int(ctx.attemptNumber()))

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        tag = _task_tag(messages, batchId)
        if tag is not None:
            commit_batch(self.opts, tag, messages, one_shot=False)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        log.warning(
            "bookline micro-batch %d aborted; written so far %s (a replay skips them)",
            batchId,
            _merge(messages).written,
        )
