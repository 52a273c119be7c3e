"""Topic configs by Kafka's names: the one table, and how each maps onto Bookline. Pure.

A topic's configs are what Kafka users set with ``--config KEY=VALUE`` and read with
``describe``: ``retention.ms``, ``cleanup.policy``, ... (:data:`CONFIGS`, one row per
config: its type, bounds or choices, Bookline's default, Kafka's meaning and how
Bookline applies it; ``docs/topics.md`` shows the same table). Values are kept as
Kafka keeps them, as strings in a canonical form (``"604800000"``, ``"compact,delete"``,
``"0.5"``), in the topic's record (:class:`metadata.topics.TopicRecord`, only the
configs the topic *sets*; the rest are defaults). Every surface -- the core's
``TopicAdmin``, the proxies' topic routes, the thin client and ``bookline topic`` --
checks and applies them here:

* :func:`check_configs` -- names and values a user gave, canonical (UNKNOWN_CONFIG for
  a name not in the table, with the known ones; INVALID_CONFIG for a bad value);
* :func:`stream_options` -- what the topic's partition streams do with them (retention,
  rolls, record size, timestamps, quorums): :class:`~metadata.streams.StreamOptions`;
* :func:`effective` -- every config's value and its source, ``"topic"`` or
  ``"default"`` (what ``describe`` shows);
* :func:`compaction_configs` -- the compaction settings, typed (the compactor reads
  them; they are stored and checked here, applied there).

Some defaults are not constants: ``segment.bytes``, ``segment.ms`` and the quorums
default to the namespace's ``[core]`` settings, which :class:`NamespaceDefaults` carries.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final, Literal

from foundation.errors import InvalidConfigError, UnknownConfigError
from foundation.limits import RECORD_BYTES_MAX
from foundation.quorum import check_quorum
from metadata.streams import StreamOptions

__all__ = [
    "CONFIGS",
    "CompactionConfigs",
    "ConfigSpec",
    "EffectiveConfig",
    "NamespaceDefaults",
    "check_configs",
    "compaction_configs",
    "configs_of_options",
    "effective",
    "merge_configs",
    "stream_options",
]

Kind = Literal["long", "ratio", "choice", "list"]
Source = Literal["topic", "default"]

_LONG_MAX: Final = (1 << 63) - 1  # Kafka's longs; also what msgpack and JSON carry exactly
_NO_LIMIT: Final = -1  # Kafka's "unlimited" for retention.ms / retention.bytes


@dataclass(frozen=True, slots=True)
class ConfigSpec:
    """One config: its type and bounds, Bookline's default, and what it does."""

    name: str
    kind: Kind
    default: str | None  # None: the namespace's setting (NamespaceDefaults)
    meaning: str  # Kafka's meaning
    applied: str  # how Bookline applies it
    low: float = 0  # long / ratio: the least value (besides -1 where no_limit)
    high: float = _LONG_MAX  # ... and the largest
    choices: tuple[str, ...] = ()  # choice / list: the allowed values
    no_limit: bool = False  # -1 is accepted and means "no limit"


_SPECS: Final = (
    ConfigSpec(
        "cleanup.policy", "list", "delete",
        "What happens to old segments: delete them (by retention), compact them (keep "
        "the latest record of each key), or both.",
        "delete: retention.ms/retention.bytes drop sealed segments; compact: the "
        "compactor rewrites sealed segments (retention applies only with delete).",
        choices=("compact", "delete"),
    ),
    ConfigSpec(
        "retention.ms", "long", "-1",
        "How long a record is kept before its segment may be deleted; -1: forever.",
        "Each partition's writer drops sealed segments older than this (by seal time).",
        low=1, no_limit=True,
    ),
    ConfigSpec(
        "retention.bytes", "long", "-1",
        "The most bytes a partition keeps before old segments are deleted; -1: no limit.",
        "Each partition's writer drops its oldest sealed segments past this size.",
        low=1, no_limit=True,
    ),
    ConfigSpec(
        "segment.ms", "long", None,
        "Roll to a new segment after this long, even if it is not full.",
        "A partition's segment (one ledger) is sealed and a new one opened past this "
        "age (default: the namespace's core.segment_rollover_ms).",
        low=1,
    ),
    ConfigSpec(
        "segment.bytes", "long", None,
        "The size of a segment file; retention and compaction work on whole segments.",
        "A partition's segment is rolled past this many bytes (default: the namespace's "
        "core.segment_rollover_bytes).",
        low=1024,
    ),
    ConfigSpec(
        "message.timestamp.type", "choice", "CreateTime",
        "Whether a record's timestamp is the producer's (CreateTime) or the log's "
        "append time (LogAppendTime).",
        "LogAppendTime: the partition's writer stamps every record with its append "
        "time and readers see timestamp type 1.",
        choices=("CreateTime", "LogAppendTime"),
    ),
    ConfigSpec(
        "max.message.bytes", "long", str(RECORD_BYTES_MAX),
        "The largest record (batch) the topic accepts.",
        "A write of a record bigger than this (value + key + headers) to any partition "
        f"is refused with TOO_LARGE; at most {RECORD_BYTES_MAX} (Bookline's limit).",
        low=1, high=RECORD_BYTES_MAX,
    ),
    ConfigSpec(
        "min.compaction.lag.ms", "long", "0",
        "The least time a record stays uncompacted after it is written.",
        "Stored and checked; the compactor leaves segments younger than this alone.",
    ),
    ConfigSpec(
        "delete.retention.ms", "long", "86400000",
        "How long a tombstone (a keyed null value) is kept after compaction reaches it.",
        "Stored and checked; the compactor drops tombstones older than this.",
    ),
    ConfigSpec(
        "min.cleanable.dirty.ratio", "ratio", "0.5",
        "How much of a log must be uncompacted before the cleaner compacts it.",
        "Stored and checked; the compactor compacts a partition past this ratio.",
        low=0.0, high=1.0,
    ),
    ConfigSpec(
        "bookline.ensemble.size", "long", None,
        "(Bookline) Bookies each of a partition's ledgers is striped over.",
        "Quorums of the partitions' ledgers created from then on (default: the "
        "namespace's core.ensemble_size); ensemble >= write >= ack.",
        low=1, high=255,
    ),
    ConfigSpec(
        "bookline.write.quorum", "long", None,
        "(Bookline) Copies of each entry (Kafka's replication factor).",
        "As bookline.ensemble.size (default: core.write_quorum).",
        low=1, high=255,
    ),
    ConfigSpec(
        "bookline.ack.quorum", "long", None,
        "(Bookline) Copies acknowledged before a write is (Kafka's min.insync.replicas "
        "with acks=all).",
        "As bookline.ensemble.size (default: core.ack_quorum).",
        low=1, high=255,
    ),
)  # fmt: skip

