"""FindCoordinator, OffsetCommit and OffsetFetch over the write core's group hosting
(:class:`~serving.write.groups.GroupHosting`): committed offsets live in the group's
log, the same offsets the thin client's group consumers and ``bookline group`` see.

The coordinator of group ``g`` is the write proxy owning stream ``g~group`` (or, while
nobody owns it, the one rendezvous hashing picks, which loads it on the first request);
another proxy answers NOT_COORDINATOR. A commit from a member of the group (its member
id and generation) is the member's commit; one from outside the membership (Kafka's
``assign()`` consumers: generation -1) sets the group's offsets, refused with
NON_EMPTY_GROUP while the group has live members, as Kafka refuses it. Kafka's group
membership protocol (JoinGroup, SyncGroup, Heartbeat, LeaveGroup): :mod:`kafkaapi.membership`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from foundation.errors import (
    BooklineError,
    GroupNotEmptyError,
    NotAssignedError,
    NotFoundError,
    OwnerMovedError,
    OwnershipLostError,
    StaleGenerationError,
    UnavailableError,
)
from foundation.names import group_stream
from groups.wire import CommitRequest
from kafkaapi.brokers import BrokerView
from kafkaapi.consumer_groups import commit_generation
from kafkaapi.errormap import kafka_code
from kafkaapi.protocol import errors as kerr

if TYPE_CHECKING:
    from groups.assignors import TopicPartition
    from kafkaapi.context import KafkaServing, Session
    from kafkaapi.protocol.messages import Request

__all__ = ["find_coordinator", "group_code", "offset_commit", "offset_fetch"]

_named = kerr.code_named
_GROUP_DENIED: Final = _named("GROUP_AUTHORIZATION_FAILED")
_TOPIC_DENIED: Final = _named("TOPIC_AUTHORIZATION_FAILED")
_NOT_COORDINATOR: Final = _named("NOT_COORDINATOR")
_UNAVAILABLE: Final = _named("COORDINATOR_NOT_AVAILABLE")
# Group errors as the group APIs name them (the rest: errormap).
_GROUP_CODES: Final = (
    ((OwnerMovedError, OwnershipLostError, UnavailableError), _NOT_COORDINATOR),
    ((StaleGenerationError,), _named("ILLEGAL_GENERATION")),
    ((NotAssignedError,), _named("UNKNOWN_MEMBER_ID")),
    ((GroupNotEmptyError,), _named("NON_EMPTY_GROUP")),
    ((NotFoundError,), _named("GROUP_ID_NOT_FOUND")),
)
_STANDALONE: Final = -1  # a commit's generation from outside the membership


def group_code(exc: BooklineError) -> kerr.KafkaCode:
    for classes, code in _GROUP_CODES:
        if isinstance(exc, classes):
            return code
    return kafka_code(exc)


async def find_coordinator(
    serving: KafkaServing, session: Session, request: Request
) -> dict[str, Any]:
    key, key_type = request.body["key"], request.body["key_type"]
    answer: dict[str, Any] = {"throttle_time_ms": 0, "error_message": None}
    if key_type != 0:  # 1: transactions, which are not served
        return answer | {"error_code": _UNAVAILABLE.code, "node_id": -1, "host": "", "port": -1}
    if not serving.allowed(session, "consume", "group", key):
        return answer | {"error_code": _GROUP_DENIED.code, "node_id": -1, "host": "", "port": -1}
    view = await BrokerView.load(serving.md, serving.registration())
    record = await serving.md.proxies.get_owner(serving.ns().name, group_stream(key))
    node = view.leader(None if record is None else record.proxy_id, group_stream(key))
    broker = next((b for b in view.brokers if b.node_id == node), None)
    if broker is None:
        return answer | {"error_code": _UNAVAILABLE.code, "node_id": -1, "host": "", "port": -1}
    return answer | {"error_code": 0, "node_id": node, "host": broker.host, "port": broker.port}


async def offset_commit(
    serving: KafkaServing, session: Session, request: Request
) -> dict[str, Any]:
    body = request.body
    group = body["group_id"]
    offsets: dict[TopicPartition, int] = {}
    code = 0
    if not serving.allowed(session, "consume", "group", group):
        code = _GROUP_DENIED.code
    elif serving.groups is None:
        code = _NOT_COORDINATOR.code  # a read proxy coordinates no group
    for topic in body["topics"]:
        if not serving.allowed(session, "consume", "topic", topic["name"]):
            code = code or _TOPIC_DENIED.code
        for part in topic["partitions"]:
            offsets[(topic["name"], part["partition_index"])] = part["committed_offset"]
    if not code and serving.groups is not None:
        code = await _commit(serving, body, offsets)
    topics = [
        {
            "name": topic["name"],
            "partitions": [
                {"partition_index": p["partition_index"], "error_code": code}
                for p in topic["partitions"]
            ],
        }
        for topic in body["topics"]
    ]
    return {"throttle_time_ms": 0, "topics": topics}


async def _commit(
    serving: KafkaServing, body: dict[str, Any], offsets: dict[TopicPartition, int]
) -> int:
    """Commit into the group's log: a Kafka classic member's commit checked against its
    group's generation (:meth:`~kafkaapi.classic_group.ClassicGroup.check_commit`), a
    Bookline member's against the Bookline group, a standalone one (generation -1) into
    a group without members. Returns the Kafka code."""
    assert serving.groups is not None
    group, generation = body["group_id"], body["generation_id_or_member_epoch"]
    try:
        coord = await serving.groups.coordinator(group, create=generation == _STANDALONE)
        classic = serving.classic.held(group, coord)
        if classic is not None and classic.live:
            instance = body["group_instance_id"]
            error = classic.check_commit(body["member_id"], instance, generation)
            if error != "NONE":
                return _named(error).code
            await coord.set_offsets(offsets)  # its members are not Bookline's
        elif generation == _STANDALONE:
            await coord.set_offsets(offsets)
        else:
            member = body["member_id"]
            # A KIP-848 member's epoch may lag the generation (kafkaapi.consumer_groups).
            generation = await commit_generation(serving, group, member, generation)
            await coord.commit(CommitRequest(member, generation, offsets))
    except BooklineError as exc:
        return group_code(exc).code
    return 0


async def offset_fetch(serving: KafkaServing, session: Session, request: Request) -> dict[str, Any]:
    body = request.body
    group = body["group_id"]
    if not serving.allowed(session, "consume", "group", group):
        return {"throttle_time_ms": 0, "topics": [], "error_code": _GROUP_DENIED.code}
    if serving.groups is None:
        return {"throttle_time_ms": 0, "topics": [], "error_code": _NOT_COORDINATOR.code}
    try:
        committed = await serving.groups.offsets(group)
    except NotFoundError:
        committed = {}  # a group never committed to: no offsets, no error (Kafka's)
    except BooklineError as exc:
        return {"throttle_time_ms": 0, "topics": [], "error_code": group_code(exc).code}
    asked = body["topics"]
    if asked is None:  # every committed partition
        names = sorted({t for t, _ in committed})
        asked = [
            {"name": t, "partition_indexes": sorted(p for u, p in committed if u == t)}
            for t in names
        ]
    topics = []
    for topic in asked:
        name = topic["name"]
        denied = not serving.allowed(session, "consume", "topic", name)
        partitions = [
            {
                "partition_index": p,
                "committed_offset": -1 if denied else committed.get((name, p), -1),
                "metadata": "",
                "error_code": _TOPIC_DENIED.code if denied else 0,
            }
            for p in topic["partition_indexes"]
        ]
        topics.append({"name": name, "partitions": partitions})
    return {"throttle_time_ms": 0, "topics": topics, "error_code": 0}
