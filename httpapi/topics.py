"""Topics over HTTP: the admin bodies and their answers (write proxy). Sans-I/O.

Routes (write proxy; msgpack or JSON; errors ``{code, name, message}``)::

    POST   /v1/topics                         create  {"name", "partitions", "configs",
                                                       options...}
    GET    /v1/topics                         list    -> {"topics": [name, ...]}
    GET    /v1/topics/{t}                     the topic's record (cheap: one ZooKeeper read)
    GET    /v1/topics/{t}/partitions          every partition's offsets, size and owner
    PATCH  /v1/topics/{t}                     grow    {"partitions": N}
    PATCH  /v1/topics/{t}/configs             alter configs {"configs": {name: value|null}}
    DELETE /v1/topics/{t}
    POST   /v1/topics/{t}/partitions/{p}/records   a write to partition stream "t~p"

``configs`` are Kafka's topic configs by name (:mod:`metadata.topic_configs`; values
strings, or numbers): ``{"cleanup.policy": "compact", "retention.ms": 60000}``; an
unknown name is UNKNOWN_CONFIG (the message lists the known ones), a bad value
INVALID_CONFIG. In an alter, ``null`` returns a config to its default (JSON merge
patch). Options (all optional, positive integers) are older aliases of some configs:
``retention_ms``, ``retention_bytes``, ``segment_rollover_bytes``,
``segment_rollover_ms``, ``ensemble_size``, ``write_quorum``, ``ack_quorum`` (quorums
not given are the proxy's defaults). A body with any other field is refused
(BAD_REQUEST), as are 0 or more than ``PARTITIONS_MAX`` partitions and a smaller count
in ``PATCH`` -- nothing is changed.

A topic answers ``{"name", "partitions": N, "options": {...}, "configs": [{"name",
"value", "source"}, ...], "ctime_ms"}`` (``configs``: every config, its effective value
and its source, ``"topic"`` or ``"default"``); its
partitions ``{"name", "partitions": [{"partition", "stream", "start_offset",
"end_offset", "size_bytes", "segments", "owner"}, ...]}`` (offsets are the partition
stream's sequence ids; ``end_offset`` is the offset of the next record).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from foundation.errors import BadRequestError
from foundation.names import PARTITIONS_MAX, validate_name
from httpapi.wire import get_int
from metadata.streams import StreamOptions
from metadata.topic_configs import EffectiveConfig
from metadata.topics import TopicRecord
from streams.vocabulary import PartitionInfo, TopicOptions

__all__ = [
    "OPTION_FIELDS",
    "TopicCreate",
    "configs_view",
    "parse_alter",
    "parse_alter_configs",
    "parse_configs_view",
    "parse_create",
    "parse_partition",
    "parse_partition_view",
    "parse_topic_record",
    "parse_topic_view",
    "record_view",
    "topic_view",
]

# Topic options as the create body names them (and StreamOptions does).
OPTION_FIELDS: Final = (
    "retention_ms",
    "retention_bytes",
    "segment_rollover_bytes",
    "segment_rollover_ms",
    "ensemble_size",
    "write_quorum",
    "ack_quorum",
)
_OPTION_MAX: Final = (1 << 63) - 1
_OPTION_DEFAULTS: Final[Mapping[str, object]] = {
    f.name: f.default for f in dataclasses.fields(StreamOptions)
}


@dataclass(frozen=True, slots=True)
class TopicCreate:
    name: str
    partitions: int
    options: TopicOptions
    configs: dict[str, object]  # by Kafka's names, as given (the core checks them)


def _only(body: Mapping[str, Any], allowed: set[str], what: str) -> None:
    if not isinstance(body, Mapping):
        raise BadRequestError(f"a {what} body is an object")
    extra = sorted(set(body) - allowed)
    if extra:
        raise BadRequestError(f"unknown field(s) in a {what}: {', '.join(map(str, extra))}")


def _partitions(body: Mapping[str, Any]) -> int:
    if "partitions" not in body:
        raise BadRequestError("a partition count 'partitions' is required")
    count = get_int(body, "partitions", 1, PARTITIONS_MAX)
    assert count is not None  # present, checked above
    return count


def parse_create(body: Mapping[str, Any]) -> TopicCreate:
    _only(body, {"name", "partitions", "configs", *OPTION_FIELDS}, "topic creation")
    name = validate_name(body.get("name"), "topic")
    partitions = _partitions(body)
    options: dict[str, int] = {}
    for f in OPTION_FIELDS:
        value = get_int(body, f, 1, _OPTION_MAX)
        if value is not None:
            options[f] = value
    configs = _configs(body.get("configs", {}), nulls=False)
    return TopicCreate(name, partitions, TopicOptions(**options), configs)


def _configs(obj: object, *, nulls: bool) -> dict[str, object]:
    """A ``configs`` object: names to strings or numbers (``null`` too in an alter)."""
    if not isinstance(obj, Mapping):
        raise BadRequestError("'configs' is an object of config names and values")
    kinds = (str, int, float, type(None)) if nulls else (str, int, float)
    for name, value in obj.items():
        if not isinstance(name, str) or isinstance(value, bool) or not isinstance(value, kinds):
            raise BadRequestError(f"config {name!r}: a value is a string or a number")
    return dict(obj)


def parse_alter_configs(body: Mapping[str, Any]) -> tuple[dict[str, object], list[str]]:
    """``(configs to set, configs to return to their defaults)`` of a ``PATCH
    /v1/topics/{t}/configs``: ``{"configs": {name: value or null}}``."""
    _only(body, {"configs"}, "topic configs change")
    if "configs" not in body:
        raise BadRequestError("a topic configs change carries 'configs'")
    configs = _configs(body["configs"], nulls=True)
    deletes = [name for name, value in configs.items() if value is None]
    return {k: v for k, v in configs.items() if v is not None}, deletes


def configs_view(configs: Sequence[EffectiveConfig]) -> list[dict[str, str]]:
    return [{"name": c.name, "value": c.value, "source": c.source} for c in configs]


def parse_configs_view(obj: object) -> list[EffectiveConfig]:
    """A topic answer's ``configs`` (the client's side)."""
    if not isinstance(obj, list):
        raise BadRequestError("a topic answer's 'configs' is a list")
    out = []
    for item in obj:
        if not isinstance(item, Mapping):
            raise BadRequestError("a config in a topic answer is an object")
        name, value, source = item.get("name"), item.get("value"), item.get("source")
        if not isinstance(name, str) or not isinstance(value, str):
            raise BadRequestError("a config in a topic answer has 'name' and 'value'")
        if source not in ("topic", "default"):
            raise BadRequestError(f"config {name}: source {source!r}")
        out.append(EffectiveConfig(name, value, source))
    return out


def parse_alter(body: Mapping[str, Any]) -> int:
    """The new partition count of a ``PATCH`` (the only field that may change)."""
    _only(body, {"partitions"}, "topic change")
    return _partitions(body)


def parse_partition(text: str) -> int:
    """A partition number from a path (decimal, no sign or leading zeros)."""
    if not (text.isascii() and text.isdigit()) or (text != "0" and text.startswith("0")):
        raise BadRequestError(f"partition {text!r} is not a partition number")
    p = int(text)
    if p >= PARTITIONS_MAX:
        raise BadRequestError(f"partition {p} is beyond {PARTITIONS_MAX - 1}")
    return p


def topic_view(
    name: str,
    partitions: int,
    options: Mapping[str, int | None],
    ctime_ms: int,
    configs: Sequence[EffectiveConfig] = (),
) -> dict[str, Any]:
    view = {
        "name": name,
        "partitions": partitions,
        # The options set: those at their defaults (None, "CreateTime") are left out.
        "options": {k: v for k, v in options.items() if v != _OPTION_DEFAULTS.get(k)},
        "ctime_ms": ctime_ms,
    }
    if configs:
        view["configs"] = configs_view(configs)
    return view


def parse_topic_view(obj: Mapping[str, Any]) -> tuple[str, int]:
    """``(name, partitions)`` of a topic answer (the client's side)."""
    name = obj.get("name")
    count = obj.get("partitions")
    if not isinstance(name, str) or type(count) is not int or count < 1:
        raise BadRequestError("a topic answer carries 'name' and 'partitions'")
    return name, count


def record_view(record: TopicRecord, configs: Sequence[EffectiveConfig] = ()) -> dict[str, Any]:
    """A topic's record as a topic answer carries it, with ``configs`` (effective)."""
    options = dataclasses.asdict(record.options)
    return topic_view(record.topic, record.partitions, options, record.ctime_ms, configs)


def parse_topic_record(obj: Mapping[str, Any]) -> TopicRecord:
    """A topic answer as the record it shows (the client's side). The answer does not
    name the proxies' namespace: ``namespace`` is ""."""
    name, count = parse_topic_view(obj)
    options = obj.get("options") or {}
    ctime_ms = obj.get("ctime_ms")
    if not isinstance(options, Mapping) or type(ctime_ms) is not int:
        raise BadRequestError("a topic answer carries 'options' and 'ctime_ms'")
    known = {f.name for f in dataclasses.fields(StreamOptions)}
    stream_options = StreamOptions(**{k: v for k, v in options.items() if k in known})
    configs = parse_configs_view(obj.get("configs", []))
    own = {c.name: c.value for c in configs if c.source == "topic"}
    return TopicRecord("", name, count, stream_options, ctime_ms, own)


def parse_partition_view(obj: Any) -> PartitionInfo:
    """One partition of a ``/v1/topics/{t}/partitions`` answer (the client's side)."""
    if not isinstance(obj, Mapping):
        raise BadRequestError("a partition description must be an object")
    try:
        owner = obj.get("owner")
        return PartitionInfo(
            partition=int(obj["partition"]),
            stream=str(obj["stream"]),
            start_offset=int(obj["start_offset"]),
            end_offset=int(obj["end_offset"]),
            size_bytes=int(obj["size_bytes"]),
            segments=int(obj["segments"]),
            owner=None if owner is None else str(owner),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise BadRequestError(f"malformed partition description: {exc}") from exc
