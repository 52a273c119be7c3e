"""The group coordinator's HTTP bodies (pure, sans-I/O): strict parsing on the proxy,
building and reading answers in :class:`groups.coordinator_client.CoordinatorClient`.

Bodies are msgpack or JSON maps like every proxy body (:mod:`httpapi.wire`); a
topic-partition is ``[topic, partition]``, an offset ``[topic, partition, offset]``::

    join       {member_id?, instance_id?, topics: [str], assignor?, session_timeout_ms?,
                owned?: [[t, p]]}
               -> {member_id, generation, assignment: [[t, p]], heartbeat_interval_ms}
    heartbeat  {member_id, generation, owned: [[t, p]]}  -> {generation, assignment}
    commit     {member_id, generation, offsets: [[t, p, offset]]}  -> {}
    leave      {member_id}  -> {}
    reset      {to: earliest|latest|offset|datetime, value?, topics?: [str], dry_run?: bool}
               -> {offsets: [[t, p, offset]], clamped: [[t, p]], dry_run: bool}

A reset with ``dry_run`` only computes the plan (Kafka's ``--dry-run``); ``clamped``
names the partitions whose asked offset was past their end and was set to the end.

Unknown fields, wrong types (``true`` is not an int) and values past the limits below
are refused with BAD_REQUEST before anything is done.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from foundation.errors import BadRequestError
from foundation.names import PARTITIONS_MAX, validate_name
from groups.assignors import TopicPartition
from groups.state import DEFAULT_ASSIGNOR, TOPICS_PER_MEMBER_MAX

__all__ = [
    "DEFAULT_SESSION_TIMEOUT_MS",
    "RESET_TARGETS",
    "CommitRequest",
    "HeartbeatRequest",
    "JoinRequest",
    "ResetPlan",
    "ResetRequest",
    "heartbeat_interval_ms",
    "offsets_from_wire",
    "offsets_to_wire",
    "parse_commit",
    "parse_heartbeat",
    "parse_join",
    "parse_leave",
    "parse_reset",
    "reset_plan_from_wire",
    "tps_from_wire",
    "tps_to_wire",
]

# Kafka's default is 45 s; proxies fail over in seconds, so a dead member's partitions
# need not idle that long.
DEFAULT_SESSION_TIMEOUT_MS: Final = 10_000
# Partitions a member may report or commit in one request (a member of a big group
# holds a share of at most this many).
TPS_PER_REQUEST_MAX: Final = 100_000
# Member ids are "<instance or 'member'>-<12 hex>": a name plus 13 characters.
MEMBER_ID_CHARS_MAX: Final = 256
# Offsets are stream sequence ids (int64 on the wire).
OFFSET_MAX: Final = 2**63 - 1
RESET_TARGETS: Final = ("earliest", "latest", "offset", "datetime")
_JOIN_FIELDS: Final = {
    "member_id", "instance_id", "topics", "assignor", "session_timeout_ms", "owned",
}  # fmt: skip


def heartbeat_interval_ms(session_timeout_ms: int) -> int:
    """How often a member heartbeats: a third of its session (two may be lost)."""
    return max(1, session_timeout_ms // 3)


@dataclass(frozen=True, slots=True)
class JoinRequest:
    topics: tuple[str, ...]
    member_id: str | None = None
    instance_id: str | None = None
    assignor: str = DEFAULT_ASSIGNOR
    session_timeout_ms: int = DEFAULT_SESSION_TIMEOUT_MS
    owned: frozenset[TopicPartition] = frozenset()

    def to_wire(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "topics": list(self.topics),
            "assignor": self.assignor,
            "session_timeout_ms": self.session_timeout_ms,
            "owned": tps_to_wire(self.owned),
        }
        if self.member_id is not None:
            body["member_id"] = self.member_id
        if self.instance_id is not None:
            body["instance_id"] = self.instance_id
        return body


@dataclass(frozen=True, slots=True)
class HeartbeatRequest:
    member_id: str
    generation: int
    owned: frozenset[TopicPartition]

    def to_wire(self) -> dict[str, Any]:
        return {
            "member_id": self.member_id,
            "generation": self.generation,
            "owned": tps_to_wire(self.owned),
        }


@dataclass(frozen=True, slots=True)
class CommitRequest:
    member_id: str
    generation: int
    offsets: Mapping[TopicPartition, int]

    def to_wire(self) -> dict[str, Any]:
        return {
            "member_id": self.member_id,
            "generation": self.generation,
            "offsets": offsets_to_wire(self.offsets),
        }


@dataclass(frozen=True, slots=True)
class ResetRequest:
    to: str  # one of RESET_TARGETS
    value: int | None = None  # the offset, or the datetime in ms since the epoch
    topics: tuple[str, ...] | None = None  # None: every topic the group knows
    dry_run: bool = False  # compute the plan, change nothing

    def to_wire(self) -> dict[str, Any]:
        body: dict[str, Any] = {"to": self.to}
        if self.value is not None:
            body["value"] = self.value
        if self.topics is not None:
            body["topics"] = list(self.topics)
        if self.dry_run:
            body["dry_run"] = True
        return body


@dataclass(frozen=True, slots=True)
class ResetPlan:
    """Where a reset puts each partition (applied unless ``dry_run``)."""

    offsets: dict[TopicPartition, int]
    clamped: frozenset[TopicPartition] = frozenset()  # asked past the end: set to the end
    dry_run: bool = False

    def to_wire(self) -> dict[str, Any]:
        return {
            "offsets": offsets_to_wire(self.offsets),
            "clamped": tps_to_wire(self.clamped),
            "dry_run": self.dry_run,
        }


def reset_plan_from_wire(obj: Mapping[str, Any]) -> ResetPlan:
    """A reset's answer (``clamped`` and ``dry_run`` absent from older proxies)."""
    return ResetPlan(
        offsets=offsets_from_wire(obj.get("offsets"), "offsets"),
        clamped=tps_from_wire(obj.get("clamped", []), "clamped"),
        dry_run=obj.get("dry_run") is True,
    )


