"""KIP-848's ConsumerGroupHeartbeat (Kafka 4's consumer protocol) on Bookline's group
coordinators, whose assignment is already server-side and incremental: the protocol's
one request joins, heartbeats, reconciles and leaves.

* **Member epoch** = the group's generation as of the member's last answer. A member
  whose epoch is behind (the group changed since it last heard) is not fenced: its
  identity and what it owns are the coordinator's to check, and it is answered the
  current generation with its assignment. An epoch ahead of the group's (one the group
  never gave) gets FENCED_MEMBER_EPOCH; a member the group does not know (expired,
  replaced, or never joined) UNKNOWN_MEMBER_ID; either way the client joins again with
  epoch 0, having given its partitions up.
* **Epoch 0** joins, with the subscribed topic names (topics that do not exist are left
  out; none existing gets UNKNOWN_TOPIC_OR_PARTITION until one does). The member id is
  the coordinator's (the client takes the answer's); a known member id rejoins.
  ``instance_id`` makes a static member: one joining with the instance id of a current
  member takes its place and its partitions (its predecessor's member id is unknown from
  then on).
* **Epoch -1** leaves; **-2** (a static member) leaves for now: its partitions stay its
  own until its session expires, so a restart gets them back. A static member leaving
  with -1 is kept the same way (Bookline's static membership: only the session timeout
  removes one).
* **Reconciliation**: the answer's assignment is always the member's whole set of
  partitions it may consume now (Bookline's incremental handoff: a partition is handed
  to its new member only once its holder stopped owning it, as that holder's heartbeat
  says in ``topic_partitions``; null there means unchanged). Partitions are named by
  topic id (:mod:`kafkaapi.topic_ids`).
* Sessions are the coordinator's: ``SESSION_TIMEOUT_MS`` (the client sends none), with
  a heartbeat interval of a third of it; a member not heard from for a session is
  expired and its partitions move.

* **Regex subscriptions** (``subscribed_topic_regex``, librdkafka's ``^...`` topics):
  matched against the namespace's topics whole (Kafka's ``matches()``), with RE2
  (``google-re2``: linear time, as Kafka's RE2J; Python's backtracking ``re`` would let
  one client's pattern stall the coordinator's event loop); a pattern RE2 refuses gets
  INVALID_REGULAR_EXPRESSION. Only topics the principal may consume match. The
  subscription is the names and the matches together, re-matched at every heartbeat
  (a heartbeat names its subscription only when it changed: the proxy remembers the
  member's), so a new matching topic, or a deleted one, changes the member's topics
  within a heartbeat interval.

Not served: server assignors other than ``uniform`` and ``range`` by name
(UNSUPPORTED_ASSIGNOR; whichever is named, the assignment is Bookline's cooperative
sticky one), racks.

Commits of these members (OffsetCommit with the member epoch as generation) are checked
against the current generation when the epoch is not ahead of it
(:func:`commit_generation`): the coordinator still checks that the member holds every
partition it commits.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Final

import re2

from foundation.errors import (
    BooklineError,
    NotFoundError,
    OwnerMovedError,
    OwnershipLostError,
    StaleGenerationError,
    UnavailableError,
)
from groups.topics import TopicAdmin
from groups.wire import DEFAULT_SESSION_TIMEOUT_MS, HeartbeatRequest, JoinRequest
from groups.wire import heartbeat_interval_ms as interval_of
from kafkaapi.context import Subscription
from kafkaapi.errormap import kafka_code
from kafkaapi.protocol import errors as kerr
from kafkaapi.topic_ids import names_by_id, topic_id

if TYPE_CHECKING:
    from groups.assignors import TopicPartition
    from groups.coordinator import GroupCoordinator
    from kafkaapi.context import KafkaServing, Session
    from kafkaapi.protocol.messages import Request

__all__ = ["SESSION_TIMEOUT_MS", "commit_generation", "consumer_group_heartbeat"]

SESSION_TIMEOUT_MS: Final = DEFAULT_SESSION_TIMEOUT_MS
HEARTBEAT_INTERVAL_MS: Final = interval_of(SESSION_TIMEOUT_MS)
_JOIN: Final = 0
_LEAVE: Final = -1
_STATIC_LEAVE: Final = -2
_ASSIGNORS: Final = (None, "uniform", "range")  # Kafka 4's server assignors

_named = kerr.code_named
_DENIED: Final = _named("GROUP_AUTHORIZATION_FAILED")
_NOT_COORDINATOR: Final = _named("NOT_COORDINATOR")
_UNKNOWN_MEMBER: Final = _named("UNKNOWN_MEMBER_ID")
_FENCED: Final = _named("FENCED_MEMBER_EPOCH")
_INVALID: Final = _named("INVALID_REQUEST")
_NO_ASSIGNOR: Final = _named("UNSUPPORTED_ASSIGNOR")
_NO_TOPIC: Final = _named("UNKNOWN_TOPIC_OR_PARTITION")
_BAD_REGEX: Final = _named("INVALID_REGULAR_EXPRESSION")
# RE2's memory for one compiled pattern (its default, 8 MiB, stated: a bound per request).
_REGEX_MEMORY_BYTES: Final = 8 << 20


class _Refused(Exception):
    """The heartbeat's answer is this error (and its message)."""

    def __init__(self, code: kerr.KafkaCode, message: str) -> None:
        super().__init__(message)
        self.code = code


