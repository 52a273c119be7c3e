"""Options of the ``bookline`` Spark data source, parsed once into frozen dataclasses.

Pure: no pyspark, no I/O. Strict: an option this module does not know is an error that
names the closest known option (``startingOffset`` -> ``startingOffsets``), so a typo
never silently reads the wrong data. Spark hands options over case-insensitively, so
they are looked up lower-cased; messages use the canonical spelling.

Where the cluster is: ``zk`` (+ ``root``, default ``/bookline``) or ``cluster`` (the path
of a ``cluster.json``); ``namespace`` defaults to ``default``; ``token``: the token
presented to bookies whose auth is on (default: the cluster file's, else
``$BOOKLINE_TOKEN``; docs/security.md). ``bookline.<setting>``
passes a core-library client setting through (any :class:`streams.config.
NamespaceConfig` field: ``bookline.password``, ``bookline.digest_type``,
``bookline.session_timeout_ms``, ...; ``bookline.ledger.<field>`` for the ledger
client's, e.g. ``bookline.ledger.read_timeout_ms``).

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

import dataclasses
import difflib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from foundation.errors import BadRequestError, ConfigError

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
# How long a sink task waits for a stream's writer lock held by another task.
LOCK_WAIT_MS_DEFAULT = 120_000
# Bytes of rows a sink task buffers before it writes its largest stream early (rows are
# otherwise written at the end of the task, so tasks start on different streams).
BUFFER_BYTES_MAX_DEFAULT = 64 << 20
# A task with at most this many bytes of rows hands them to the driver's commit, which
# writes every such task's rows with one writer per stream: small tasks do not each
# start a segment. Bounds what a task sends to the driver (x tasks per batch).
DRIVER_WRITE_BYTES_MAX_DEFAULT = 256 << 10

# Options Spark itself hands to every source and sink: not ours to judge.
_SPARK_OWN = frozenset({"path", "checkpointlocation", "queryname"})
# Kafka connector tuning options with nothing to tune here: accepted so a Kafka job
# runs unchanged, with no effect.
_KAFKA_NO_EFFECT = ("kafkaConsumer.pollTimeoutMs", "fetchOffset.numRetries",
                    "fetchOffset.retryIntervalMs", "groupIdPrefix")  # fmt: skip
_CONNECTION = ("zk", "root", "cluster", "namespace", "token")
_SELECTION = ("subscribe", "subscribePattern", "assign", "topic", "topics", "stream",
              "streams", "streamPattern")  # fmt: skip
_SOURCE = (
    *_CONNECTION, *_SELECTION, "startingOffsets", "endingOffsets", "startingTimestamp",
    "startingOffsetsByTimestamp", "startingOffsetsByTimestampStrategy", "endingTimestamp",
    "endingOffsetsByTimestamp", "failOnDataLoss", "minPartitions", "maxRecordsPerPartition",
    "maxOffsetsPerTrigger", "maxRecordsPerTrigger", "minOffsetsPerTrigger", "maxTriggerDelay",
    "includeHeaders", "arrow", "arrowBatchRows", *_KAFKA_NO_EFFECT,
)  # fmt: skip
_SINK = (*_CONNECTION, "stream", "topic", "createStreams", "idempotent", "lockWaitMs",
         "writeId", "batchId", "bufferBytesMax", "driverWriteBytesMax")  # fmt: skip
_STREAMING_ONLY_ENDS = ("endingOffsets", "endingTimestamp", "endingOffsetsByTimestamp")
SETTING_PREFIX = "bookline."

OffsetKind = Literal["earliest", "latest", "json"]
SelectionKind = Literal["topics", "topic_pattern", "assign", "streams", "stream_pattern"]


# -- strictness ----------------------------------------------------------------------


def _lower(options: Mapping[str, str]) -> dict[str, str]:
    return {str(k).lower(): str(v) for k, v in options.items()}


def check_known(options: Mapping[str, str], known: tuple[str, ...], what: str) -> None:
    """Every key must be a known option (or ``bookline.<setting>``, or Spark's own)."""
    canonical = {k.lower(): k for k in known}
    for raw in options:
        key = str(raw).lower()
        if key in canonical or key in _SPARK_OWN or key.startswith(SETTING_PREFIX):
            continue
        if key.startswith("kafka."):
            raise BadRequestError(
                f"option {raw!r} is a Kafka client setting; a bookline {what} connects with "
                "'zk' (+ 'root') or 'cluster', and client settings are 'bookline.<setting>' "
                "(e.g. bookline.password)"
            )
        close = difflib.get_close_matches(key, list(canonical), n=1, cutoff=0.6)
        hint = f"; did you mean {canonical[close[0]]!r}?" if close else ""
        raise BadRequestError(
            f"unknown option {raw!r} for a bookline {what}{hint} "
            f"(known: {', '.join(sorted(known, key=str.lower))})"
        )


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


def _int(opts: dict[str, str], key: str, minimum: int | None = None) -> int | None:
    raw = opts.get(key.lower())
    if raw is None or raw.strip() == "":
        return None
    try:
        value = int(raw.strip())
    except ValueError as exc:
        raise BadRequestError(f"option {key!r} must be an integer, got {raw!r}") from exc
    if minimum is not None and value < minimum:
        raise BadRequestError(f"option {key!r} must be >= {minimum}, got {value}")
    return value


_DURATION = re.compile(r"^\s*(\d+)\s*(ms|s|m|min|h|d)?\s*$", re.IGNORECASE)
_DURATION_MS = {"ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_duration_ms(raw: str, key: str) -> int:
    """``"15m"``, ``"30s"``, ``"500ms"``, ``"1h"`` or a number of milliseconds."""
    m = _DURATION.match(raw)
    if m is None:
        raise BadRequestError(f"option {key!r} must be a duration like 15m, 30s or 500ms: {raw!r}")
    return int(m.group(1)) * _DURATION_MS[(m.group(2) or "ms").lower()]


def _names(raw: str) -> tuple[str, ...]:
    return tuple(dict.fromkeys(n.strip() for n in raw.split(",") if n.strip()))


# -- connection ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ConnectionOptions:
    """Where the cluster is, and client settings: enough for an executor to open a
    SyncNamespace. Hashable: processes keep one namespace per distinct value."""

    # ZooKeeper connect string (with chroot); None when `cluster` names a cluster.json.
    zk: str | None = None
    # The cluster's root znode.
    root: str = "/bookline"
    # Path of a cluster.json (as written by `bookline local`); read on every process.
    cluster: str | None = None
    # The namespace holding the streams.
    namespace: str = "default"
    # `bookline.<setting>` options, sorted (name without the prefix, value as given).
    settings: tuple[tuple[str, str], ...] = ()
    # Token presented to bookies with auth on (docs/security.md); None: the cluster
    # file's, else $BOOKLINE_TOKEN. Never shown (Spark redacts options named token).
    token: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if (self.zk is None) == (self.cluster is None):
            raise BadRequestError("give exactly one of the options 'zk' and 'cluster'")
        namespace_config(self)  # settings are checked when parsed, not on an executor


def _setting_value(raw: str, default: object, name: str) -> object:
    if isinstance(default, bool):
        return _bool({name: raw}, name, default)
    if isinstance(default, int):
        value = _int({name: raw}, name)
        return default if value is None else value
    return raw


def namespace_config(conn: ConnectionOptions) -> Any:
    """The :class:`streams.config.NamespaceConfig` the ``bookline.*`` settings give
    (None when there are none: the library's defaults)."""
    if not conn.settings:
        return None
    from ledger.config import LedgerConfig
    from streams.config import NamespaceConfig

    top = {f.name: f for f in dataclasses.fields(NamespaceConfig) if f.name != "ledger"}
    led = {f.name: f for f in dataclasses.fields(LedgerConfig)}
    top_values: dict[str, object] = {}
    ledger_values: dict[str, object] = {}
    for name, raw in conn.settings:
        key = f"{SETTING_PREFIX}{name}"
        if name.startswith("ledger.") and name[7:] in led:
            f = led[name[7:]]
            ledger_values[f.name] = _setting_value(raw, f.default, key)
        elif name in top:
            top_values[name] = _setting_value(raw, top[name].default, key)
        else:
            known = [*top, *(f"ledger.{n}" for n in led)]
            close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
            hint = f"; did you mean '{SETTING_PREFIX}{close[0]}'?" if close else ""
            raise BadRequestError(f"unknown client setting {key!r}{hint}")
    try:
        ledger = LedgerConfig(**ledger_values)  # type: ignore[arg-type]
        return NamespaceConfig(ledger=ledger, **top_values)  # type: ignore[arg-type]
    except (ConfigError, TypeError, ValueError) as exc:
        raise BadRequestError(f"bookline.* client settings: {exc}") from exc


def parse_connection(options: Mapping[str, str]) -> ConnectionOptions:
    opts = _lower(options)
    settings = tuple(
        sorted(
            (k[len(SETTING_PREFIX) :], v) for k, v in opts.items() if k.startswith(SETTING_PREFIX)
        )
    )
    return ConnectionOptions(
        zk=opts.get("zk"),
        root=opts.get("root", "/bookline"),
        cluster=opts.get("cluster"),
        namespace=opts.get("namespace", "default"),
        settings=settings,
        token=opts.get("token") or None,
    )


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
    names = _names(raw)
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
    opts = _lower(options)
    if streaming:
        for key in _STREAMING_ONLY_ENDS:
            if key.lower() in opts:
                raise BadRequestError(f"option {key!r} is for batch reads; a stream has no end")
    max_kafka, max_ours = (
        _int(opts, "maxOffsetsPerTrigger", 1),
        _int(opts, "maxRecordsPerTrigger", 1),
    )
    if max_kafka is not None and max_ours is not None:
        raise BadRequestError("give one of 'maxOffsetsPerTrigger' and 'maxRecordsPerTrigger'")
    delay = opts.get("maxtriggerdelay")
    by_start, by_end = opts.get("startingoffsetsbytimestamp"), opts.get("endingoffsetsbytimestamp")
    per_partition = _int(opts, "maxRecordsPerPartition", 1)
    arrow_rows = _int(opts, "arrowBatchRows", 1)
    return SourceOptions(
        connection=parse_connection(options),
        selection=_selection(opts),
        starting=parse_offsets(
            opts.get("startingoffsets"), "startingOffsets", "latest" if streaming else "earliest"
        ),
        ending=parse_offsets(opts.get("endingoffsets"), "endingOffsets", "latest"),
        starting_timestamp_ms=_int(opts, "startingTimestamp", 0),
        ending_timestamp_ms=_int(opts, "endingTimestamp", 0),
        starting_by_timestamp=None
        if by_start is None
        else parse_offsets(by_start, "startingOffsetsByTimestamp", "earliest", minimum=0),
        ending_by_timestamp=None
        if by_end is None
        else parse_offsets(by_end, "endingOffsetsByTimestamp", "latest", minimum=0),
        by_timestamp_strategy=opts.get("startingoffsetsbytimestampstrategy", "error").lower(),
        fail_on_data_loss=_bool(opts, "failOnDataLoss", True),
        min_partitions=_int(opts, "minPartitions", 1),
        max_records_per_partition=per_partition or RECORDS_PER_PARTITION_DEFAULT,
        max_records_per_trigger=max_kafka if max_kafka is not None else max_ours,
        min_records_per_trigger=_int(opts, "minOffsetsPerTrigger", 1),
        max_trigger_delay_ms=MAX_TRIGGER_DELAY_MS_DEFAULT
        if delay is None
        else parse_duration_ms(delay, "maxTriggerDelay"),
        include_headers=_bool(opts, "includeHeaders", False),
        arrow=_bool(opts, "arrow", ARROW_DEFAULT),
        arrow_batch_rows=arrow_rows or ARROW_BATCH_ROWS_DEFAULT,
        streaming=streaming,
    )


def include_headers(options: Mapping[str, str]) -> bool:
    """Only ``includeHeaders`` (the schema depends on it, before the rest is parsed)."""
    return _bool(_lower(options), "includeHeaders", False)


# -- sink ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SinkOptions:
    """Every write option, validated."""

    connection: ConnectionOptions
    # Default target stream / topic when the row has no stream / topic column (or null).
    stream: str | None = None
    topic: str | None = None
    # Create a target stream that does not exist yet.
    create_streams: bool = True
    # Exactly once per batch id (see pipeline.sink); false: plain appends.
    idempotent: bool = True
    # How long a task waits for a stream's single-writer lock held by another task.
    lock_wait_ms: int = LOCK_WAIT_MS_DEFAULT
    # Batch writes from foreachBatch: a stable writer id and the micro-batch id make a
    # replayed micro-batch a no-op (default: a fresh id per write, batch 0).
    write_id: str | None = None
    batch_id: int | None = None
    # Bytes of rows a task buffers (executor memory) before writing its largest stream.
    buffer_bytes_max: int = BUFFER_BYTES_MAX_DEFAULT
    # Rows of a task up to this many bytes are written by the driver's commit (0: never).
    driver_write_bytes_max: int = DRIVER_WRITE_BYTES_MAX_DEFAULT

    def __post_init__(self) -> None:
        if self.driver_write_bytes_max < 0:
            raise BadRequestError(
                f"driverWriteBytesMax must be >= 0, got {self.driver_write_bytes_max}"
            )
        if self.buffer_bytes_max < 1:
            raise BadRequestError(f"bufferBytesMax must be >= 1, got {self.buffer_bytes_max}")
        if self.stream is not None and self.topic is not None:
            raise BadRequestError("give at most one of the options 'stream' and 'topic'")
        if self.lock_wait_ms < 0:
            raise BadRequestError(f"lockWaitMs must be >= 0, got {self.lock_wait_ms}")
        if (self.write_id is None) != (self.batch_id is None):
            raise BadRequestError("give both options 'writeId' and 'batchId', or neither")
        if self.write_id is not None and (":" in self.write_id or not self.write_id):
            raise BadRequestError(f"writeId must be non-empty without ':', got {self.write_id!r}")
        if self.batch_id is not None and self.batch_id < 0:
            raise BadRequestError(f"batchId must be >= 0, got {self.batch_id}")


def parse_sink_options(options: Mapping[str, str]) -> SinkOptions:
    check_known(options, _SINK, "write")
    opts = _lower(options)
    lock_wait = _int(opts, "lockWaitMs")
    driver_bytes = _int(opts, "driverWriteBytesMax")
    return SinkOptions(
        connection=parse_connection(options),
        stream=opts.get("stream"),
        topic=opts.get("topic"),
        create_streams=_bool(opts, "createStreams", True),
        idempotent=_bool(opts, "idempotent", True),
        lock_wait_ms=LOCK_WAIT_MS_DEFAULT if lock_wait is None else lock_wait,
        write_id=opts.get("writeid"),
        batch_id=_int(opts, "batchId"),
        buffer_bytes_max=_int(opts, "bufferBytesMax") or BUFFER_BYTES_MAX_DEFAULT,
        driver_write_bytes_max=DRIVER_WRITE_BYTES_MAX_DEFAULT
        if driver_bytes is None
        else driver_bytes,
    )