# -- parsing (the proxy) ----------------------------------------------------------------


def parse_join(body: Mapping[str, Any]) -> JoinRequest:
    _only(body, "join", _JOIN_FIELDS)
    topics = _topics(body.get("topics"), required=True)
    assert topics is not None
    member_id = _member_id(body.get("member_id"), required=False)
    instance = body.get("instance_id")
    if instance is not None:
        instance = validate_name(instance, "instance_id")
    assignor = body.get("assignor", DEFAULT_ASSIGNOR)
    if not isinstance(assignor, str):
        raise BadRequestError("assignor must be a string")
    session = _int(body.get("session_timeout_ms", DEFAULT_SESSION_TIMEOUT_MS), "session_timeout_ms")
    return JoinRequest(
        topics=topics,
        member_id=member_id,
        instance_id=instance,
        assignor=assignor,
        session_timeout_ms=session,
        owned=tps_from_wire(body.get("owned", []), "owned"),
    )


def parse_heartbeat(body: Mapping[str, Any]) -> HeartbeatRequest:
    _only(body, "heartbeat", {"member_id", "generation", "owned"})
    member_id = _member_id(body.get("member_id"), required=True)
    assert member_id is not None
    return HeartbeatRequest(
        member_id=member_id,
        generation=_int(body.get("generation"), "generation"),
        owned=tps_from_wire(body.get("owned", []), "owned"),
    )


def parse_commit(body: Mapping[str, Any]) -> CommitRequest:
    _only(body, "commit", {"member_id", "generation", "offsets"})
    member_id = _member_id(body.get("member_id"), required=True)
    assert member_id is not None
    offsets = offsets_from_wire(body.get("offsets"), "offsets")
    if not offsets:
        raise BadRequestError("commit needs at least one [topic, partition, offset]")
    return CommitRequest(member_id, _int(body.get("generation"), "generation"), offsets)


def parse_leave(body: Mapping[str, Any]) -> str:
    _only(body, "leave", {"member_id"})
    member_id = _member_id(body.get("member_id"), required=True)
    assert member_id is not None
    return member_id


