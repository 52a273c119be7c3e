"""Topic configs over Kafka's admin APIs (issue 25), with real clients against a real
local cluster: confluent-kafka's AdminClient creates topics with configs, describes
them (every config, with Kafka's source: set or default) and alters them incrementally
(SET, DELETE, APPEND, SUBTRACT); kafka-python's KafkaAdminClient describes topics and
brokers; bad names and values get INVALID_CONFIG as Kafka answers; and what Kafka
changed is what ``bookline topic describe`` shows."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from kafkaapi.protocol.apis_admin import CREATE_TOPICS, INCREMENTAL_ALTER_CONFIGS
from ops.cluster.local import LocalCluster
from tests.cli_support import run_cli
from tests.kafka_cluster import bootstrap_of, kafka_call, kafka_cluster, new_topic

pytestmark = pytest.mark.integration

# Kafka's ConfigSource and error codes, as a client sees them.
DYNAMIC_TOPIC_CONFIG = 1
DEFAULT_CONFIG = 5
INVALID_CONFIG = 40
INVALID_REQUEST = 42
UNKNOWN_TOPIC_OR_PARTITION = 3
TIMEOUT_S = 60


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with kafka_cluster(tmp_path_factory.mktemp("kafka-configs")) as c:
        yield c


@pytest.fixture(scope="module")
def bootstrap(cluster: LocalCluster) -> str:
    return bootstrap_of(cluster)


def _admin(bootstrap: str) -> Any:
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": bootstrap})


def _described(bootstrap: str, topic: str) -> dict[str, tuple[str | None, int]]:
    from confluent_kafka.admin import ConfigResource, ResourceType  # type: ignore[attr-defined]

    resource, admin = ConfigResource(ResourceType.TOPIC, topic), _admin(bootstrap)
    entries = admin.describe_configs([resource])[resource].result(TIMEOUT_S)
    return {name: (e.value, int(e.source)) for name, e in entries.items()}


def _cli_configs(cluster: LocalCluster, topic: str) -> dict[str, tuple[str, str]]:
    out = run_cli("topic", "describe", topic, "--json", cluster=cluster.dir / "cluster.json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout.strip().splitlines()[-1])
    return {c["name"]: (c["value"], c["source"]) for c in doc["configs"]}


def _error_code(future: Any) -> int:
    from confluent_kafka import KafkaException

    with pytest.raises(KafkaException) as caught:
        future.result(TIMEOUT_S)
    return int(caught.value.args[0].code())


def test_create_with_configs_then_describe_every_config(
    cluster: LocalCluster, bootstrap: str
) -> None:
    from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]

    topic = new_topic()
    configs = {"cleanup.policy": "compact", "retention.ms": "86400000",
               "max.message.bytes": "65536", "min.cleanable.dirty.ratio": "0.25"}  # fmt: skip
    admin = _admin(bootstrap)  # held: futures fail once their client is collected
    futures = admin.create_topics([NewTopic(topic, 3, config=configs)])
    futures[topic].result(TIMEOUT_S)

    described = _described(bootstrap, topic)
    for name, value in configs.items():
        assert described[name] == (value, DYNAMIC_TOPIC_CONFIG), name
    assert described["segment.bytes"][1] == DEFAULT_CONFIG
    assert described["message.timestamp.type"] == ("CreateTime", DEFAULT_CONFIG)
    # Every config of the table, as bookline topic describe shows them.
    shown = _cli_configs(cluster, topic)
    assert set(described) == set(shown)
    assert {n for n, (_, source) in shown.items() if source == "topic"} == set(configs)


def test_create_with_a_bad_config_is_invalid_config_and_creates_nothing(
    bootstrap: str,
) -> None:
    from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]

    admin = _admin(bootstrap)
    unknown, bad = new_topic(), new_topic()
    futures = admin.create_topics([NewTopic(unknown, 1, config={"no.such.config": "1"}),
                                   NewTopic(bad, 1, config={"retention.ms": "soon"})])  # fmt: skip
    assert _error_code(futures[unknown]) == INVALID_CONFIG
    assert _error_code(futures[bad]) == INVALID_CONFIG
    listed = admin.list_topics(timeout=TIMEOUT_S).topics
    assert unknown not in listed and bad not in listed


def test_incremental_alter_set_delete_append_subtract(
    cluster: LocalCluster, bootstrap: str
) -> None:
    from confluent_kafka.admin import (  # type: ignore[attr-defined]
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        NewTopic,
        ResourceType,
    )

    admin, topic = _admin(bootstrap), new_topic()
    admin.create_topics([NewTopic(topic, 2, config={"retention.ms": "1000"})])[topic].result(
        TIMEOUT_S
    )

    def alter(*entries: ConfigEntry) -> Any:
        resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=list(entries))
        return admin.incremental_alter_configs([resource])[resource]

    alter(
        ConfigEntry("segment.ms", "60000", incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("retention.ms", None, incremental_operation=AlterConfigOpType.DELETE),
        ConfigEntry("cleanup.policy", "compact", incremental_operation=AlterConfigOpType.APPEND),
    ).result(TIMEOUT_S)
    described = _described(bootstrap, topic)
    assert described["segment.ms"] == ("60000", DYNAMIC_TOPIC_CONFIG)
    assert described["retention.ms"] == ("-1", DEFAULT_CONFIG)
    assert described["cleanup.policy"] == ("compact,delete", DYNAMIC_TOPIC_CONFIG)

    alter(
        ConfigEntry("cleanup.policy", "delete", incremental_operation=AlterConfigOpType.SUBTRACT)
    ).result(TIMEOUT_S)
    shown = _cli_configs(cluster, topic)
    assert shown["cleanup.policy"] == ("compact", "topic")
    assert shown["segment.ms"] == ("60000", "topic")

    # A bad value or an unknown name changes nothing; APPEND to a non-list is refused.
    for entry in (
        ConfigEntry("segment.ms", "-5", incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("no.such.config", "1", incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("segment.ms", "1", incremental_operation=AlterConfigOpType.APPEND),
    ):
        assert _error_code(alter(entry)) == INVALID_CONFIG
    assert _cli_configs(cluster, topic) == shown


async def test_alter_of_a_missing_topic_and_of_a_broker(bootstrap: str) -> None:
    address = bootstrap.split(",", maxsplit=1)[0]
    body = {"resources": [
        {"resource_type": 2, "resource_name": new_topic(),
         "configs": [{"name": "segment.ms", "config_operation": 0, "value": "1000"}]},
        {"resource_type": 4, "resource_name": "1",
         "configs": [{"name": "log.retention.ms", "config_operation": 0, "value": "1"}]},
    ], "validate_only": False}  # fmt: skip
    answer = await kafka_call(address, INCREMENTAL_ALTER_CONFIGS, 1, body)
    codes = [r["error_code"] for r in answer["responses"]]
    assert codes == [UNKNOWN_TOPIC_OR_PARTITION, INVALID_REQUEST]


async def test_create_topics_answers_the_configs_and_validates_only(bootstrap: str) -> None:
    address = bootstrap.split(",", maxsplit=1)[0]

    def body(topic: str, configs: dict[str, str], validate_only: bool) -> dict[str, object]:
        return {"topics": [{"name": topic, "num_partitions": 1, "replication_factor": -1,
                            "assignments": [],
                            "configs": [{"name": k, "value": v} for k, v in configs.items()]}],
                "timeout_ms": 30_000, "validate_only": validate_only}  # fmt: skip

    topic = new_topic()
    bad_quorums = {"bookline.ensemble.size": "2", "bookline.write.quorum": "3"}
    answer = await kafka_call(address, CREATE_TOPICS, 5, body(topic, bad_quorums, True))
    assert answer["topics"][0]["error_code"] == INVALID_CONFIG
    answer = await kafka_call(address, CREATE_TOPICS, 5, body(topic, {"segment.ms": "9"}, True))
    assert answer["topics"][0]["error_code"] == 0
    answer = await kafka_call(address, CREATE_TOPICS, 5, body(topic, {"segment.ms": "9"}, False))
    created = answer["topics"][0]
    assert created["error_code"] == 0  # not created by validate_only before
    shown = {c["name"]: (c["value"], c["config_source"]) for c in created["configs"]}
    assert shown["segment.ms"] == ("9", DYNAMIC_TOPIC_CONFIG)
    assert shown["cleanup.policy"] == ("delete", DEFAULT_CONFIG)


def test_kafka_python_describes_topic_and_broker_configs(bootstrap: str) -> None:
    from confluent_kafka.admin import NewTopic  # type: ignore[attr-defined]
    from kafka.admin import ConfigResource, ConfigResourceType, KafkaAdminClient

    topic = new_topic()
    creator = _admin(bootstrap)
    futures = creator.create_topics([NewTopic(topic, 1, config={"segment.ms": "5000"})])
    futures[topic].result(TIMEOUT_S)
    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30_000)
    try:
        resource = ConfigResource(ConfigResourceType.TOPIC, topic)
        every = admin.describe_configs([resource], include_synonyms=True, config_filter="all")
        entries = every["topic"][topic]
        assert entries["segment.ms"]["value"] == "5000"
        assert entries["segment.ms"]["config_source"] == "DYNAMIC_TOPIC_CONFIG"
        assert entries["cleanup.policy"]["config_source"] == "DEFAULT_CONFIG"
        modified = admin.describe_configs([resource])  # kafka-python's default filter
        assert set(modified["topic"][topic]) == {"segment.ms"}
        broker = admin.describe_cluster()["brokers"][0]["broker_id"]
        brokers = admin.describe_configs([ConfigResource(ConfigResourceType.BROKER, broker)])
        assert brokers["broker"] == {str(broker): {}}
    finally:
        admin.close()
