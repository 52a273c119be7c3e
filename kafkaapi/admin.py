"""CreateTopics, DeleteTopics and CreatePartitions over the core library's topic admin
(:class:`~groups.topics.TopicAdmin`; in a write proxy its topic hosting, which first
releases the partitions it owns of a topic being deleted).

A topic's replication is Bookline's ensemble and quorums (the namespace's), not a
replica count: ``replication_factor`` and replica assignments are accepted and
ignored. ``num_partitions`` -1 takes :data:`DEFAULT_PARTITIONS`. Topic configs are
every one of :mod:`metadata.topic_configs`'s table; an unknown name or a bad value is
INVALID_CONFIG and a null value INVALID_REQUEST, as Kafka answers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

from foundation.errors import BooklineError
from groups.topics import TopicAdmin
from kafkaapi.configs import DEFAULT_CONFIG, DYNAMIC_TOPIC_CONFIG
from kafkaapi.errormap import kafka_code
from kafkaapi.protocol import errors as kerr
from kafkaapi.protocol.errors import KafkaProtocolError
from metadata.topic_configs import check_configs, effective, stream_options

if TYPE_CHECKING:
    from kafkaapi.context import KafkaServing, Session
    from kafkaapi.protocol.messages import Request

__all__ = ["create_partitions", "create_topics", "delete_topics"]

# Partitions of a topic created without a count (Kafka's num.partitions default).
DEFAULT_PARTITIONS: Final = 1
_DENIED: Final = kerr.code_named("TOPIC_AUTHORIZATION_FAILED")
_INVALID_PARTITIONS: Final = kerr.code_named("INVALID_PARTITIONS")


def _configs(configs: list[dict[str, Any]]) -> dict[str, str]:
    """A CreateTopics topic's configs by name (checked by the topic admin)."""
    given: dict[str, str] = {}
    for config in configs:
        name, value = config["name"], config["value"]
        if value is None:
            raise KafkaProtocolError(kerr.INVALID_REQUEST, f"a null value for config {name}")
        if name in given:
            raise KafkaProtocolError(kerr.INVALID_REQUEST, f"config {name} given twice")
        given[name] = value
    return given


def _error(code: kerr.KafkaCode, message: str | None) -> dict[str, Any]:
    return {"error_code": code.code, "error_message": message}


async def create_topics(
    serving: KafkaServing, session: Session, request: Request
) -> dict[str, Any]:
    admin = TopicAdmin(serving.ns())
    validate_only = request.body["validate_only"]
    out = []
    for topic in request.body["topics"]:
        name = topic["name"]
        count = topic["num_partitions"]
        count = DEFAULT_PARTITIONS if count == -1 else count
        answer: dict[str, Any] = {"name": name, "error_code": 0, "error_message": None}
        if not serving.allowed(session, "admin", "topic", name):
            out.append(answer | _error(_DENIED, f"may not create topic {name!r}"))
            continue
        try:
            configs = _configs(topic["configs"])
            if count <= 0:
                raise KafkaProtocolError(_INVALID_PARTITIONS, f"{count} partitions")
            given: Mapping[str, str] = check_configs(configs)
            stream_options(given, admin.defaults())  # the quorums, together
            if not validate_only:
                given = (await admin.create_topic(name, count, configs=configs)).configs
        except BooklineError as exc:
            out.append(answer | _error(kafka_code(exc), exc.message))
            continue
        shown = [
            {"name": c.name, "value": c.value, "read_only": False, "is_sensitive": False,
             "config_source": DYNAMIC_TOPIC_CONFIG if c.source == "topic" else DEFAULT_CONFIG}
            for c in effective(given, admin.defaults())
        ]  # fmt: skip
        out.append(answer | {"num_partitions": count, "replication_factor": -1, "configs": shown})
    return {"throttle_time_ms": 0, "topics": out}


async def delete_topics(
    serving: KafkaServing, session: Session, request: Request
) -> dict[str, Any]:
    body = request.body
    names = body["topic_names"] if request.version < 6 else [t["name"] for t in body["topics"]]
    out = []
    for name in names:
        answer: dict[str, Any] = {"name": name, "error_code": 0}
        if name is None:  # by topic id: Bookline's topics have none (docs/kafka.md)
            out.append(answer | _error(kerr.code_named("UNKNOWN_TOPIC_ID"), "no topic ids"))
            continue
        if not serving.allowed(session, "admin", "topic", name):
            out.append(answer | _error(_DENIED, f"may not delete topic {name!r}"))
            continue
        try:
            if serving.topics is not None:
                await serving.topics.delete(name)
            else:
                await TopicAdmin(serving.ns()).delete_topic(name)
        except BooklineError as exc:
            out.append(answer | _error(kafka_code(exc), exc.message))
            continue
        out.append(answer)
    return {"throttle_time_ms": 0, "responses": out}


async def create_partitions(
    serving: KafkaServing, session: Session, request: Request
) -> dict[str, Any]:
    admin = TopicAdmin(serving.ns())
    out = []
    for topic in request.body["topics"]:
        name, count = topic["name"], topic["count"]
        answer: dict[str, Any] = {"name": name, "error_code": 0, "error_message": None}
        if not serving.allowed(session, "admin", "topic", name):
            out.append(answer | _error(_DENIED, f"may not alter topic {name!r}"))
            continue
        try:
            current = await admin.partitions(name)
            if count <= current:
                raise KafkaProtocolError(
                    _INVALID_PARTITIONS,
                    f"topic {name} has {current} partitions; cannot go to {count}",
                )
            if not request.body["validate_only"]:
                await admin.alter_partitions(name, count)
        except BooklineError as exc:
            out.append(answer | _error(kafka_code(exc), exc.message))
            continue
        out.append(answer)
    return {"throttle_time_ms": 0, "results": out}