def parse_reset(body: Mapping[str, Any]) -> ResetRequest:
    _only(body, "reset-offsets", {"to", "value", "topics", "dry_run"})
    to = body.get("to")
    if to not in RESET_TARGETS:
        raise BadRequestError(f"reset-offsets 'to' must be one of {', '.join(RESET_TARGETS)}")
    raw = body.get("value")
    value = None if raw is None else _int(raw, "value")
    if to in ("offset", "datetime") and value is None:
        raise BadRequestError(f"reset-offsets to {to} needs a 'value'")
    if to in ("earliest", "latest") and value is not None:
        raise BadRequestError(f"reset-offsets to {to} takes no 'value'")
    dry_run = body.get("dry_run", False)
    if not isinstance(dry_run, bool):
        raise BadRequestError(f"reset-offsets 'dry_run' must be true or false, got {dry_run!r}")
    topics = _topics(body.get("topics"), required=False)
    return ResetRequest(to=str(to), value=value, topics=topics, dry_run=dry_run)


# -- topic-partitions and offsets ---------------------------------------------------------


def tps_to_wire(tps: Iterable[TopicPartition]) -> list[list[Any]]:
    return [[t, p] for t, p in sorted(tps)]


def tps_from_wire(raw: object, what: str) -> frozenset[TopicPartition]:
    items = _list(raw, what)
    out: set[TopicPartition] = set()
    for item in items:
        if not isinstance(item, list | tuple) or len(item) != 2:
            raise BadRequestError(f"{what}: each item is [topic, partition], got {item!r}")
        out.add(_tp(item[0], item[1], what))
    return frozenset(out)


def offsets_to_wire(offsets: Mapping[TopicPartition, int]) -> list[list[Any]]:
    return [[t, p, o] for (t, p), o in sorted(offsets.items())]


def offsets_from_wire(raw: object, what: str) -> dict[TopicPartition, int]:
    items = _list(raw, what)
    out: dict[TopicPartition, int] = {}
    for item in items:
        if not isinstance(item, list | tuple) or len(item) != 3:
            raise BadRequestError(f"{what}: each item is [topic, partition, offset], got {item!r}")
        tp = _tp(item[0], item[1], what)
        if tp in out:
            raise BadRequestError(f"{what}: partition {tp[1]} of {tp[0]} appears twice")
        offset = _int(item[2], f"{what} offset")
        if not 0 <= offset <= OFFSET_MAX:
            raise BadRequestError(f"{what}: offset {offset} of {tp[0]}/{tp[1]} is negative")
        out[tp] = offset
    return out


# -- helpers -------------------------------------------------------------------------------


def _only(body: Mapping[str, Any], what: str, allowed: set[str]) -> None:
    if not isinstance(body, Mapping):
        raise BadRequestError(f"{what}: the body must be an object")
    unknown = sorted(str(k) for k in body if k not in allowed)
    if unknown:
        raise BadRequestError(
            f"{what}: unknown field(s) {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}"
        )


def _int(value: object, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequestError(f"{what} must be an integer, got {value!r}")
    if not -OFFSET_MAX - 1 <= value <= OFFSET_MAX:
        raise BadRequestError(f"{what} {value} is out of the int64 range")
    return value


def _list(raw: object, what: str) -> list[Any]:
    if not isinstance(raw, list | tuple):
        raise BadRequestError(f"{what} must be a list, got {type(raw).__name__}")
    if len(raw) > TPS_PER_REQUEST_MAX:
        raise BadRequestError(f"{what}: {len(raw)} items; at most {TPS_PER_REQUEST_MAX}")
    return list(raw)


def _tp(topic: object, partition: object, what: str) -> TopicPartition:
    name = validate_name(topic, f"{what} topic")
    p = _int(partition, f"{what} partition")
    if not 0 <= p < PARTITIONS_MAX:
        raise BadRequestError(f"{what}: partition {p} is outside 0..{PARTITIONS_MAX - 1}")
    return (name, p)


def _topics(raw: object, *, required: bool) -> tuple[str, ...] | None:
    if raw is None and not required:
        return None
    if not isinstance(raw, list | tuple) or not raw:
        raise BadRequestError("topics must be a non-empty list of topic names")
    if len(raw) > TOPICS_PER_MEMBER_MAX:
        raise BadRequestError(f"{len(raw)} topics; at most {TOPICS_PER_MEMBER_MAX}")
    return tuple(sorted({validate_name(t, "topic") for t in raw}))


def _member_id(raw: object, *, required: bool) -> str | None:
    if raw is None and not required:
        return None
    if not isinstance(raw, str) or not raw or len(raw) > MEMBER_ID_CHARS_MAX:
        raise BadRequestError(f"member_id must be a string of 1..{MEMBER_ID_CHARS_MAX} characters")
    return raw