# Every config, by name, in the table's order.
CONFIGS: Final[Mapping[str, ConfigSpec]] = {s.name: s for s in _SPECS}

_QUORUMS: Final = ("bookline.ensemble.size", "bookline.write.quorum", "bookline.ack.quorum")


@dataclass(frozen=True, slots=True)
class NamespaceDefaults:
    """The defaults that are the namespace's ``[core]`` settings."""

    segment_rollover_bytes: int
    segment_rollover_ms: int
    quorums: tuple[int, int, int]  # (ensemble, write, ack)

    def value(self, name: str) -> str:
        by_name = {
            "segment.bytes": self.segment_rollover_bytes,
            "segment.ms": self.segment_rollover_ms,
            **dict(zip(_QUORUMS, self.quorums, strict=True)),
        }
        return str(by_name[name])


@dataclass(frozen=True, slots=True)
class EffectiveConfig:
    name: str
    value: str
    source: Source  # "topic": the topic sets it; "default": it does not


def _bad(spec: ConfigSpec, value: object, why: str) -> InvalidConfigError:
    return InvalidConfigError(f"config {spec.name}={value!r}: {why}")


def _long(spec: ConfigSpec, value: object) -> str:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise _bad(spec, value, "an integer is expected")
    text = value.strip() if isinstance(value, str) else str(value)
    digits = text[1:] if text.startswith("-") else text
    if not (digits.isascii() and digits.isdigit()) or len(digits) > 19:
        raise _bad(spec, value, "an integer is expected")
    number = int(text)
    if spec.no_limit and number == _NO_LIMIT:
        return str(number)
    if not spec.low <= number <= spec.high:
        limit = " (or -1: no limit)" if spec.no_limit else ""
        raise _bad(spec, value, f"must be in {int(spec.low)}..{int(spec.high)}{limit}")
    return str(number)


def _ratio(spec: ConfigSpec, value: object) -> str:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise _bad(spec, value, "a number is expected")
    try:
        number = float(value)
    except ValueError:
        raise _bad(spec, value, "a number is expected") from None
    if not math.isfinite(number) or not spec.low <= number <= spec.high:
        raise _bad(spec, value, f"must be in {spec.low}..{spec.high}")
    return repr(number)


def _choice(spec: ConfigSpec, value: object) -> str:
    if not isinstance(value, str) or value.strip() not in spec.choices:
        raise _bad(spec, value, f"must be one of {', '.join(spec.choices)}")
    return value.strip()


def _list(spec: ConfigSpec, value: object) -> str:
    if not isinstance(value, str):
        raise _bad(spec, value, f"a comma-separated list of {', '.join(spec.choices)}")
    items = {item.strip() for item in value.split(",")}
    if not items or not items <= set(spec.choices):
        raise _bad(spec, value, f"a comma-separated list of {', '.join(spec.choices)}")
    return ",".join(sorted(items))


_PARSERS: Final = {"long": _long, "ratio": _ratio, "choice": _choice, "list": _list}


def _spec(name: object) -> ConfigSpec:
    spec = CONFIGS.get(name) if isinstance(name, str) else None
    if spec is None:
        raise UnknownConfigError(
            f"unknown topic config {name!r}; known configs: {', '.join(CONFIGS)}"
        )
    return spec


