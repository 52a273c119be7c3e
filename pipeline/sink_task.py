"""One Spark task's write: rows to records, each to its target stream, exactly once.

Rows (Arrow record batches from Spark) become records: ``value`` (required; null is
Kafka's null value) is the payload; ``key``, ``headers`` (Kafka's
``array<struct<key,value>>`` in order, values may be null, or a map) and ``timestamp``
(the record's CreateTime) are optional. The target of a row, first match wins: its
``stream`` column; its ``topic`` column or the ``topic`` option -- partition ``p`` of a
topic is the stream ``t~p``, ``p`` from the ``partition`` column, else Kafka's murmur2
of the key (``partition_for_key``), else of the value (deterministic, so a replayed row
goes to the same partition); a name that is a plain stream is one partition -- ; the ``stream``
option. Missing plain streams are created (``createStreams``). A task buffers its rows
per target stream (up to ``bufferBytesMax``, then its largest stream is written early)
and writes them at its end, one writer per stream, streams in a rotation that starts
at its partition number: concurrent tasks start on different streams, so rows for
many streams in any order cost no more than sorted ones. A task waits for a lock only
while holding none, so two tasks cannot deadlock.

Before writing a stream the task makes steps 1 and 2 of the exactly-once protocol
(:mod:`pipeline.sink_marks`) and reports what it wrote and skipped in its
:class:`BooklineCommitMessage`; a small task hands its rows to the driver's commit
instead (:mod:`pipeline.sink`). Every task that writes a stream itself opens a writer,
and a writer is a segment (the core's single writer per stream): large tasks start one
segment each per stream.
"""

from __future__ import annotations

import collections
import contextlib
import datetime as dt
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import WriterCommitMessage

from foundation.errors import (
    AlreadyExistsError,
    BadRequestError,
    BooklineError,
    LockOwnedError,
    NotFoundError,
)
from pipeline import client
from pipeline.options import SinkOptions
from pipeline.schema import Headers
from pipeline.sink_marks import Found, Tag, batch_done, digest, scan
from streams.dlsn import DLSN
from streams.records import RecordColumns

if TYPE_CHECKING:
    import pyarrow as pa

    from streams.sync import SyncNamespace

log = logging.getLogger(__name__)

# Records per write_many call: pipelines writes without holding a whole partition.
WRITE_BATCH_RECORDS = 2_000
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
# Bookkeeping bytes counted per buffered row (tuple, key, headers), roughly.
ROW_OVERHEAD_BYTES = 128

# A buffered row: key, value, headers, timestamp (ms; None: the writer's clock).
Row = tuple[bytes | None, bytes | None, Headers, int | None]


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


def _headers(value: object) -> Headers:
    """A row's headers (Kafka's list of key/value structs in order, or a map), every
    one kept: the sink's tag is never a header. A null value stays null (Kafka's null
    header value)."""
    if value is None:
        return []
    if isinstance(value, dict):
        items: Iterable[tuple[object, object]] = value.items()
    elif isinstance(value, list):
        items = [(h["key"], h["value"]) if isinstance(h, dict) else (h[0], h[1]) for h in value]
    else:
        raise BadRequestError("column 'headers' must be a map or an array of key/value structs")
    out: Headers = []
    for k, v in items:
        if k is None:
            raise BadRequestError("column 'headers': a header needs a key")
        out.append((str(k), _bytes(v, "headers")))
    return out


def _timestamp_ms(value: object) -> int | None:
    """A row's ``timestamp`` (a timestamp, or ms since the epoch) in ms."""
    if value is None:
        return None
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:  # Arrow's timestamps without a zone are UTC
            value = value.replace(tzinfo=dt.UTC)
        return (value - _EPOCH) // dt.timedelta(milliseconds=1)
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    raise BadRequestError(f"column 'timestamp' must be a timestamp or ms >= 0, got {value!r}")


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
        self,
        stream: object,
        topic: object,
        partition: object,
        key: bytes | None,
        value: bytes | None,
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
            p = to_positive(murmur2(value or b"")) % count
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

    def add(self, stream: str, row: Row) -> None:
        state = self.states.get(stream)
        if state is None:
            state = self.states[stream] = _StreamState(stream)
        state.pending.append(row)
        self.buffered_bytes += _row_bytes(row)
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

    def _keep(self, state: _StreamState, key: bytes | None, value: bytes | None,
              headers: Headers) -> bool:  # fmt: skip
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
        self.buffered_bytes -= sum(map(_row_bytes, rows))
        if not state.skip_all:
            self._check(state)
        if state.skip_all:
            state.skipped += len(rows)
            return
        kept: list[Row] = []
        for row in rows:
            key, value, headers, _ts = row
            if not self._keep(state, key, value, headers):
                state.skipped += 1
                continue
            kept.append(row)
        records = tagged_records(kept, self.tag)
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


def tagged_records(rows: Sequence[Row], tag: Tag) -> RecordColumns:
    """``rows`` as records to write, each carrying ``tag`` as its origin tag (in the
    record framing: never a header)."""
    keys: list[bytes | None] = [key for key, _v, _h, _t in rows]
    headers: list[Headers | None] = [h or None for _k, _v, h, _t in rows]
    stamps: list[int | None] = [ts for _k, _v, _h, ts in rows]
    return RecordColumns(
        [value for _k, value, _h, _t in rows],
        None if keys.count(None) == len(keys) else keys,
        None if headers.count(None) == len(headers) else headers,
        None,
        None if stamps.count(None) == len(stamps) else stamps,
        tag=tag.encode(),
    )


def _row_bytes(row: Row) -> int:
    value = row[1]
    return ROW_OVERHEAD_BYTES if value is None else len(value) + ROW_OVERHEAD_BYTES


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
            stamps = cols.get("timestamp") or [None] * n
            streams, topics, parts = (cols.get(c) for c in ("stream", "topic", "partition"))
            fixed = None
            if streams is None and topics is None and parts is None and opts.topic is None:
                fixed = task.router.target(None, None, None, None, b"")
            for i in range(n):
                value = _bytes(values[i], "value")
                key = _bytes(keys[i], "key")
                target = fixed or task.router.target(
                    None if streams is None else streams[i],
                    None if topics is None else topics[i],
                    None if parts is None else parts[i],
                    key,
                    value,
                )
                task.add(target, (key, value, _headers(heads[i]), _timestamp_ms(stamps[i])))
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
