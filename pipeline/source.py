"""The ``bookline`` PySpark data source: batch and streaming reads (writes: pipeline.sink).

Batch read (``spark.read.format("bookline")``): the planner snapshots each selected
stream, resolves startingOffsets/startingTimestamp/endingOffsets into sequence-id
ranges and returns one InputPartition per segment slice; each task reads its slice from
the bookies (:func:`pipeline.client.read_slice`) and yields Python tuples (or Arrow
record batches with ``arrow=true``).

Streaming read (``spark.readStream.format("bookline")``): an offset is the JSON object
``{"stream": next sequence id to read, ...}``; a micro-batch reads [start, end) of each
stream, so a restart from a checkpoint resumes exactly. ``maxRecordsPerTrigger`` is
admission control (``getDefaultReadLimit`` -> ``ReadMaxRows``, honoured in
``latestOffset(start, limit)``), shared fairly between streams; ``Trigger.AvailableNow``
is supported (``prepareForTriggerAvailableNow`` pins the target offsets). On a Spark
without admission control (< 4.2, where ``latestOffset()`` takes no arguments) the
reader still works, reading everything available per micro-batch.
"""

from __future__ import annotations

import logging
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
from pipeline.options import (
    EARLIEST,
    OffsetSpec,
    SourceOptions,
    parse_source_options,
    streaming_starting,
)
from pipeline.planning import Slice, StreamView, cap_end_offsets, plan_slices, resolve_range
from pipeline.schema import read_schema_ddl, records_to_arrow, records_to_tuples

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

        pa_schema = to_arrow_schema(schema, timezone="UTC")
        for records in client.read_slice(ns, sl, opts.arrow_batch_rows):
            yield records_to_arrow(records, pa_schema, opts.include_headers)
    else:
        for records in client.read_slice(ns, sl, opts.arrow_batch_rows):
            yield from records_to_tuples(records, opts.include_headers)


def _partitions(slices: Sequence[Slice]) -> list[InputPartition]:
    return [SlicePartition(sl) for sl in slices]


