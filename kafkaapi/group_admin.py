"""ListGroups, DescribeGroups and DeleteGroups over the write proxies' group hosting.

Kafka's admin clients ask every broker for its groups and merge the answers: each
broker lists the groups it coordinates, with their state and type (``states_filter``
and ``types_filter`` applied), and the controller (the first write proxy,
:meth:`~kafkaapi.brokers.BrokerView.controller`) those no broker coordinates now.
DescribeGroups and DeleteGroups go to the group's coordinator like the other group
APIs (NOT_COORDINATOR elsewhere).
A group Kafka classic members use is described as Kafka describes it (its state,
protocol, members' metadata and the assignment bytes their leader sent); a Bookline
group's member assignment is what it may consume now, in the consumer protocol's format.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from foundation.errors import BooklineError
from foundation.gather import gather_bounded
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
# Owner look-ups (ZooKeeper reads) at once when the controller lists groups no broker hosts.
_OWNER_LOOKUPS_CONCURRENT: Final = 16
_STATES: Final = {"empty": "Empty", "stable": "Stable", "rebalancing": "PreparingRebalance"}


async def list_groups(serving: KafkaServing, session: Session, request: Request) -> dict[str, Any]:
    answer: dict[str, Any] = {"throttle_time_ms": 0, "error_code": 0, "groups": []}
    if serving.groups is None:
        return answer  # a read proxy coordinates no group
    states = {s.lower() for s in request.body.get("states_filter") or ()}
    types = {t.lower() for t in request.body.get("types_filter") or ()}
    try:
        listed = await _listed(serving)
    except BooklineError as exc:
        return answer | {"error_code": group_code(exc).code}
    groups = [
        {"group_id": g, "protocol_type": "consumer", "group_state": state, "group_type": kind}
        for g, (state, kind) in sorted(listed.items())
        if serving.allowed(session, "consume", "group", g)
        and (not states or state.lower() in states)
        and (not types or kind in types)
    ]
    return answer | {"groups": groups}


async def _listed(serving: KafkaServing) -> dict[str, tuple[str, str]]:
    """The groups this broker lists, by name: (state, type). As on Kafka, each broker
    lists the groups it coordinates: a Kafka classic group's state, or the phase of
    Bookline's coordinator (type "consumer" while it has members). The controller also
    lists those no other broker coordinates (their log owned by no one, or by a proxy
    without a Kafka listener): no members, so "Empty", and "classic", as Kafka lists a
    group that only has committed offsets. Admin clients merge every broker's answer:
    each group once."""
    assert serving.groups is not None
    listed: dict[str, tuple[str, str]] = {}
    for group, phase in serving.groups.hosted_phases().items():
        classic = serving.classic.view(group)
        if classic is not None:
            listed[group] = (classic["state"], "classic")
        else:  # Bookline's or KIP-848 members; with none, what Kafka calls it then
            listed[group] = (
                _STATES.get(phase, phase),
                "classic" if phase == "empty" else "consumer",
            )
    view = await BrokerView.load(serving.md, serving.registration())
    if view.controller() != serving.node_id:
        return listed
    others = {url for url, node in view.write_urls.items() if node != serving.node_id}
    rest = [g for g in await serving.groups.list_groups() if g not in listed]
    owners = await gather_bounded(rest, serving.groups.owner_of, _OWNER_LOOKUPS_CONCURRENT)
    for group, owner in zip(rest, owners, strict=True):
        if owner is None or owner.rstrip("/") not in others:
            listed[group] = ("Empty", "classic")
    return listed


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
