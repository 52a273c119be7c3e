"""Batch and streaming writes of the ``bookline`` data source, exactly once per batch id.

Three modules, by job:

* :mod:`pipeline.sink_marks` - the exactly-once protocol: the tag every record carries,
  content digests, the per-query sink markers, and its steps 1-2 (is the batch done,
  what earlier runs and attempts already wrote); its docstring states the protocol;
* :mod:`pipeline.sink_task` - one task: rows to records, routing to streams and topic
  partitions, buffering, writer locks, the commit message;
* this module - the driver's commit (step 3, and the rows of small tasks) and the
  Spark writer classes.

Small tasks (at most ``driverWriteBytesMax`` bytes of rows, default 256 KiB, and no
early write) hand their rows to the driver in their commit message instead: the
driver's commit writes them with one writer per stream (steps 1-2 as a task does them,
its skips added to step 3's counts), so a batch of many small tasks starts one segment
per stream, not one per task.

One-shot batch writes (no ``writeId``) delete their markers at commit or abort.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import DataSourceArrowWriter, WriterCommitMessage
from pyspark.sql.types import StructType

from foundation.errors import AlreadyExistsError, BadRequestError, NotFoundError
from pipeline import client
from pipeline.options import SinkOptions, parse_sink_options
from pipeline.schema import SINK_COLUMNS
from pipeline.sink_marks import Tag, batch_done, digest, drop_marker, scan
from pipeline.sink_task import (
    WRITE_BATCH_RECORDS,
    BooklineCommitMessage,
    Row,
    tagged_records,
    write_batches,
)
from streams.dlsn import DLSN

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
    "BooklineBatchWriter",
    "BooklineCommitMessage",
    "BooklineStreamWriter",
    "Tag",
    "check_sink_schema",
    "parse_sink_options",
    "write_batches",
]

# Spark's task-local properties naming the streaming query and micro-batch.
QUERY_ID_PROPERTY = "sql.streaming.queryId"
BATCH_ID_PROPERTY = "streaming.sql.batchId"
# The partition field of records the driver writes when it repairs a replay.
DRIVER_PARTITION = -1


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
        kept: list[Row] = []
        for key, value, headers, ts in rows:
            if found.prior:
                d = digest(key, value, headers)
                if found.prior[d] > 0:
                    found.prior[d] -= 1
                    skips[d] += 1
                    continue
            kept.append((key, value, headers, ts))
        again = 0
        for d, count in skips.items():
            rec = found.prior_records.get(d)
            missing = count - earlier[d]
            if missing <= 0 or rec is None:
                continue
            kept += [(rec.key, rec.payload, rec.headers or [], rec.timestamp_ms)] * missing
            again += missing
        records = tagged_records(kept, tag)
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