def _code(exc: BooklineError) -> kerr.KafkaCode:
    if isinstance(exc, (OwnerMovedError, OwnershipLostError, UnavailableError)):
        return _NOT_COORDINATOR
    if isinstance(exc, (NotFoundError, StaleGenerationError)):
        return _UNKNOWN_MEMBER  # join again (librdkafka takes GROUP_ID_NOT_FOUND as fatal)
    return kafka_code(exc)


async def consumer_group_heartbeat(
    serving: KafkaServing, session: Session, request: Request
) -> dict[str, Any]:
    body = request.body
    group, epoch = body["group_id"], body["member_epoch"]
    answer: dict[str, Any] = {"throttle_time_ms": 0, "error_code": 0, "error_message": None,
                              "member_id": body["member_id"] or None, "member_epoch": epoch,
                              "heartbeat_interval_ms": HEARTBEAT_INTERVAL_MS,
                              "assignment": None}  # fmt: skip
    try:
        _check(serving, session, body)
        if epoch in (_LEAVE, _STATIC_LEAVE):
            await _leave(serving, group, body["member_id"])
            return answer
        member, generation, parts, subscription = await _heartbeat(serving, session, body)
    except _Refused as exc:
        return answer | {"error_code": exc.code.code, "error_message": str(exc)}
    except BooklineError as exc:
        return answer | {"error_code": _code(exc).code, "error_message": exc.message}
    serving.consumers.add(group, member, subscription)
    ns = serving.ns().name
    by_topic: dict[str, list[int]] = {}
    for topic, partition in sorted(parts):
        by_topic.setdefault(topic, []).append(partition)
    assigned = [{"topic_id": topic_id(ns, t), "partitions": p} for t, p in by_topic.items()]
    return answer | {
        "member_id": member,
        "member_epoch": generation,
        "assignment": {"topic_partitions": assigned},
    }


def _check(serving: KafkaServing, session: Session, body: dict[str, Any]) -> None:
    if not serving.allowed(session, "consume", "group", body["group_id"]):
        raise _Refused(_DENIED, f"may not consume group {body['group_id']!r}")
    if serving.groups is None:
        raise _Refused(_NOT_COORDINATOR, "a read proxy coordinates no group")
    if body.get("subscribed_topic_regex"):  # librdkafka sends "" for none
        _compiled(body["subscribed_topic_regex"])
    if body["server_assignor"] not in _ASSIGNORS:
        raise _Refused(_NO_ASSIGNOR, f"unknown server assignor {body['server_assignor']!r}")
    if body["member_epoch"] < _STATIC_LEAVE:
        raise _Refused(_INVALID, f"member epoch {body['member_epoch']} is not one")
    for topic in body["subscribed_topic_names"] or ():
        serving.require(session, "consume", "topic", topic)


async def _leave(serving: KafkaServing, group: str, member: str) -> None:
    assert serving.groups is not None
    serving.consumers.drop(group, member)
    # No such group or member: gone already, which is what leaving asks.
    with contextlib.suppress(NotFoundError, StaleGenerationError):
        await serving.groups.leave(group, member)