class BooklineBatchReader(DataSourceReader):
    def __init__(self, opts: SourceOptions, schema: StructType) -> None:
        self.opts = opts
        self.schema = schema

    def _start(self, ns: Any, view: StreamView) -> int | None:
        opts = self.opts
        if opts.starting_timestamp_ms is not None:
            return client.sequence_at_timestamp(ns, view.name, opts.starting_timestamp_ms)
        if opts.starting.kind == "latest":
            return view.next_sequence_id
        return opts.starting.for_stream(view.name)

    def partitions(self) -> Sequence[InputPartition]:
        opts = self.opts
        ns = client.namespace_for(opts.connection)
        ranges: list[tuple[StreamView, int, int]] = []
        for stream in client.select_streams(ns, opts):
            view = client.snapshot(ns, stream)
            lo, hi = resolve_range(
                view,
                self._start(ns, view),
                opts.ending.for_stream(stream),
                fail_on_data_loss=opts.fail_on_data_loss,
            )
            ranges.append((view, lo, hi))
        slices = plan_slices(
            ranges,
            min_partitions=opts.min_partitions,
            max_records=opts.max_records_per_partition,
            fail_on_data_loss=opts.fail_on_data_loss,
        )
        log.info("bookline batch read: %d slices over %d streams", len(slices), len(ranges))
        # Spark wants at least one partition; an empty one reads nothing.
        return _partitions(slices) or [SlicePartition(None)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return _read_partition(self.opts, self.schema, partition)


class BooklineStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Micro-batch reader; offsets are ``{stream: next sequence id}``."""

    def __init__(self, opts: SourceOptions, starting: OffsetSpec, schema: StructType) -> None:
        self.opts = opts
        self.starting = starting
        self.schema = schema
        # Trigger.AvailableNow: the offsets the query must stop at.
        self._target: dict[str, int] | None = None

    def _ns(self) -> Any:
        return client.namespace_for(self.opts.connection)

    def _latest(self) -> dict[str, tuple[StreamView, int]]:
        ns = self._ns()
        out: dict[str, tuple[StreamView, int]] = {}
        for stream in client.select_streams(ns, self.opts):
            view = client.snapshot(ns, stream)
            out[stream] = (view, view.next_sequence_id)
        return out

    def initialOffset(self) -> dict[str, int]:
        ns = self._ns()
        offsets: dict[str, int] = {}
        for stream in client.select_streams(ns, self.opts):
            view = client.snapshot(ns, stream)
            if self.opts.starting_timestamp_ms is not None:
                start: int | None = client.sequence_at_timestamp(
                    ns, stream, self.opts.starting_timestamp_ms
                )
            elif self.starting.kind == "latest":
                start = view.next_sequence_id
            else:
                start = self.starting.for_stream(stream)
            lo, _hi = resolve_range(
                view, start, None, fail_on_data_loss=self.opts.fail_on_data_loss
            )
            offsets[stream] = lo
        return offsets

    def _normalised_start(
        self, start: dict[str, Any], latest: dict[str, tuple[StreamView, int]]
    ) -> dict[str, int]:
        """Every stream gets a start; streams new since `start` (a pattern matched a new
        stream) start at their oldest record, like new Kafka partitions."""
        out = {s: int(v) for s, v in start.items()}
        for stream, (view, _nxt) in latest.items():
            out.setdefault(stream, view.first_sequence_id)
        return out

    def latestOffset(self, start: dict[str, Any], limit: Any = None) -> dict[str, int]:
        latest = self._latest()
        begin = self._normalised_start(start, latest)
        ends = {s: nxt for s, (_view, nxt) in latest.items()}
        if self._target is not None:
            ends = {s: min(v, self._target.get(s, begin[s])) for s, v in ends.items()}
        max_rows: int | None = None
        if ADMISSION_CONTROL and isinstance(limit, ReadMaxRows):
            max_rows = limit.max_rows
        end = cap_end_offsets(begin, ends, max_rows)
        # Streams that disappeared keep their last offset, so offsets never go back.
        for stream, value in begin.items():
            end.setdefault(stream, value)
        return end

    def getDefaultReadLimit(self) -> ReadLimit:
        if self.opts.max_records_per_trigger is not None:
            return ReadMaxRows(self.opts.max_records_per_trigger)
        return ReadAllAvailable()

    def reportLatestOffset(self) -> dict[str, int] | None:
        return {s: nxt for s, (_view, nxt) in self._latest().items()}

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = {s: nxt for s, (_view, nxt) in self._latest().items()}
        log.info("bookline AvailableNow target offsets: %s", self._target)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        ns = self._ns()
        ranges: list[tuple[StreamView, int, int]] = []
        for stream, hi in end.items():
            lo = int(start.get(stream, EARLIEST))
            if lo == int(hi):
                continue
            view = client.snapshot(ns, stream)
            a, b = resolve_range(view, lo, int(hi), fail_on_data_loss=self.opts.fail_on_data_loss)
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


class BooklineDataSource(DataSource):
    """``format("bookline")``: see the module docstrings of pipeline.source and .sink."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def _include_headers(self) -> bool:
        raw = str(
            dict((k.lower(), v) for k, v in self.options.items()).get("includeheaders", "true")
        )
        if raw.lower() not in ("true", "false"):
            raise BadRequestError(f"option 'includeHeaders' must be true or false, got {raw!r}")
        return raw.lower() == "true"

    def schema(self) -> str:
        return read_schema_ddl(self._include_headers())

    def reader(self, schema: StructType) -> DataSourceReader:
        return BooklineBatchReader(parse_source_options(self.options), schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        opts = parse_source_options(self.options)
        return BooklineStreamReader(opts, streaming_starting(self.options), schema)

    def writer(self, schema: StructType, overwrite: bool) -> Any:
        from pipeline.sink import BooklineBatchWriter, check_sink_schema, parse_sink_options

        check_sink_schema(schema, overwrite)
        return BooklineBatchWriter(parse_sink_options(self.options), schema.fieldNames())

    def streamWriter(self, schema: StructType, overwrite: bool) -> Any:
        from pipeline.sink import BooklineStreamWriter, check_sink_schema, parse_sink_options

        check_sink_schema(schema, overwrite)
        return BooklineStreamWriter(parse_sink_options(self.options), schema.fieldNames())
