"""The ``bookline`` PySpark data source: batch and streaming reads (writes: pipeline.sink).

Batch read (``spark.read.format("bookline")``): the planner resolves the selection
(topics, a pattern, assigned partitions, streams) into topic partitions
(:func:`pipeline.client.select_partitions`), snapshots each partition's stream,
resolves the offset and timestamp options into sequence-id ranges (Kafka's precedence:
timestamp, by-timestamp, offsets) and returns one InputPartition per segment slice;
each task reads its slice from the bookies and yields Arrow record batches cut straight
from the entries' bodies (:func:`pipeline.client.read_slice_columns`,
:mod:`pipeline.columns`; no record object per row) or, with ``arrow=false``, Python
tuples of the records (:func:`pipeline.client.read_slice`), in Kafka's schema.

Streaming read (``spark.readStream.format("bookline")``): an offset is Kafka's JSON
``{"topic": {"partition": next offset}}`` (a plain stream: ``{"stream": next offset}``);
a micro-batch reads [start, end) of each partition, so a restart from a checkpoint
resumes exactly, and partitions that appear (a topic grown, a new pattern match) start
at their oldest record. Admission control: ``maxOffsetsPerTrigger`` (``ReadMaxRows``,
honoured in ``latestOffset(start, limit)``, shared fairly between partitions) and
``minOffsetsPerTrigger`` + ``maxTriggerDelay`` (Kafka's rule, kept here: too few new
records and the delay not over -> no new micro-batch); ``Trigger.AvailableNow`` works
(``prepareForTriggerAvailableNow`` pins the target offsets). ``reportLatestOffset``
gives Spark the latest offsets, shown in the query progress next to ``endOffset``
(:func:`records_behind`). On a Spark without admission control (< 4.2) the reader
reads everything available per micro-batch.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    InputPartition,
)
from pyspark.sql.types import StructType

from foundation.errors import BadRequestError
from pipeline import client
from pipeline.options import SourceOptions, include_headers, parse_source_options
from pipeline.planning import (
    Slice,
    StreamView,
    TopicPartition,
    cap_end_offsets,
    decode_offsets,
    encode_offsets,
    plan_slices,
    resolve_range,
)
from pipeline.schema import read_schema_ddl, records_to_tuples

log = logging.getLogger(__name__)

try:  # Spark >= 4.2: admission control and Trigger.AvailableNow for Python sources
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadLimit,
        ReadMaxRows,
        SupportsTriggerAvailableNow,
    )

    ADMISSION_CONTROL = True
except ImportError:  # pragma: no cover - older 4.x
    ADMISSION_CONTROL = False

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        """Placeholder so the class statement below works on Spark < 4.2."""


__all__ = ["ADMISSION_CONTROL", "BooklineDataSource"]

NAME = "bookline"


class SlicePartition(InputPartition):
    """One segment slice; pickled to the executor that reads it."""

    def __init__(self, sl: Slice | None) -> None:
        super().__init__(sl)
        self.slice = sl

    def __repr__(self) -> str:
        sl = self.slice
        if sl is None:
            return "SlicePartition(empty)"
        return f"SlicePartition({sl.stream}#{sl.seqno} [{sl.seq_lo}, {sl.seq_hi}))"


def _read_partition(opts: SourceOptions, schema: StructType, part: InputPartition) -> Iterator[Any]:
    """What a read task yields: Arrow record batches or tuples of one slice."""
    sl: Slice | None = getattr(part, "slice", None)
    if sl is None:
        return
    ns = client.namespace_for(opts.connection)
    if opts.arrow:
        from pyspark.sql.pandas.types import to_arrow_schema

        from pipeline.columns import layout_batch

        pa_schema = to_arrow_schema(schema, timezone="UTC")
        for parts in client.read_slice_columns(ns, sl, opts.arrow_batch_rows):
            yield layout_batch(parts, sl, pa_schema, opts.include_headers)
    else:
        for records in client.read_slice(ns, sl, opts.arrow_batch_rows):
            yield from records_to_tuples(records, sl, opts.include_headers)


def _partitions(slices: Sequence[Slice]) -> list[InputPartition]:
    return [SlicePartition(sl) for sl in slices]


def _check_offset_names(opts: SourceOptions, parts: Sequence[TopicPartition]) -> None:
    """Every topic/stream/partition a JSON offset option names must be selected: a typo
    there would otherwise read from the default offset without a word."""
    selected = {(tp.topic, tp.partition) for tp in parts} | {(tp.stream, None) for tp in parts}
    selected |= {(tp.stream, 0) for tp in parts}
    for key, spec in (
        ("startingOffsets", opts.starting),
        ("endingOffsets", opts.ending),
        ("startingOffsetsByTimestamp", opts.starting_by_timestamp),
        ("endingOffsetsByTimestamp", opts.ending_by_timestamp),
    ):
        if spec is None:
            continue
        unknown = sorted(
            f"{name}" if p is None else f"{name}/{p}"
            for name, p in spec.per_partition
            if (name, p) not in selected
        )
        if unknown:
            raise BadRequestError(
                f"option {key!r} names {', '.join(unknown)}, which the read does not select "
                f"(selected: {', '.join(sorted({tp.topic for tp in parts})) or 'nothing'})"
            )


def _at_timestamp(
    ns: Any, tp: TopicPartition, view: StreamView, ts: int, *, start: bool, how: str
) -> int:
    seq = client.sequence_at_timestamp(ns, tp.stream, ts)
    if seq is not None:
        return seq
    if start and how == "error":
        raise BadRequestError(
            f"{tp.topic}/{tp.partition}: no record at or after timestamp {ts} (set "
            "startingOffsetsByTimestampStrategy=latest to start at the end instead)"
        )
    return view.next_sequence_id


def start_offset(opts: SourceOptions, ns: Any, tp: TopicPartition, view: StreamView) -> int | None:
    """Where a read of ``tp`` starts (None: earliest); Kafka's precedence."""
    ts = opts.starting_timestamp_ms
    if ts is None and opts.starting_by_timestamp is not None:
        ts = opts.starting_by_timestamp.value_for(tp.topic, tp.partition, tp.stream)
    if ts is not None:
        return _at_timestamp(ns, tp, view, ts, start=True, how=opts.by_timestamp_strategy)
    if opts.starting.kind == "latest":
        return view.next_sequence_id
    return opts.starting.value_for(tp.topic, tp.partition, tp.stream)