def check_configs(configs: Mapping[str, object]) -> dict[str, str]:
    """``configs`` (names and values a user gave: strings, or ints and floats from a JSON
    body), checked and in canonical form. UNKNOWN_CONFIG names the known configs;
    INVALID_CONFIG says what a value must be. Quorums are checked together by
    :func:`stream_options`, once the defaults of those not given are known."""
    out: dict[str, str] = {}
    for name, value in configs.items():
        spec = _spec(name)
        out[spec.name] = _PARSERS[spec.kind](spec, value)
    return out


def merge_configs(
    current: Mapping[str, str], changes: Mapping[str, object], deletes: Iterable[str] = ()
) -> dict[str, str]:
    """An alter: ``current`` with ``changes`` set and ``deletes`` back to their defaults
    (checked like :func:`check_configs`; a name both set and deleted is INVALID_CONFIG)."""
    gone = {_spec(name).name for name in deletes}
    new = check_configs(changes)
    both = sorted(gone & set(new))
    if both:
        raise InvalidConfigError(f"config(s) both set and deleted: {', '.join(both)}")
    merged = {k: v for k, v in current.items() if k not in gone}
    merged.update(new)
    return {name: merged[name] for name in CONFIGS if name in merged}  # the table's order


def _limit(configs: Mapping[str, str], name: str) -> int | None:
    value = int(configs.get(name, _spec(name).default or str(_NO_LIMIT)))
    return None if value == _NO_LIMIT else value


def stream_options(configs: Mapping[str, str], defaults: NamespaceDefaults) -> StreamOptions:
    """What the partition streams of a topic with ``configs`` (checked) do: retention
    (only with ``cleanup.policy`` delete, as in Kafka), rolls, the record limit,
    timestamps and quorums. Quorums the topic does not set are the namespace's when
    it sets any (INVALID_CONFIG unless ensemble >= write >= ack); the rest is None,
    i.e. the writer's defaults."""
    deletes = "delete" in configs.get("cleanup.policy", "delete").split(",")
    quorums: tuple[int, int, int] | tuple[None, None, None] = (None, None, None)
    if any(q in configs for q in _QUORUMS):
        e, w, a = (int(configs.get(q, defaults.value(q))) for q in _QUORUMS)
        check_quorum(e, w, a, "topic configs", error=InvalidConfigError)
        quorums = (e, w, a)
    record_max = configs.get("max.message.bytes")
    return StreamOptions(
        retention_ms=_limit(configs, "retention.ms") if deletes else None,
        retention_bytes=_limit(configs, "retention.bytes") if deletes else None,
        segment_rollover_bytes=_optional_int(configs.get("segment.bytes")),
        segment_rollover_ms=_optional_int(configs.get("segment.ms")),
        ensemble_size=quorums[0],
        write_quorum=quorums[1],
        ack_quorum=quorums[2],
        record_bytes_max=_optional_int(record_max),
    )


def _optional_int(value: str | None) -> int | None:
    return None if value is None else int(value)


def configs_of_options(options: StreamOptions) -> dict[str, str]:
    """The configs a topic made with stream options (before configs existed, or by the
    ``retention_ms`` ... aliases) sets: the options given, by their Kafka names."""
    named = {
        "retention.ms": options.retention_ms,
        "retention.bytes": options.retention_bytes,
        "segment.ms": options.segment_rollover_ms,
        "segment.bytes": options.segment_rollover_bytes,
        "max.message.bytes": options.record_bytes_max,
        **dict(zip(_QUORUMS, options.quorums or (None, None, None), strict=True)),
    }
    return check_configs({k: v for k, v in named.items() if v is not None})


def effective(configs: Mapping[str, str], defaults: NamespaceDefaults) -> list[EffectiveConfig]:
    """Every config in the table's order: the topic's value, or the default."""
    out = []
    for name, spec in CONFIGS.items():
        if name in configs:
            out.append(EffectiveConfig(name, configs[name], "topic"))
        else:
            value = spec.default if spec.default is not None else defaults.value(name)
            out.append(EffectiveConfig(name, value, "default"))
    return out


@dataclass(frozen=True, slots=True)
class CompactionConfigs:
    """The compaction settings of a topic, typed (defaults filled in)."""

    compact: bool  # cleanup.policy has compact
    delete: bool  # cleanup.policy has delete (retention applies)
    min_compaction_lag_ms: int
    delete_retention_ms: int
    min_cleanable_dirty_ratio: float


def compaction_configs(configs: Mapping[str, str]) -> CompactionConfigs:
    def get(name: str) -> str:
        return configs.get(name) or CONFIGS[name].default or ""  # constant defaults

    policy = get("cleanup.policy").split(",")
    return CompactionConfigs(
        compact="compact" in policy,
        delete="delete" in policy,
        min_compaction_lag_ms=int(get("min.compaction.lag.ms")),
        delete_retention_ms=int(get("delete.retention.ms")),
        min_cleanable_dirty_ratio=float(get("min.cleanable.dirty.ratio")),
    )
