"""Options of the ``bookline`` Spark data source, parsed once into frozen dataclasses.

Pure: no pyspark, no I/O. Names follow Spark's Kafka connector where the meaning matches
(``startingOffsets``, ``endingOffsets``, ``startingTimestamp``, ``failOnDataLoss``,
``minPartitions``, ``maxRecordsPerTrigger``, ``includeHeaders``); Spark hands options
over case-insensitively, so they are looked up lower-cased.

Where the cluster is: ``zk`` (+ ``root``, default ``/bookline``) or ``cluster`` (the path
of a ``cluster.json`` written by ``bookline local``); ``namespace`` defaults to
``default``.

What to read: exactly one of ``stream`` (one name), ``streams`` (comma-separated),
``topic`` / ``topics`` or ``streamPattern`` (a regular expression that must match the
whole stream name, like Kafka's ``subscribePattern``). A *topic* is an alias naming a
stream today; when partitioned topics land, :func:`topic_streams` is the one place that
expands a topic into its partition streams.

Offsets are per-stream **sequence ids** (0, 1, 2, ... across segments). A start is
inclusive and an end exclusive, as in Kafka. ``startingOffsets`` / ``endingOffsets`` are
``earliest``, ``latest`` or JSON ``{"stream": n, ...}`` where ``-2`` means earliest and
``-1`` latest (``-2`` is not allowed as an end); a stream the JSON does not name gets
earliest (start) or latest (end).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from foundation.errors import BadRequestError

__all__ = [
    "EARLIEST",
    "LATEST",
    "ConnectionOptions",
    "OffsetSpec",
    "SinkOptions",
    "SourceOptions",
    "parse_offsets",
    "parse_sink_options",
    "parse_source_options",
    "topic_streams",
]

# Kafka's sentinel offsets in JSON offset specs.
EARLIEST = -2
LATEST = -1
# A batch slice reads at most this many records unless minPartitions asks for smaller
# ones: big enough to amortise task start-up, small enough to spread a segment over cores.
RECORDS_PER_PARTITION_DEFAULT = 200_000
# Same bound on a micro-batch slice (records), so a late-starting query parallelises.
RECORDS_PER_PARTITION_MAX = 10_000_000
# Tasks yield Arrow record batches by default: on a quiet machine they read ~1.2x faster
# than Python tuples (docs/benchmarks.md, final pass); `arrow=false` gives tuples.
ARROW_DEFAULT = True
# Rows per Arrow record batch a read task yields; bounds executor memory per batch.
ARROW_BATCH_ROWS_DEFAULT = 10_000

OffsetKind = Literal["earliest", "latest", "json"]


@dataclass(frozen=True, slots=True)
class OffsetSpec:
    """``earliest``, ``latest`` or explicit per-stream sequence ids (-2/-1 allowed)."""

    kind: OffsetKind
    # Only for kind "json": stream name -> sequence id, EARLIEST or LATEST.
    per_stream: Mapping[str, int] = field(default_factory=dict)

    def for_stream(self, stream: str) -> int | None:
        """The explicit sequence id for ``stream``; None for earliest/latest defaults."""
        if self.kind == "json":
            value = self.per_stream.get(stream)
            if value is not None and value >= 0:
                return value
            if value == LATEST:
                return LATEST
            if value == EARLIEST:
                return EARLIEST
        return None


@dataclass(frozen=True, slots=True)
class ConnectionOptions:
    """Where the cluster is; enough for an executor to open a SyncNamespace."""

    # ZooKeeper connect string (with chroot); None when `cluster` names a cluster.json.
    zk: str | None = None
    # The cluster's root znode.
    root: str = "/bookline"
    # Path of a cluster.json (as written by `bookline local`); read on every process.
    cluster: str | None = None
    # The namespace holding the streams.
    namespace: str = "default"

    def __post_init__(self) -> None:
        if (self.zk is None) == (self.cluster is None):
            raise BadRequestError("give exactly one of the options 'zk' and 'cluster'")


@dataclass(frozen=True, slots=True)
class SourceOptions:
    """Every read option, validated."""

    connection: ConnectionOptions
    # Explicit stream names (stream/streams/topic/topics), in the order given.
    streams: tuple[str, ...] = ()
    # Regular expression matched against whole stream names (streamPattern).
    pattern: str | None = None
    starting: OffsetSpec = OffsetSpec("earliest")
    ending: OffsetSpec = OffsetSpec("latest")
    # startingTimestamp (ms since the epoch): overrides startingOffsets when given.
    starting_timestamp_ms: int | None = None
    # True: a requested range that was truncated/deleted is an error; False: skip it.
    fail_on_data_loss: bool = True
    # Lower bound on the number of Spark partitions of a batch read (a hint).
    min_partitions: int | None = None
    # Upper bound on the records of one Spark partition (splits large segments).
    max_records_per_partition: int = RECORDS_PER_PARTITION_DEFAULT
    # Admission control of streaming reads: records per micro-batch (None: all).
    max_records_per_trigger: int | None = None
    # Emit the headers column (map<string,binary>).
    include_headers: bool = True
    # Yield Arrow record batches from read tasks instead of Python tuples.
    arrow: bool = ARROW_DEFAULT
    arrow_batch_rows: int = ARROW_BATCH_ROWS_DEFAULT

    def __post_init__(self) -> None:
        if bool(self.streams) == (self.pattern is not None):
            raise BadRequestError(
                "give exactly one of the options 'stream', 'streams', 'topic', 'topics' "
                "and 'streamPattern'"
            )
        if self.ending.kind == "earliest" or EARLIEST in self.ending.per_stream.values():
            raise BadRequestError("endingOffsets cannot be 'earliest' (-2)")
        if self.min_partitions is not None and self.min_partitions < 1:
            raise BadRequestError(f"minPartitions must be >= 1, got {self.min_partitions}")
        if not 1 <= self.max_records_per_partition <= RECORDS_PER_PARTITION_MAX:
            raise BadRequestError(
                f"maxRecordsPerPartition must be in 1..{RECORDS_PER_PARTITION_MAX}, "
                f"got {self.max_records_per_partition}"
            )
        if self.max_records_per_trigger is not None and self.max_records_per_trigger < 1:
            raise BadRequestError(
                f"maxRecordsPerTrigger must be >= 1, got {self.max_records_per_trigger}"
            )
        if self.arrow_batch_rows < 1:
            raise BadRequestError(f"arrowBatchRows must be >= 1, got {self.arrow_batch_rows}")

    def matches(self, stream: str) -> bool:
        """True when a stream found in the namespace is selected by ``streamPattern``."""
        return self.pattern is not None and re.fullmatch(self.pattern, stream) is not None


@dataclass(frozen=True, slots=True)
class SinkOptions:
    """Every write option, validated."""

    connection: ConnectionOptions
    # Default target stream when the DataFrame has no stream/topic column (or it is null).
    stream: str | None = None
    # Create a target stream that does not exist yet.
    create_streams: bool = True
    # Skip rows a retried task or replayed micro-batch already wrote (see pipeline.sink).
    idempotent: bool = True
    # How long a task waits for a stream's single-writer lock held by another task.
    lock_wait_ms: int = 120_000
    # Batch writes from foreachBatch: a stable writer id and the micro-batch id make a
    # replayed micro-batch a no-op (default: a fresh id per write, batch 0).
    write_id: str | None = None
    batch_id: int | None = None

    def __post_init__(self) -> None:
        if self.lock_wait_ms < 0:
            raise BadRequestError(f"lockWaitMs must be >= 0, got {self.lock_wait_ms}")
        if (self.write_id is None) != (self.batch_id is None):
            raise BadRequestError("give both options 'writeId' and 'batchId', or neither")
        if self.write_id is not None and (":" in self.write_id or not self.write_id):
            raise BadRequestError(f"writeId must be non-empty without ':', got {self.write_id!r}")
        if self.batch_id is not None and self.batch_id < 0:
            raise BadRequestError(f"batchId must be >= 0, got {self.batch_id}")


def topic_streams(topic: str) -> tuple[str, ...]:
    """The streams a topic names. Today a topic is one stream of the same name; the
    partitioned topics of the messaging layer will expand to one stream per partition."""
    return (topic,)


def _lower(options: Mapping[str, str]) -> dict[str, str]:
    return {str(k).lower(): str(v) for k, v in options.items()}


def _bool(opts: dict[str, str], key: str, default: bool) -> bool:
    raw = opts.get(key.lower())
    if raw is None:
        return default
    text = raw.strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise BadRequestError(f"option {key!r} must be true or false, got {raw!r}")


def _int(opts: dict[str, str], key: str) -> int | None:
    raw = opts.get(key.lower())
    if raw is None or raw.strip() == "":
        return None
    try:
        # Spark passes numbers as strings; accept "1000" and "1e3"-free integers only.
        return int(raw.strip())
    except ValueError as exc:
        raise BadRequestError(f"option {key!r} must be an integer, got {raw!r}") from exc


def _names(raw: str) -> tuple[str, ...]:
    return tuple(n.strip() for n in raw.split(",") if n.strip())


def parse_offsets(raw: str | None, key: str, default: OffsetKind) -> OffsetSpec:
    """Parse ``earliest`` / ``latest`` / ``{"stream": n}`` (-2 earliest, -1 latest)."""
    if raw is None or raw.strip() == "":
        return OffsetSpec(default)
    text = raw.strip()
    if text.lower() in ("earliest", "latest"):
        kind: OffsetKind = "earliest" if text.lower() == "earliest" else "latest"
        return OffsetSpec(kind)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadRequestError(
            f"option {key!r} must be 'earliest', 'latest' or JSON like {{\"stream\": 42}}, "
            f"got {raw!r}"
        ) from exc
    if not isinstance(data, dict):
        raise BadRequestError(f"option {key!r}: JSON must be an object, got {raw!r}")
    per_stream: dict[str, int] = {}
    for stream, value in data.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < EARLIEST:
            raise BadRequestError(
                f"option {key!r}: stream {stream!r} needs a sequence id >= 0, -1 (latest) or "
                f"-2 (earliest), got {value!r}"
            )
        per_stream[str(stream)] = value
    return OffsetSpec("json", per_stream)


def parse_connection(options: Mapping[str, str]) -> ConnectionOptions:
    opts = _lower(options)
    return ConnectionOptions(
        zk=opts.get("zk"),
        root=opts.get("root", "/bookline"),
        cluster=opts.get("cluster"),
        namespace=opts.get("namespace", "default"),
    )


def _selection(opts: dict[str, str]) -> tuple[tuple[str, ...], str | None]:
    given = [k for k in ("stream", "streams", "topic", "topics", "streampattern") if k in opts]
    if len(given) != 1:
        raise BadRequestError(
            "give exactly one of the options 'stream', 'streams', 'topic', 'topics' and "
            f"'streamPattern' (got {given or 'none'})"
        )
    key = given[0]
    if key == "streampattern":
        pattern = opts[key]
        try:
            re.compile(pattern)
        except re.error as exc:
            raise BadRequestError(f"streamPattern {pattern!r} is not a regex: {exc}") from exc
        return (), pattern
    names = _names(opts[key])
    if key in ("topic", "topics"):
        names = tuple(s for topic in names for s in topic_streams(topic))
    if not names:
        raise BadRequestError(f"option {key!r} names no stream")
    return tuple(dict.fromkeys(names)), None


def parse_source_options(options: Mapping[str, str]) -> SourceOptions:
    """Validate every read option; unknown keys are left to Spark (it passes its own)."""
    opts = _lower(options)
    streams, pattern = _selection(opts)
    max_per_partition = _int(opts, "maxRecordsPerPartition")
    arrow_rows = _int(opts, "arrowBatchRows")
    return SourceOptions(
        connection=parse_connection(options),
        streams=streams,
        pattern=pattern,
        starting=parse_offsets(opts.get("startingoffsets"), "startingOffsets", "earliest"),
        ending=parse_offsets(opts.get("endingoffsets"), "endingOffsets", "latest"),
        starting_timestamp_ms=_int(opts, "startingTimestamp"),
        fail_on_data_loss=_bool(opts, "failOnDataLoss", True),
        min_partitions=_int(opts, "minPartitions"),
        max_records_per_partition=(
            RECORDS_PER_PARTITION_DEFAULT if max_per_partition is None else max_per_partition
        ),
        max_records_per_trigger=_int(opts, "maxRecordsPerTrigger"),
        include_headers=_bool(opts, "includeHeaders", True),
        arrow=_bool(opts, "arrow", ARROW_DEFAULT),
        arrow_batch_rows=ARROW_BATCH_ROWS_DEFAULT if arrow_rows is None else arrow_rows,
    )


def streaming_starting(options: Mapping[str, str]) -> OffsetSpec:
    """A streaming query starts at ``latest`` unless told otherwise (Kafka's default)."""
    opts = _lower(options)
    return parse_offsets(opts.get("startingoffsets"), "startingOffsets", "latest")


def parse_sink_options(options: Mapping[str, str]) -> SinkOptions:
    opts = _lower(options)
    stream = opts.get("stream") or opts.get("topic")
    if stream is not None:
        names = topic_streams(stream) if "topic" in opts and "stream" not in opts else (stream,)
        if len(names) != 1:
            raise BadRequestError(f"topic {stream!r} has several partitions; give a stream")
        stream = names[0]
    lock_wait = _int(opts, "lockWaitMs")
    return SinkOptions(
        connection=parse_connection(options),
        stream=stream,
        create_streams=_bool(opts, "createStreams", True),
        idempotent=_bool(opts, "idempotent", True),
        lock_wait_ms=120_000 if lock_wait is None else lock_wait,
        write_id=opts.get("writeid"),
        batch_id=_int(opts, "batchId"),
    )