def end_offset(opts: SourceOptions, ns: Any, tp: TopicPartition, view: StreamView) -> int | None:
    """Where a batch read of ``tp`` ends, exclusive (None: latest)."""
    ts = opts.ending_timestamp_ms
    if ts is None and opts.ending_by_timestamp is not None:
        ts = opts.ending_by_timestamp.value_for(tp.topic, tp.partition, tp.stream)
    if ts is not None:
        return _at_timestamp(ns, tp, view, ts, start=False, how="latest")
    return opts.ending.value_for(tp.topic, tp.partition, tp.stream)


class BooklineBatchReader(DataSourceReader):
    def __init__(self, opts: SourceOptions, schema: StructType) -> None:
        self.opts = opts
        self.schema = schema

    def partitions(self) -> Sequence[InputPartition]:
        opts = self.opts
        ns = client.namespace_for(opts.connection)
        parts = client.select_partitions(ns, opts.selection)
        _check_offset_names(opts, parts)
        ranges: list[tuple[StreamView, int, int]] = []
        for tp in parts:
            view = client.snapshot(ns, tp.stream)
            lo, hi = resolve_range(
                view,
                start_offset(opts, ns, tp, view),
                end_offset(opts, ns, tp, view),
                fail_on_data_loss=opts.fail_on_data_loss,
            )
            ranges.append((view, lo, hi))
        slices = plan_slices(
            ranges,
            min_partitions=opts.min_partitions,
            max_records=opts.max_records_per_partition,
            fail_on_data_loss=opts.fail_on_data_loss,
        )
        log.info("bookline batch read: %d slices over %d partitions", len(slices), len(ranges))
        # Spark wants at least one partition; an empty one reads nothing.
        return _partitions(slices) or [SlicePartition(None)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return _read_partition(self.opts, self.schema, partition)


class BooklineStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batch reader; offsets are Kafka's ``{"t": {"0": next offset}}`` (a plain
    stream: ``{"s": next offset}``)."""

    def __init__(
        self, opts: SourceOptions, schema: StructType, clock: Any = time.monotonic
    ) -> None:
        self.opts = opts
        self.schema = schema
        self._clock = clock
        # Trigger.AvailableNow: the offsets (per stream) the query must stop at.
        self._target: dict[str, int] | None = None
        # minOffsetsPerTrigger/maxTriggerDelay: when the last micro-batch was planned.
        self._last_trigger_s = clock()

    def _ns(self) -> Any:
        return client.namespace_for(self.opts.connection)

    def _latest(self) -> dict[str, StreamView]:
        ns = self._ns()
        return {
            tp.stream: client.snapshot(ns, tp.stream)
            for tp in client.select_partitions(ns, self.opts.selection)
        }

    def initialOffset(self) -> dict[str, Any]:
        ns = self._ns()
        parts = client.select_partitions(ns, self.opts.selection)
        _check_offset_names(self.opts, parts)
        offsets: dict[TopicPartition, int] = {}
        for tp in parts:
            view = client.snapshot(ns, tp.stream)
            lo, _hi = resolve_range(
                view,
                start_offset(self.opts, ns, tp, view),
                None,
                fail_on_data_loss=self.opts.fail_on_data_loss,
            )
            offsets[tp] = lo
        return encode_offsets(offsets)

    def latestOffset(self, start: dict[str, Any], limit: Any = None) -> dict[str, Any]:
        latest = self._latest()
        begin = decode_offsets(start)
        for stream, view in latest.items():
            # New partitions/streams since `start` start at their oldest record, as new
            # Kafka partitions do.
            begin.setdefault(stream, view.first_sequence_id)
        ends = {s: v.next_sequence_id for s, v in latest.items()}
        if self._target is not None:
            ends = {s: min(v, self._target.get(s, begin[s])) for s, v in ends.items()}
        max_rows: int | None = None
        if ADMISSION_CONTROL and isinstance(limit, ReadMaxRows):
            max_rows = limit.max_rows
        end = cap_end_offsets(begin, ends, max_rows)
        # Streams that disappeared keep their last offset, so offsets never go back.
        for stream, value in begin.items():
            end.setdefault(stream, value)
        if self._wait_for_more(begin, end):
            end = dict(begin)
        elif end != begin:
            self._last_trigger_s = self._clock()
        return encode_offsets({TopicPartition.of_stream(s): v for s, v in end.items()})

    def _wait_for_more(self, begin: dict[str, int], end: dict[str, int]) -> bool:
        """minOffsetsPerTrigger: too few new records and maxTriggerDelay not yet over
        (Kafka's rule; AvailableNow ignores the minimum)."""
        low = self.opts.min_records_per_trigger
        if low is None or self._target is not None:
            return False
        available = sum(end[s] - begin.get(s, end[s]) for s in end)
        waited_ms = (self._clock() - self._last_trigger_s) * 1000.0
        return available < low and waited_ms < self.opts.max_trigger_delay_ms

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_records_per_trigger is not None:
            return ReadMaxRows(self.opts.max_records_per_trigger)
        return ReadAllAvailable()

    def reportLatestOffset(self) -> dict[str, Any] | None:
        """What Spark shows as the source's ``latestOffset`` in the query progress:
        with ``endOffset`` it gives the records behind (:func:`records_behind`)."""
        return encode_offsets(
            {TopicPartition.of_stream(s): v.next_sequence_id for s, v in self._latest().items()}
        )

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = {s: v.next_sequence_id for s, v in self._latest().items()}
        log.info("bookline AvailableNow target offsets: %s", self._target)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        ns = self._ns()
        begin, stop = decode_offsets(start), decode_offsets(end)
        ranges: list[tuple[StreamView, int, int]] = []
        for stream, hi in stop.items():
            view = client.snapshot(ns, stream)
            lo = begin.get(stream, view.first_sequence_id)
            if lo == hi:
                continue
            a, b = resolve_range(view, lo, hi, fail_on_data_loss=self.opts.fail_on_data_loss)
            ranges.append((view, a, b))
        return _partitions(
            plan_slices(
                ranges,
                min_partitions=self.opts.min_partitions,
                max_records=self.opts.max_records_per_partition,
                fail_on_data_loss=self.opts.fail_on_data_loss,
            )
        )

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return _read_partition(self.opts, self.schema, partition)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to release: offsets live in Spark's checkpoint, not in Bookline."""

    def stop(self) -> None:
        client.close_all()


def records_behind(progress_source: dict[str, Any]) -> int:
    """Records between a micro-batch's end and the latest offsets, from one entry of a
    query progress' ``sources`` (``endOffset``, ``latestOffset``; JSON text or dicts)."""
    import json

    def offsets(raw: Any) -> dict[str, int]:
        if raw is None:
            return {}
        return decode_offsets(json.loads(raw) if isinstance(raw, str) else raw)

    end, latest = (
        offsets(progress_source.get("endOffset")),
        offsets(progress_source.get("latestOffset")),
    )
    return sum(max(0, v - end.get(s, v)) for s, v in latest.items())


class BooklineDataSource(DataSource):
    """``format("bookline")``: see the module docstrings of pipeline.source and .sink."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        return read_schema_ddl(include_headers(self.options))

    def reader(self, schema: StructType) -> DataSourceReader:
        return BooklineBatchReader(parse_source_options(self.options), schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        opts = parse_source_options(self.options, streaming=True)
        return BooklineStreamReader(opts, schema)

    def writer(self, schema: StructType, overwrite: bool) -> Any:
        from pipeline.sink import BooklineBatchWriter, check_sink_schema, parse_sink_options

        check_sink_schema(schema, overwrite)
        return BooklineBatchWriter(parse_sink_options(self.options), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> Any:
        from pipeline.sink import BooklineStreamWriter, check_sink_schema, parse_sink_options

        check_sink_schema(schema, overwrite)
        return BooklineStreamWriter(parse_sink_options(self.options), schema)
