"""Kafka's classic group membership APIs (JoinGroup, SyncGroup, Heartbeat,
LeaveGroup): the clients' own protocol, leader and assignors, on the coordinator of
the group's Bookline log (:mod:`kafkaapi.classic_host`, the state machine
:mod:`kafkaapi.classic_group`). The coordinator relays the leader's assignment bytes.

A group has one kind of members at a time: a JoinGroup to a group whose Bookline
members live (thin-client consumers, or KIP-848 ones) is INCONSISTENT_GROUP_PROTOCOL,
Kafka's answer for a group of another protocol type; the write core refuses a Bookline
member while classic members live (GROUP_NOT_EMPTY).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from foundation.errors import BooklineError, NotFoundError
from kafkaapi.classic_group import JoinArgs, SyncArgs
from kafkaapi.groups import group_code
from kafkaapi.protocol import errors as kerr

if TYPE_CHECKING:
    from groups.coordinator import GroupCoordinator
    from kafkaapi.classic_host import Driver
    from kafkaapi.context import KafkaServing, Session
    from kafkaapi.protocol.messages import Request

__all__ = [
    "heartbeat",
    "join_group",
    "leave_group",
    "sync_group",
]

_named = kerr.code_named
_DENIED: Final = _named("GROUP_AUTHORIZATION_FAILED")
_NOT_COORDINATOR: Final = _named("NOT_COORDINATOR")
_INCONSISTENT: Final = _named("INCONSISTENT_GROUP_PROTOCOL")
_UNKNOWN_MEMBER: Final = _named("UNKNOWN_MEMBER_ID")
# A JoinGroup below v4 answers no member id of its own; v1+ names a rebalance timeout.
_REQUIRES_KNOWN_ID: Final = 4
_NULLABLE_NAME: Final = 7  # JoinGroup's protocol_name may be null from v7
_SKIP_ASSIGNMENT: Final = 9  # JoinGroup's answer tells a leader to skip assigning from v9


class _Refused(Exception):
    """A membership request refused before it reaches the group (its Kafka code)."""

    def __init__(self, code: kerr.KafkaCode) -> None:
        super().__init__(code.name)
        self.code = code


async def _driver(serving: KafkaServing, session: Session, group: str, *, create: bool) -> Driver:
    """The group's classic driver here, or _Refused with the code to answer."""
    if not serving.allowed(session, "consume", "group", group):
        raise _Refused(_DENIED)
    if serving.groups is None:
        raise _Refused(_NOT_COORDINATOR)  # a read proxy coordinates no group
    try:
        coord: GroupCoordinator = await serving.groups.coordinator(group, create=create)
    except NotFoundError:
        raise _Refused(_UNKNOWN_MEMBER) from None  # never joined: not a member of it
    except BooklineError as exc:
        raise _Refused(group_code(exc)) from exc
    return serving.classic.current(group, coord)


def _code(name: str) -> int:
    return 0 if name == "NONE" else _named(name).code


async def join_group(serving: KafkaServing, session: Session, request: Request) -> dict[str, Any]:
    body = request.body
    group = body["group_id"]
    answer: dict[str, Any] = {"throttle_time_ms": 0, "generation_id": -1, "leader": "",
                              "member_id": body["member_id"], "members": [],
                              "protocol_type": body["protocol_type"], "protocol_name": "",
                              "skip_assignment": False}  # fmt: skip
    try:
        driver = await _driver(serving, session, group, create=True)
    except _Refused as exc:
        return answer | {"error_code": exc.code.code}
    if driver.coord.state.members:  # Bookline's own members use it (module docstring)
        return answer | {"error_code": _INCONSISTENT.code}
    rebalance_ms = body["rebalance_timeout_ms"]
    args = JoinArgs(
        member_id=body["member_id"],
        instance_id=body["group_instance_id"],
        session_timeout_ms=body["session_timeout_ms"],
        # v0 has none: Kafka takes the session timeout.
        rebalance_timeout_ms=rebalance_ms if rebalance_ms > 0 else body["session_timeout_ms"],
        protocol_type=body["protocol_type"],
        protocols=tuple((p["name"], p["metadata"]) for p in body["protocols"]),
        require_known_id=request.version >= _REQUIRES_KNOWN_ID
        and body["group_instance_id"] is None,
        client_id=request.client_id or "",
        client_host=session.peer,
        supports_skip_assignment=request.version >= _SKIP_ASSIGNMENT,
    )
    result = await driver.join(args)
    members = [{"member_id": m, "group_instance_id": i, "metadata": meta}
               for m, i, meta in result.members]  # fmt: skip
    return answer | {
        "error_code": _code(result.error),
        "generation_id": result.generation,
        "protocol_type": result.protocol_type,
        # Nullable from v7 only: before, no protocol chosen yet is "".
        "protocol_name": result.protocol_name
        or (None if request.version >= _NULLABLE_NAME else ""),
        "leader": result.leader,
        "skip_assignment": result.skip_assignment,
        "member_id": result.member_id,
        "members": members,
    }


async def sync_group(serving: KafkaServing, session: Session, request: Request) -> dict[str, Any]:
    body = request.body
    answer: dict[str, Any] = {"throttle_time_ms": 0, "assignment": b"",
                              "protocol_type": body["protocol_type"],
                              "protocol_name": body["protocol_name"]}  # fmt: skip
    try:
        driver = await _driver(serving, session, body["group_id"], create=False)
    except _Refused as exc:
        return answer | {"error_code": exc.code.code}
    args = SyncArgs(
        member_id=body["member_id"],
        instance_id=body["group_instance_id"],
        generation=body["generation_id"],
        protocol_type=body["protocol_type"],
        protocol_name=body["protocol_name"],
        assignments={a["member_id"]: a["assignment"] for a in body["assignments"]},
    )
    result = await driver.sync(args)
    return answer | {
        "error_code": _code(result.error),
        "assignment": result.assignment,
        "protocol_type": result.protocol_type or body["protocol_type"],
        "protocol_name": result.protocol_name or body["protocol_name"],
    }


async def heartbeat(serving: KafkaServing, session: Session, request: Request) -> dict[str, Any]:
    body = request.body
    try:
        driver = await _driver(serving, session, body["group_id"], create=False)
    except _Refused as exc:
        return {"throttle_time_ms": 0, "error_code": exc.code.code}
    error = driver.heartbeat(body["member_id"], body["group_instance_id"], body["generation_id"])
    return {"throttle_time_ms": 0, "error_code": _code(error)}


async def leave_group(serving: KafkaServing, session: Session, request: Request) -> dict[str, Any]:
    body = request.body
    if request.version < 3:
        members = [{"member_id": body["member_id"], "group_instance_id": None}]
    else:
        members = body["members"]
    try:
        driver = await _driver(serving, session, body["group_id"], create=False)
    except _Refused as exc:
        return {"throttle_time_ms": 0, "error_code": exc.code.code, "members": []}
    out = [
        {
            "member_id": m["member_id"],
            "group_instance_id": m["group_instance_id"],
            "error_code": _code(driver.leave(m["member_id"], m["group_instance_id"])),
        }
        for m in members
    ]
    first = out[0]["error_code"] if request.version < 3 else 0
    return {"throttle_time_ms": 0, "error_code": first, "members": out}
