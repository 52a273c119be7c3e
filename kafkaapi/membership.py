"""Kafka's classic group membership (JoinGroup, SyncGroup, Heartbeat, LeaveGroup) on
Bookline's coordinators, whose assignment is the coordinator's own (incremental, like
KIP-848's): no member is made the leader, so every client is a follower and gets its
partitions from SyncGroup, whatever assignor it offered.

* JoinGroup joins the member with the topics of its subscription (and, from a
  cooperative client, the partitions it still owns) and answers its generation;
* SyncGroup answers the partitions the member may consume now, in the consumer
  protocol's assignment format;
* Heartbeat answers REBALANCE_IN_PROGRESS when the generation moved on or the
  member's partitions changed since its SyncGroup (a partition released by another
  member, one to give up), so the client joins again and syncs the new set;
* LeaveGroup leaves.

What each member holds is kept (``KafkaServing.handed``: the partitions its JoinGroup
said it still owns, then those its SyncGroup handed it), since the classic Heartbeat
does not say; a heartbeat of a member this proxy does not know (it joined through
another one, before the coordinator moved) is asked to join again.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING, Any, Final

from foundation.errors import BooklineError, StaleGenerationError
from groups.wire import HeartbeatRequest, JoinRequest
from kafkaapi.errormap import kafka_code
from kafkaapi.groups import group_code
from kafkaapi.protocol import errors as kerr
from kafkaapi.protocol.errors import KafkaProtocolError
from kafkaapi.protocol.primitives import Reader

if TYPE_CHECKING:
    from groups.assignors import TopicPartition
    from kafkaapi.context import KafkaServing, Session
    from kafkaapi.protocol.messages import Request

__all__ = [
    "encode_assignment",
    "heartbeat",
    "join_group",
    "leave_group",
    "parse_subscription",
    "sync_group",
]

_named = kerr.code_named
_DENIED: Final = _named("GROUP_AUTHORIZATION_FAILED")
_NOT_COORDINATOR: Final = _named("NOT_COORDINATOR")
_REBALANCE: Final = _named("REBALANCE_IN_PROGRESS")
_INCONSISTENT: Final = _named("INCONSISTENT_GROUP_PROTOCOL")
# A member id no member has: every client is a follower (module docstring).
COORDINATOR_LEADER: Final = "bookline-coordinator"


def _code(exc: BooklineError) -> int:
    if isinstance(exc, StaleGenerationError):
        return _REBALANCE.code  # join again (with the same member id)
    return group_code(exc).code


def parse_subscription(raw: bytes) -> tuple[tuple[str, ...], frozenset[TopicPartition]]:
    """Topics and owned partitions of a consumer protocol subscription (v0-v3):
    ``int16 version, [string topic], bytes user_data`` then, from v1,
    ``[string topic, [int32 partition]] owned``."""
    reader = Reader(raw)
    version = reader.int16()
    topics = tuple(reader.text(reader.classic_string_length()) for _ in range(_count(reader)))
    reader.take(max(0, reader.classic_bytes_length()))  # user data: the assignor's
    owned: set[TopicPartition] = set()
    if version >= 1:
        for _ in range(_count(reader)):
            topic = reader.text(reader.classic_string_length())
            owned.update((topic, reader.int32()) for _ in range(_count(reader)))
    return topics, frozenset(owned)


def _count(reader: Reader) -> int:
    count = reader.int32()
    if count < 0 or count > reader.remaining():
        raise KafkaProtocolError(_INCONSISTENT, f"array of {count} in a subscription")
    return count


def encode_assignment(parts: frozenset[TopicPartition]) -> bytes:
    """A consumer protocol assignment v0: ``int16 0, [string topic, [int32]], bytes``."""
    by_topic: dict[str, list[int]] = {}
    for topic, partition in sorted(parts):
        by_topic.setdefault(topic, []).append(partition)
    out = bytearray(struct.pack(">hi", 0, len(by_topic)))
    for topic, partitions in by_topic.items():
        name = topic.encode()
        out += struct.pack(">h", len(name)) + name
        out += struct.pack(f">i{len(partitions)}i", len(partitions), *partitions)
    out += struct.pack(">i", 0)  # no user data
    return bytes(out)


async def join_group(serving: KafkaServing, session: Session, request: Request) -> dict[str, Any]:
    body = request.body
    group = body["group_id"]
    answer: dict[str, Any] = {"throttle_time_ms": 0, "generation_id": -1, "leader": "",
                              "member_id": body["member_id"], "members": [],
                              "protocol_type": "consumer", "protocol_name": None}  # fmt: skip
    if not serving.allowed(session, "consume", "group", group):
        return answer | {"error_code": _DENIED.code}
    if serving.groups is None:
        return answer | {"error_code": _NOT_COORDINATOR.code}
    protocols = body["protocols"]
    try:
        if body["protocol_type"] != "consumer" or not protocols:
            raise KafkaProtocolError(_INCONSISTENT, "only consumer groups are served")
        topics, owned = parse_subscription(protocols[0]["metadata"])
        for topic in topics:
            serving.require(session, "consume", "topic", topic)
        req = JoinRequest(
            topics=tuple(sorted(set(topics))),
            member_id=body["member_id"] or None,
            instance_id=body["group_instance_id"],
            session_timeout_ms=body["session_timeout_ms"],
            owned=owned,
        )
        result = await serving.groups.join(group, req)
    except BooklineError as exc:
        return answer | {"error_code": _code(exc)}
    # What the client holds until its SyncGroup: the partitions it said it still owns
    # (a cooperative client; an eager one gave everything up before joining).
    serving.handed.put(group, result.member_id, owned)
    return answer | {
        "error_code": 0,
        "generation_id": result.generation,
        "protocol_name": protocols[0]["name"],
        "leader": COORDINATOR_LEADER,
        "member_id": result.member_id,
    }


async def sync_group(serving: KafkaServing, session: Session, request: Request) -> dict[str, Any]:
    body = request.body
    group, member = body["group_id"], body["member_id"]
    answer: dict[str, Any] = {"throttle_time_ms": 0, "assignment": b"",
                              "protocol_type": body["protocol_type"],
                              "protocol_name": body["protocol_name"]}  # fmt: skip
    if not serving.allowed(session, "consume", "group", group):
        return answer | {"error_code": _DENIED.code}
    if serving.groups is None:
        return answer | {"error_code": _NOT_COORDINATOR.code}
    held = serving.handed.get(group, member) or frozenset()
    try:
        _, parts = await serving.groups.heartbeat(
            group, HeartbeatRequest(member, body["generation_id"], held)
        )
    except BooklineError as exc:
        return answer | {"error_code": _code(exc)}
    serving.handed.put(group, member, parts)
    return answer | {"error_code": 0, "assignment": encode_assignment(parts)}


async def heartbeat(serving: KafkaServing, session: Session, request: Request) -> dict[str, Any]:
    body = request.body
    group, member = body["group_id"], body["member_id"]
    if not serving.allowed(session, "consume", "group", group):
        return {"throttle_time_ms": 0, "error_code": _DENIED.code}
    if serving.groups is None:
        return {"throttle_time_ms": 0, "error_code": _NOT_COORDINATOR.code}
    held = serving.handed.get(group, member)
    if held is None:
        # Joined through another proxy (the coordinator moved): what the client holds
        # is unknown here, and a heartbeat saying "nothing" would give its partitions
        # away while it still reads them. Join again: the join says what it holds.
        return {"throttle_time_ms": 0, "error_code": _REBALANCE.code}
    try:
        _, parts = await serving.groups.heartbeat(
            group, HeartbeatRequest(member, body["generation_id"], held)
        )
    except BooklineError as exc:
        return {"throttle_time_ms": 0, "error_code": _code(exc)}
    if parts != held:  # partitions to take or to give up: sync again
        return {"throttle_time_ms": 0, "error_code": _REBALANCE.code}
    return {"throttle_time_ms": 0, "error_code": 0}


async def leave_group(serving: KafkaServing, session: Session, request: Request) -> dict[str, Any]:
    body = request.body
    group = body["group_id"]
    if request.version < 3:
        members = [{"member_id": body["member_id"], "group_instance_id": None}]
    else:
        members = body["members"]
    if not serving.allowed(session, "consume", "group", group):
        return {"throttle_time_ms": 0, "error_code": _DENIED.code, "members": []}
    if serving.groups is None:
        return {"throttle_time_ms": 0, "error_code": _NOT_COORDINATOR.code, "members": []}
    out = []
    for m in members:
        code = 0
        try:
            await serving.groups.leave(group, m["member_id"])
        except BooklineError as exc:
            code = kafka_code(exc).code if not isinstance(exc, StaleGenerationError) else 0
        serving.handed.drop(group, m["member_id"])
        out.append({"member_id": m["member_id"], "group_instance_id": m["group_instance_id"],
                    "error_code": code})  # fmt: skip
    first = out[0]["error_code"] if out and request.version < 3 else 0
    return {"throttle_time_ms": 0, "error_code": first, "members": out}
