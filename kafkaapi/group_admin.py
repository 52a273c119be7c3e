"""ListGroups, DescribeGroups and DeleteGroups over the write proxies' group hosting.

Kafka's admin clients ask every broker for its groups and merge the answers; Bookline's
group list is the namespace's (whoever coordinates each), so only the controller (the
first write proxy, :meth:`~kafkaapi.brokers.BrokerView.controller`) lists them and the
other brokers answer none: each group is listed once. DescribeGroups and DeleteGroups
go to the group's coordinator like the other group APIs (NOT_COORDINATOR elsewhere).
A group Kafka classic members use is described as Kafka describes it (its state,
protocol, members' metadata and the assignment bytes their leader sent); a Bookline
group's member assignment is what it may consume now, in the consumer protocol's format.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from foundation.errors import BooklineError
from kafkaapi.brokers import BrokerView
from kafkaapi.consumer_protocol import encode_assignment
from kafkaapi.groups import group_code
from kafkaapi.protocol import errors as kerr

if TYPE_CHECKING:
    from kafkaapi.classic_group import ClassicGroup
    from kafkaapi.context import KafkaServing, Session
    from kafkaapi.protocol.messages import Request

__all__ = ["delete_groups", "describe_groups", "list_groups"]

_DENIED: Final = kerr.code_named("GROUP_AUTHORIZATION_FAILED")
_NOT_COORDINATOR: Final = kerr.code_named("NOT_COORDINATOR")
# Bookline's group phases as Kafka names group states.
_STATES: Final = {"empty": "Empty", "stable": "Stable", "rebalancing": "PreparingRebalance"}


async def list_groups(serving: KafkaServing, session: Session, request: Request) -> dict[str, Any]:
    answer: dict[str, Any] = {"throttle_time_ms": 0, "error_code": 0, "groups": []}
    view = await BrokerView.load(serving.md, serving.registration())
    if serving.groups is None or view.controller() != serving.node_id:
        return answer  # listed by the controller alone (module docstring)
    try:
        names = await serving.groups.list_groups()
    except BooklineError as exc:
        return answer | {"error_code": group_code(exc).code}
    groups = [
        {"group_id": g, "protocol_type": "consumer", "group_state": "", "group_type": "classic"}
        for g in names
        if serving.allowed(session, "consume", "group", g)
    ]
    return answer | {"groups": groups}


async def describe_groups(
    serving: KafkaServing, session: Session, request: Request
) -> dict[str, Any]:
    return {
        "throttle_time_ms": 0,
        "groups": [await _describe(serving, session, g) for g in request.body["groups"]],
    }


async def _describe(serving: KafkaServing, session: Session, group: str) -> dict[str, Any]:
    answer: dict[str, Any] = {"group_id": group, "group_state": "", "protocol_type": "",
                              "protocol_data": "", "members": []}  # fmt: skip
    if not serving.allowed(session, "consume", "group", group):
        return answer | {"error_code": _DENIED.code}
    if serving.groups is None:
        return answer | {"error_code": _NOT_COORDINATOR.code}
    try:
        coord = await serving.groups.coordinator(group)
        classic = serving.classic.held(group, coord)
        if classic is not None and classic.live:
            return answer | _describe_classic(classic.state)
        view = await coord.describe()
    except BooklineError as exc:
        if group_code(exc).name == "GROUP_ID_NOT_FOUND":  # Kafka: a Dead group
            return answer | {"error_code": 0, "group_state": "Dead"}
        return answer | {"error_code": group_code(exc).code}
    members = [
        {
            "member_id": m["member_id"],
            "group_instance_id": m["instance_id"],
            "client_id": "",
            "client_host": "",
            "member_metadata": b"",
            "member_assignment": encode_assignment(frozenset(map(tuple, m["consuming"]))),
        }
        for m in view["members"]
    ]
    return answer | {
        "error_code": 0,
        "group_state": _STATES.get(view["state"], view["state"]),
        "protocol_type": "consumer",
        "protocol_data": view["assignor"] or "",
        "members": members,
    }


def _describe_classic(group: ClassicGroup) -> dict[str, Any]:
    """A Kafka classic group as Kafka describes it: its state, chosen protocol, and per
    member its metadata (of that protocol) and the assignment its leader sent."""
    members = [
        {
            "member_id": m.member_id,
            "group_instance_id": m.instance_id,
            "client_id": m.client_id,
            "client_host": m.client_host,
            "member_metadata": m.metadata(group.protocol),
            "member_assignment": m.assignment,
        }
        for m in group.members.values()
    ]
    return {
        "error_code": 0,
        "group_state": group.state,
        "protocol_type": group.protocol_type or "",
        "protocol_data": group.protocol or "",
        "members": members,
    }


async def delete_groups(
    serving: KafkaServing, session: Session, request: Request
) -> dict[str, Any]:
    results = []
    for group in request.body["groups_names"]:
        code = 0
        if not serving.allowed(session, "admin", "group", group):
            code = _DENIED.code
        elif serving.groups is None:
            code = _NOT_COORDINATOR.code
        else:
            try:
                await serving.groups.delete(group)  # GROUP_NOT_EMPTY while Kafka's live
                serving.classic.drop(group)
            except BooklineError as exc:
                code = group_code(exc).code
        results.append({"group_id": group, "error_code": code})
    return {"throttle_time_ms": 0, "results": results}