async def _heartbeat(
    serving: KafkaServing, session: Session, body: dict[str, Any]
) -> tuple[str, int, frozenset[TopicPartition], Subscription]:
    """(member id, generation, partitions to consume now, the member's subscription)
    after joining or heartbeating."""
    assert serving.groups is not None
    group, member, epoch = body["group_id"], body["member_id"], body["member_epoch"]
    names, regex = body["subscribed_topic_names"], body.get("subscribed_topic_regex")
    if epoch == _JOIN:
        sub = Subscription(None if names is None else tuple(names), regex or None)
        if sub.names is None and sub.regex is None:
            raise _Refused(_INVALID, "joining (epoch 0) needs the subscribed topic names")
        topics = await _subscribed(serving, session, sub)
        return *await _join(serving, body, topics, frozenset()), sub
    coord = await serving.groups.coordinator(group)
    state = coord.state
    known = state.members.get(member)
    if known is None:
        raise _Refused(_UNKNOWN_MEMBER, f"member {member} is not in group {group}; join again")
    if epoch > state.generation:
        raise _Refused(_FENCED, f"epoch {epoch} is ahead of group {group}'s {state.generation}")
    owned = (
        frozenset(known.owned)
        if body["topic_partitions"] is None
        else _named_partitions(serving, known.topics, body["topic_partitions"])
    )
    before = serving.consumers.subscription(group, member)
    sub = Subscription(
        before.names if names is None else tuple(names),
        before.regex if regex is None else regex or None,
    )
    if sub.regex is not None or names is not None:
        topics = await _subscribed(serving, session, sub)
        if frozenset(topics) != known.topics:  # a new subscription, or new matches
            return *await _join(serving, body, topics, owned), sub
    return *await _beat(coord, member, owned), sub


async def _subscribed(
    serving: KafkaServing, session: Session, sub: Subscription
) -> tuple[str, ...]:
    """The existing topics the subscription names or its regex matches (of those the
    principal may consume), sorted; UNKNOWN_TOPIC_OR_PARTITION when there is none."""
    existing = await TopicAdmin(serving.ns()).list_topics()
    wanted = set(sub.names or ()) & set(existing)
    if sub.regex is not None:
        pattern = _compiled(sub.regex)
        wanted |= {
            t
            for t in existing
            if pattern.fullmatch(t) and serving.allowed(session, "consume", "topic", t)
        }
    if not wanted:
        what = ", ".join([*(sub.names or ()), *([f"/{sub.regex}/"] if sub.regex else [])])
        raise _Refused(_NO_TOPIC, f"no existing topic is subscribed to: {what}")
    return tuple(sorted(wanted))


def _compiled(regex: str) -> Any:
    """The pattern compiled by RE2, or INVALID_REGULAR_EXPRESSION."""
    options = re2.Options()
    options.max_mem = _REGEX_MEMORY_BYTES
    options.log_errors = False
    try:
        return re2.compile(regex, options)
    except re2.error as exc:
        raise _Refused(_BAD_REGEX, f"invalid regular expression {regex!r}: {exc}") from None


async def _beat(
    coord: GroupCoordinator, member: str, owned: frozenset[TopicPartition]
) -> tuple[str, int, frozenset[TopicPartition]]:
    # The generation now: no await between reading it and the coordinator checking it.
    generation, parts = await coord.heartbeat(
        HeartbeatRequest(member, coord.state.generation, owned)
    )
    return member, generation, parts


async def _join(
    serving: KafkaServing,
    body: dict[str, Any],
    subscribed: tuple[str, ...],
    owned: frozenset[TopicPartition],
) -> tuple[str, int, frozenset[TopicPartition]]:
    assert serving.groups is not None
    req = JoinRequest(
        topics=subscribed,
        member_id=body["member_id"] or None,
        instance_id=body["instance_id"],
        session_timeout_ms=SESSION_TIMEOUT_MS,
        owned=owned,
    )
    result = await serving.groups.join(body["group_id"], req)
    return result.member_id, result.generation, result.partitions


def _named_partitions(
    serving: KafkaServing, topics: Iterable[str], by_id: list[dict[str, Any]]
) -> frozenset[TopicPartition]:
    """The member's owned partitions, named (ids of topics it does not subscribe to are
    no partitions it may own, and are left out)."""
    names = names_by_id(serving.ns().name, topics)
    return frozenset(
        (names[entry["topic_id"]], p)
        for entry in by_id
        if entry["topic_id"] in names
        for p in entry["partitions"]
    )


async def commit_generation(serving: KafkaServing, group: str, member: str, epoch: int) -> int:
    """The generation an OffsetCommit of ``member`` is checked against: for a member of
    this protocol whose epoch is not ahead of the group's, the group's generation now
    (its epoch is the generation it last heard of, and it may lag); ``epoch`` otherwise."""
    if serving.groups is None or epoch <= 0 or not serving.consumers.has(group, member):
        return epoch
    generation = (await serving.groups.coordinator(group)).state.generation
    return generation if epoch <= generation else epoch
