"""DescribeConfigs and IncrementalAlterConfigs: a topic's configs by Kafka's names
(:mod:`metadata.topic_configs`), read and changed through the core library's topic
admin (:class:`~groups.topics.TopicAdmin`), as ``bookline topic`` and the HTTP routes
do.

A topic's configs are described with their source, as Kafka's broker reports them:
DYNAMIC_TOPIC_CONFIG for what the topic sets, DEFAULT_CONFIG for the rest (defaults
come from the table or the namespace's ``[core]`` settings, never from a broker's
properties). Broker resources are answered with no configs and no error: a Bookline
proxy's settings are its own (``docs/configuration.md``), and clients that describe a
broker only look for a few entries and fall back to their defaults. Broker configs are
not alterable over Kafka (INVALID_REQUEST).

IncrementalAlterConfigs serves SET, DELETE (back to the default), and APPEND and
SUBTRACT on list configs (``cleanup.policy``), computed inside the topic record's
compare-and-set so two alters at once both apply. Bad names and values are
INVALID_CONFIG, as Kafka answers; nothing of a resource is changed then.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

from foundation.errors import BooklineError
from groups.topics import TopicAdmin
from kafkaapi.errormap import kafka_code
from kafkaapi.protocol import errors as kerr
from kafkaapi.protocol.errors import KafkaProtocolError
from metadata.topic_configs import CONFIGS, EffectiveConfig, merge_configs, stream_options

if TYPE_CHECKING:
    from kafkaapi.context import KafkaServing, Session
    from kafkaapi.protocol.messages import Request

__all__ = ["describe_configs", "incremental_alter_configs"]

# Kafka's ConfigResource.Type.
TOPIC: Final = 2
BROKER: Final = 4
# Kafka's DescribeConfigsResponse.ConfigSource.
DYNAMIC_TOPIC_CONFIG: Final = 1
DEFAULT_CONFIG: Final = 5
# Kafka's DescribeConfigsResponse.ConfigType, by the table's kinds.
_CONFIG_TYPES: Final = {"long": 5, "ratio": 6, "choice": 2, "list": 7}
# Kafka's AlterConfigOp.OpType.
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3

_DENIED: Final = kerr.code_named("TOPIC_AUTHORIZATION_FAILED")
_INVALID_CONFIG: Final = kerr.code_named("INVALID_CONFIG")
_INVALID_REQUEST: Final = kerr.INVALID_REQUEST


def _entry(config: EffectiveConfig, synonyms: bool, documentation: bool) -> dict[str, Any]:
    source = DYNAMIC_TOPIC_CONFIG if config.source == "topic" else DEFAULT_CONFIG
    spec = CONFIGS[config.name]
    return {
        "name": config.name,
        "value": config.value,
        "read_only": False,
        "is_default": config.source == "default",  # v0's form of the source
        "config_source": source,
        "is_sensitive": False,
        # Kafka lists the entry's own source first among its synonyms.
        "synonyms": [{"name": config.name, "value": config.value, "source": source}]
        if synonyms
        else [],
        "config_type": _CONFIG_TYPES[spec.kind],
        "documentation": spec.meaning if documentation else None,
    }


def _result(kind: int, name: str) -> dict[str, Any]:
    return {"error_code": 0, "error_message": None, "resource_type": kind, "resource_name": name}


async def describe_configs(
    serving: KafkaServing, session: Session, request: Request
) -> dict[str, Any]:
    body = request.body
    admin = TopicAdmin(serving.ns())
    results = []
    for resource in body["resources"]:
        kind, name = resource["resource_type"], resource["resource_name"]
        answer = _result(kind, name) | {"configs": []}
        try:
            if kind == TOPIC:
                if not (
                    serving.allowed(session, "consume", "topic", name)
                    or serving.allowed(session, "produce", "topic", name)
                ):
                    raise KafkaProtocolError(_DENIED, f"may not describe topic {name!r}")
                keys = resource["configuration_keys"]
                answer["configs"] = [
                    _entry(c, body["include_synonyms"], body["include_documentation"])
                    for c in await admin.describe_configs(name)
                    if keys is None or c.name in keys  # unknown keys: left out, as Kafka
                ]
            elif kind != BROKER:
                raise KafkaProtocolError(_INVALID_REQUEST, f"resource type {kind} not served")
        except BooklineError as exc:
            answer |= {"error_code": kafka_code(exc).code, "error_message": exc.message}
        results.append(answer)
    return {"throttle_time_ms": 0, "results": results}


def _list_edit(current: str, op: int, items: str) -> str:
    have = [v for v in current.split(",") if v]
    given = [v.strip() for v in items.split(",") if v.strip()]
    if op == APPEND:
        return ",".join(have + [v for v in given if v not in have])
    return ",".join(v for v in have if v not in given)


class _Alter:
    """One resource's operations, checked, and applied to a topic's configs."""

    def __init__(self, ops: list[dict[str, Any]]) -> None:
        names = [op["name"] for op in ops]
        if len(set(names)) != len(names):
            raise KafkaProtocolError(_INVALID_REQUEST, "a config named twice in one resource")
        self.sets: dict[str, object] = {}
        self.deletes: list[str] = []
        self.lists: dict[str, tuple[int, str]] = {}
        for op in ops:
            name, kind, value = op["name"], op["config_operation"], op["value"]
            if kind == DELETE:
                self.deletes.append(name)
                continue
            if kind not in (SET, APPEND, SUBTRACT):
                raise KafkaProtocolError(_INVALID_REQUEST, f"config operation {kind}")
            if value is None:
                raise KafkaProtocolError(_INVALID_REQUEST, f"a null value for {name}")
            if kind == SET:
                self.sets[name] = value
                continue
            spec = CONFIGS.get(name)
            if spec is None or spec.kind != "list":
                raise KafkaProtocolError(
                    _INVALID_CONFIG, f"{name} is not a list config: no APPEND or SUBTRACT"
                )
            self.lists[name] = (kind, value)

    def changes(self, current: Mapping[str, str]) -> dict[str, object]:
        """SET's values and the list edits applied to ``current`` (or the default)."""
        out = dict(self.sets)
        for name, (kind, items) in self.lists.items():
            out[name] = _list_edit(current.get(name, CONFIGS[name].default or ""), kind, items)
        return out


async def _alter_topic(admin: TopicAdmin, name: str, alter: _Alter, validate_only: bool) -> None:
    if validate_only:
        current = (await admin.get_topic(name)).configs
        merged = merge_configs(current, alter.changes(current), alter.deletes)
        stream_options(merged, admin.defaults())  # the quorums, together
        return
    await admin.alter_configs(name, alter.changes, alter.deletes)


async def incremental_alter_configs(
    serving: KafkaServing, session: Session, request: Request
) -> dict[str, Any]:
    admin = TopicAdmin(serving.ns())
    responses = []
    for resource in request.body["resources"]:
        kind, name = resource["resource_type"], resource["resource_name"]
        answer = _result(kind, name)
        try:
            if kind != TOPIC:
                raise KafkaProtocolError(
                    _INVALID_REQUEST, f"only topic configs are alterable (resource type {kind})"
                )
            if not serving.allowed(session, "admin", "topic", name):
                raise KafkaProtocolError(_DENIED, f"may not alter topic {name!r}")
            alter = _Alter(resource["configs"])
            await _alter_topic(admin, name, alter, request.body["validate_only"])
        except BooklineError as exc:
            answer |= {"error_code": kafka_code(exc).code, "error_message": exc.message}
        responses.append(answer)
    return {"throttle_time_ms": 0, "responses": responses}
