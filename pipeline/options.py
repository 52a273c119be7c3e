"""Options of the ``bookline`` Spark data source, parsed once into frozen dataclasses.

This module holds the read options and names every option type and parser: the
connection and the strict parsing every option set shares are
:mod:`pipeline.options_common` (pure, no pyspark, no I/O; an unknown option is an error
naming the closest known one), the write options :mod:`pipeline.options_sink`.

What to read, exactly one of (Kafka's names with Kafka's meaning, plus Bookline's):

* ``subscribe`` / ``topic`` / ``topics``: comma-separated topics; each is every partition
  of a topic (partition ``p`` of topic ``t`` is the stream ``t~p``) or, for a plain
  stream of that name, the stream as partition 0;
* ``subscribePattern``: a regex matching whole topic names (plain streams included);
* ``assign``: JSON ``{"t": [0, 1], ...}``, those partitions only;
* ``stream`` / ``streams``: stream names; ``streamPattern``: a regex over stream names.

Offsets are per-partition **sequence ids** (0, 1, 2, ... across segments); a start is
inclusive and an end exclusive, as in Kafka. ``startingOffsets`` / ``endingOffsets`` are
``earliest``, ``latest`` or JSON: Kafka's ``{"t": {"0": 23, "1": -2}}`` (``-2`` earliest,
``-1`` latest) or, for a plain stream, ``{"s": 23}``. A partition the JSON does not name
gets the default (earliest start, latest end); a name that is not selected is an error.
By timestamp (ms since the epoch; first record at or after it): ``startingTimestamp``
(every partition), ``startingOffsetsByTimestamp`` (JSON per partition), ``endingTimestamp``,
``endingOffsetsByTimestamp``; precedence as in Kafka: timestamp, by-timestamp, offsets.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from foundation.errors import BadRequestError
from pipeline.options_common import (
    CONNECTION_OPTIONS,
    ConnectionOptions,
    bool_option,
    check_known,
    int_option,
    lowered,
    name_list,
    namespace_config,
    parse_connection,
    parse_duration_ms,
)
from pipeline.options_sink import SinkOptions, parse_sink_options

__all__ = [
    "EARLIEST",
    "LATEST",
    "ConnectionOptions",
    "OffsetSpec",
    "Selection",
    "SinkOptions",
    "SourceOptions",
    "namespace_config",
    "parse_connection",
    "parse_duration_ms",
    "parse_offsets",
    "parse_sink_options",
    "parse_source_options",
]

# Kafka's sentinel offsets in JSON offset specs.
EARLIEST = -2
LATEST = -1
# A batch slice reads at most this many records unless minPartitions asks for smaller
# ones: big enough to amortise task start-up, small enough to spread a segment over cores.
RECORDS_PER_PARTITION_DEFAULT = 200_000
# Same bound on a micro-batch slice (records), so a late-starting query parallelises.
RECORDS_PER_PARTITION_MAX = 10_000_000
# Tasks yield Arrow record batches by default (docs/benchmarks.md); `arrow=false` gives
# Python tuples.
ARROW_DEFAULT = True
# Rows per Arrow record batch a read task yields; bounds executor memory per batch.
ARROW_BATCH_ROWS_DEFAULT = 10_000
# Kafka's default maxTriggerDelay (with minOffsetsPerTrigger): 15 minutes.
MAX_TRIGGER_DELAY_MS_DEFAULT = 15 * 60_000

# Kafka connector tuning options with nothing to tune here: accepted so a Kafka job
# runs unchanged, with no effect.
_KAFKA_NO_EFFECT = ("kafkaConsumer.pollTimeoutMs", "fetchOffset.numRetries",
                    "fetchOffset.retryIntervalMs", "groupIdPrefix")  # fmt: skip
_SELECTION = ("subscribe", "subscribePattern", "assign", "topic", "topics", "stream",
              "streams", "streamPattern")  # fmt: skip
_SOURCE = (
    *CONNECTION_OPTIONS, *_SELECTION, "startingOffsets", "endingOffsets", "startingTimestamp",
    "startingOffsetsByTimestamp", "startingOffsetsByTimestampStrategy", "endingTimestamp",
    "endingOffsetsByTimestamp", "failOnDataLoss", "minPartitions", "maxRecordsPerPartition",
    "maxOffsetsPerTrigger", "maxRecordsPerTrigger", "minOffsetsPerTrigger", "maxTriggerDelay",
    "includeHeaders", "arrow", "arrowBatchRows", *_KAFKA_NO_EFFECT,
)  # fmt: skip
_STREAMING_ONLY_ENDS = ("endingOffsets", "endingTimestamp", "endingOffsetsByTimestamp")

OffsetKind = Literal["earliest", "latest", "json"]
SelectionKind = Literal["topics", "topic_pattern", "assign", "streams", "stream_pattern"]


# -- what to read --------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Selection:
    """What a read selects, before it is resolved against the cluster."""

    kind: SelectionKind
    # Topic or stream names (kinds "topics", "streams"), in the order given.
    names: tuple[str, ...] = ()
    # Regular expression matching whole names (kinds "topic_pattern", "stream_pattern").
    pattern: str | None = None
    # kind "assign": (topic, partitions) pairs.
    assign: tuple[tuple[str, tuple[int, ...]], ...] = ()

    def matches(self, name: str) -> bool:
        return self.pattern is not None and re.fullmatch(self.pattern, name) is not None


def _selection(opts: dict[str, str]) -> Selection:
    given = [k for k in _SELECTION if k.lower() in opts]
    if len(given) != 1:
        raise BadRequestError(
            "give exactly one of the options " + ", ".join(repr(k) for k in _SELECTION)
            + f" (got {given or 'none'})"
        )  # fmt: skip
    key = given[0]
    raw = opts[key.lower()]
    if key in ("subscribePattern", "streamPattern"):
        try:
            re.compile(raw)
        except re.error as exc:
            raise BadRequestError(f"{key} {raw!r} is not a regex: {exc}") from exc
        kind: SelectionKind = "topic_pattern" if key == "subscribePattern" else "stream_pattern"
        return Selection(kind, pattern=raw)
    if key == "assign":
        return Selection("assign", assign=_parse_assign(raw))
    names = name_list(raw)
    if not names:
        raise BadRequestError(f"option {key!r} names nothing")
    return Selection("streams" if key in ("stream", "streams") else "topics", names=names)


def _parse_assign(raw: str) -> tuple[tuple[str, tuple[int, ...]], ...]:
    try:
        data = json.loads(raw)
    except json.JSONDecodeError as exc:
        raise BadRequestError(
            f"option 'assign' must be JSON like {{\"t\": [0, 1]}}: {raw!r}"
        ) from exc
    if not isinstance(data, dict) or not data:
        raise BadRequestError(f"option 'assign' must be a non-empty JSON object: {raw!r}")
    out = []
    for topic, parts in data.items():
        if (
            not isinstance(parts, list)
            or not parts
            or not all(_is_int(p) and p >= 0 for p in parts)
        ):
            raise BadRequestError(f"option 'assign': topic {topic!r} needs a list of partitions")
        out.append((str(topic), tuple(sorted(set(parts)))))
    return tuple(out)


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


# -- offsets -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class OffsetSpec:
    """``earliest``, ``latest`` or explicit values per partition (offsets: -2/-1 allowed;
    timestamps: ms since the epoch)."""

    kind: OffsetKind
    # Only for kind "json": (name, partition) -> value; a plain {"s": n} is (s, None).
    per_partition: Mapping[tuple[str, int | None], int] = field(default_factory=dict)

    def names(self) -> set[str]:
        return {name for name, _p in self.per_partition}

    def value_for(self, topic: str, partition: int, stream: str) -> int | None:
        """The value for partition ``partition`` of ``topic`` (the stream ``stream``)."""
        if self.kind != "json":
            return None
        for key in ((topic, partition), (stream, None), (stream, 0)):
            if key in self.per_partition:
                return self.per_partition[key]
        return None


def parse_offsets(
    raw: str | None, key: str, default: OffsetKind, *, minimum: int = EARLIEST
) -> OffsetSpec:
    """Parse ``earliest`` / ``latest`` / ``{"t": {"0": n}}`` / ``{"s": n}``."""
    if raw is None or raw.strip() == "":
        return OffsetSpec(default)
    text = raw.strip()
    if text.lower() in ("earliest", "latest") and minimum == EARLIEST:
        return OffsetSpec("earliest" if text.lower() == "earliest" else "latest")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise BadRequestError(
            f"option {key!r} must be 'earliest', 'latest' or JSON like "
            f'{{"topic": {{"0": 23}}}} or {{"stream": 23}}, got {raw!r}'
        ) from exc
    if not isinstance(data, dict):
        raise BadRequestError(f"option {key!r}: JSON must be an object, got {raw!r}")
    per: dict[tuple[str, int | None], int] = {}

    def check(name: str, value: object) -> int:
        if not _is_int(value) or value < minimum:  # type: ignore[operator]
            what = "a sequence id >= 0, -1 (latest) or -2 (earliest)" if minimum < 0 else (
                "a timestamp in ms >= 0")  # fmt: skip
            raise BadRequestError(f"option {key!r}: {name!r} needs {what}, got {value!r}")
        assert isinstance(value, int)
        return value

    for name, value in data.items():
        if isinstance(value, dict):
            for part, v in value.items():
                if not str(part).isdigit():
                    raise BadRequestError(f"option {key!r}: {name!r} has partition {part!r}")
                per[(str(name), int(part))] = check(f"{name}/{part}", v)
        else:
            per[(str(name), None)] = check(str(name), value)
    return OffsetSpec("json", per)


# -- source --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SourceOptions:
    """Every read option, validated."""

    connection: ConnectionOptions
    selection: Selection
    starting: OffsetSpec = OffsetSpec("earliest")
    ending: OffsetSpec = OffsetSpec("latest")
    # startingTimestamp / endingTimestamp (ms since the epoch) for every partition.
    starting_timestamp_ms: int | None = None
    ending_timestamp_ms: int | None = None
    # startingOffsetsByTimestamp / endingOffsetsByTimestamp (timestamps per partition).
    starting_by_timestamp: OffsetSpec | None = None
    ending_by_timestamp: OffsetSpec | None = None
    # No record at/after a starting timestamp: "error" (Kafka's default) or "latest".
    by_timestamp_strategy: str = "error"
    # True: a requested range that was truncated/deleted is an error; False: skip it.
    fail_on_data_loss: bool = True
    # Lower bound on the number of Spark partitions of a batch read (a hint).
    min_partitions: int | None = None
    # Upper bound on the records of one Spark partition (splits large segments).
    max_records_per_partition: int = RECORDS_PER_PARTITION_DEFAULT
    # Streaming admission control: at most / at least this many records per micro-batch
    # (maxOffsetsPerTrigger / minOffsetsPerTrigger); fewer than the minimum wait at most
    # max_trigger_delay_ms since the last micro-batch.
    max_records_per_trigger: int | None = None
    min_records_per_trigger: int | None = None
    max_trigger_delay_ms: int = MAX_TRIGGER_DELAY_MS_DEFAULT
    # Emit the headers column (Kafka's default: false).
    include_headers: bool = False
    # Yield Arrow record batches from read tasks instead of Python tuples.
    arrow: bool = ARROW_DEFAULT
    arrow_batch_rows: int = ARROW_BATCH_ROWS_DEFAULT
    # A streaming read (ending options are refused, the start defaults to latest).
    streaming: bool = False

    def __post_init__(self) -> None:
        if self.ending.kind == "earliest" or EARLIEST in self.ending.per_partition.values():
            raise BadRequestError("endingOffsets cannot be 'earliest' (-2)")
        if not self.streaming and (
            self.starting.kind == "latest" or LATEST in self.starting.per_partition.values()
        ):
            raise BadRequestError("startingOffsets cannot be 'latest' (-1) for a batch read")
        if not 1 <= self.max_records_per_partition <= RECORDS_PER_PARTITION_MAX:
            raise BadRequestError(
                f"maxRecordsPerPartition must be in 1..{RECORDS_PER_PARTITION_MAX}, "
                f"got {self.max_records_per_partition}"
            )
        lo, hi = self.min_records_per_trigger, self.max_records_per_trigger
        if lo is not None and hi is not None and lo > hi:
            raise BadRequestError(
                f"minOffsetsPerTrigger ({lo}) is larger than maxOffsetsPerTrigger ({hi})"
            )
        if self.by_timestamp_strategy not in ("error", "latest"):
            raise BadRequestError(
                "startingOffsetsByTimestampStrategy must be 'error' or 'latest', got "
                f"{self.by_timestamp_strategy!r}"
            )


def parse_source_options(options: Mapping[str, str], *, streaming: bool = False) -> SourceOptions:
    """Validate every read option; an unknown one is an error naming the closest."""
    check_known(options, _SOURCE, "read")
    opts = lowered(options)
    if streaming:
        for key in _STREAMING_ONLY_ENDS:
            if key.lower() in opts:
                raise BadRequestError(f"option {key!r} is for batch reads; a stream has no end")
    max_kafka, max_ours = (
        int_option(opts, "maxOffsetsPerTrigger", 1),
        int_option(opts, "maxRecordsPerTrigger", 1),
    )
    if max_kafka is not None and max_ours is not None:
        raise BadRequestError("give one of 'maxOffsetsPerTrigger' and 'maxRecordsPerTrigger'")
    delay = opts.get("maxtriggerdelay")
    by_start, by_end = opts.get("startingoffsetsbytimestamp"), opts.get("endingoffsetsbytimestamp")
    per_partition = int_option(opts, "maxRecordsPerPartition", 1)
    arrow_rows = int_option(opts, "arrowBatchRows", 1)
    return SourceOptions(
        connection=parse_connection(options),
        selection=_selection(opts),
        starting=parse_offsets(
            opts.get("startingoffsets"), "startingOffsets", "latest" if streaming else "earliest"
        ),
        ending=parse_offsets(opts.get("endingoffsets"), "endingOffsets", "latest"),
        starting_timestamp_ms=int_option(opts, "startingTimestamp", 0),
        ending_timestamp_ms=int_option(opts, "endingTimestamp", 0),
        starting_by_timestamp=None
        if by_start is None
        else parse_offsets(by_start, "startingOffsetsByTimestamp", "earliest", minimum=0),
        ending_by_timestamp=None
        if by_end is None
        else parse_offsets(by_end, "endingOffsetsByTimestamp", "latest", minimum=0),
        by_timestamp_strategy=opts.get("startingoffsetsbytimestampstrategy", "error").lower(),
        fail_on_data_loss=bool_option(opts, "failOnDataLoss", True),
        min_partitions=int_option(opts, "minPartitions", 1),
        max_records_per_partition=per_partition or RECORDS_PER_PARTITION_DEFAULT,
        max_records_per_trigger=max_kafka if max_kafka is not None else max_ours,
        min_records_per_trigger=int_option(opts, "minOffsetsPerTrigger", 1),
        max_trigger_delay_ms=MAX_TRIGGER_DELAY_MS_DEFAULT
        if delay is None
        else parse_duration_ms(delay, "maxTriggerDelay"),
        include_headers=bool_option(opts, "includeHeaders", False),
        arrow=bool_option(opts, "arrow", ARROW_DEFAULT),
        arrow_batch_rows=arrow_rows or ARROW_BATCH_ROWS_DEFAULT,
        streaming=streaming,
    )


def include_headers(options: Mapping[str, str]) -> bool:
    """Only ``includeHeaders`` (the schema depends on it, before the rest is parsed)."""
    return bool_option(lowered(options), "includeHeaders", False)
