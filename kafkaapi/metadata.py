"""Metadata: the namespace's topics, each partition led by the write proxy owning its
stream (:mod:`kafkaapi.brokers`), and the brokers registered in ZooKeeper.

A partition has one replica as Kafka counts them, its leader: Bookline's copies are
the bookies' (ensemble and quorums), which Kafka clients need not know. With auth on,
a listing names only the topics the principal may produce to, consume or administer;
a topic asked by name that it may not gets TOPIC_AUTHORIZATION_FAILED. Each topic has
its stable id (:mod:`kafkaapi.topic_ids`, v10+), and a topic may be asked by id (an
unknown id gets UNKNOWN_TOPIC_ID).
"""

from __future__ import annotations

import asyncio
import uuid
from typing import TYPE_CHECKING, Any, Final

from foundation.errors import BooklineError
from foundation.names import partition_stream
from groups.topics import TopicAdmin
from kafkaapi.brokers import BrokerView
from kafkaapi.errormap import kafka_code
from kafkaapi.protocol import errors as kerr
from kafkaapi.topic_ids import ZERO, names_by_id, topic_id

if TYPE_CHECKING:
    from kafkaapi.context import KafkaServing, Session
    from kafkaapi.protocol.messages import Request

__all__ = ["describe_cluster", "metadata"]

# Kafka's "no authorized operations asked for" value in Metadata.
_NO_OPERATIONS: Final = -(1 << 31)
_DENIED: Final = kerr.code_named("TOPIC_AUTHORIZATION_FAILED")
_NO_LEADER: Final = kerr.code_named("LEADER_NOT_AVAILABLE")
_UNKNOWN_ID: Final = kerr.code_named("UNKNOWN_TOPIC_ID")
_PERMISSIONS: Final = ("produce", "consume", "admin")


async def metadata(serving: KafkaServing, session: Session, request: Request) -> dict[str, Any]:
    view = await BrokerView.load(serving.md, serving.registration())
    asked = request.body["topics"]
    names: list[str | uuid.UUID | None]
    if asked is None or (request.version == 0 and not asked):
        listed = await TopicAdmin(serving.ns()).list_topics()  # null (v0: empty): all
        names = [n for n in listed if _visible(serving, session, n)]
    else:
        names = [topic["name"] for topic in asked]
        ids = [topic.get("topic_id", ZERO) for topic in asked]
        if any(n is None and i != ZERO for n, i in zip(names, ids, strict=True)):
            names = await _by_id(serving, names, ids)
    topics = await asyncio.gather(*(_topic(serving, session, view, n) for n in names))
    return {
        "throttle_time_ms": 0,
        "brokers": [
            {"node_id": b.node_id, "host": b.host, "port": b.port, "rack": b.rack}
            for b in view.brokers
        ],
        "cluster_id": serving.cluster_id,
        "controller_id": view.controller(),
        "topics": list(topics),
        "cluster_authorized_operations": _NO_OPERATIONS,
    }


async def _by_id(
    serving: KafkaServing, names: list[str | uuid.UUID | None], ids: list[uuid.UUID]
) -> list[str | uuid.UUID | None]:
    """Each topic asked by id (v10+) by its name, if it has one; the id otherwise."""
    known = names_by_id(serving.ns().name, await TopicAdmin(serving.ns()).list_topics())
    return [
        name if name is not None or wanted == ZERO else known.get(wanted, wanted)
        for name, wanted in zip(names, ids, strict=True)
    ]


def _visible(serving: KafkaServing, session: Session, name: str) -> bool:
    return any(serving.allowed(session, p, "topic", name) for p in _PERMISSIONS)


async def _topic(
    serving: KafkaServing, session: Session, view: BrokerView, name: str | uuid.UUID | None
) -> dict[str, Any]:
    if isinstance(name, uuid.UUID):  # an id no topic has
        return {"name": "", "topic_id": name, "is_internal": False, "partitions": [],
                "error_code": _UNKNOWN_ID.code}  # fmt: skip
    answer: dict[str, Any] = {"name": name, "is_internal": False, "partitions": []}
    if name is None or not _visible(serving, session, name):
        return answer | {"error_code": _DENIED.code}
    answer["topic_id"] = topic_id(serving.ns().name, name)
    try:
        count = await TopicAdmin(serving.ns()).partitions(name)
        owners = await asyncio.gather(*(_owner(serving, name, p) for p in range(count)))
    except BooklineError as exc:
        return answer | {"error_code": kafka_code(exc).code}
    partitions = []
    for index, owner in enumerate(owners):
        leader = view.leader(owner, partition_stream(name, index))
        replicas = [leader, *view.readers] if leader >= 0 else []
        partitions.append(
            {
                "error_code": 0 if leader >= 0 else _NO_LEADER.code,
                "partition_index": index,
                "leader_id": leader,
                "leader_epoch": -1,
                "replica_nodes": replicas,  # the read proxies follow every partition
                "isr_nodes": replicas,
                "offline_replicas": [],
            }
        )
    return answer | {
        "error_code": 0,
        "partitions": partitions,
        "topic_authorized_operations": _NO_OPERATIONS,
    }


async def _owner(serving: KafkaServing, topic: str, index: int) -> str | None:
    """Registration id of the proxy owning the partition's stream, or None."""
    record = await serving.md.proxies.get_owner(serving.ns().name, partition_stream(topic, index))
    return None if record is None else record.proxy_id


async def describe_cluster(
    serving: KafkaServing, session: Session, request: Request
) -> dict[str, Any]:
    """The brokers and the controller, as Metadata names them."""
    view = await BrokerView.load(serving.md, serving.registration())
    return {
        "throttle_time_ms": 0,
        "error_code": 0,
        "cluster_id": serving.cluster_id,
        "controller_id": view.controller(),
        "brokers": [
            {"broker_id": b.node_id, "host": b.host, "port": b.port, "rack": b.rack}
            for b in view.brokers
        ],
    }
