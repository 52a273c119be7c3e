"""TLS on the Kafka listeners from the proxies' ``[tls]`` settings (``bookline local
--tls``): librdkafka produces and consumes over SSL, verifying the cluster's CA and the
host name; a plain-text client gets no answer. With auth on as well (SASL_SSL: PLAIN
over TLS), kafka-python, aiokafka and librdkafka produce and consume."""

from __future__ import annotations

import asyncio
import struct
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from kafkaapi.protocol.apis_cluster import API_VERSIONS
from kafkaapi.protocol.frames import frame
from kafkaapi.protocol.messages import encode_request
from ops.cluster.local import LocalCluster
from tests.cluster_support import cluster_doc, cluster_secret, started_cluster, token


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with started_cluster(
        tmp_path_factory.mktemp("kafka-tls"),
        bookies=3,
        write_proxies=1,
        tls=True,
        kafka=True,
        auth=True,
    ) as c:
        yield c


def _roundtrip(bootstrap: str, ca_file: str, admin_token: str) -> tuple[bytes | None, bytes | None]:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    conf: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "security.protocol": "SASL_SSL",
        "ssl.ca.location": ca_file,
        "sasl.mechanisms": "PLAIN",
        "sasl.username": "admin",
        "sasl.password": admin_token,
    }
    topic = f"tls-{uuid.uuid4().hex[:8]}"
    admin = AdminClient(conf)  # kept while its futures run
    for future in admin.create_topics([NewTopic(topic, 1)]).values():
        future.result(60)
    producer = Producer(conf | {"acks": "all"})
    producer.produce(topic, b"secret", key=b"k")
    assert producer.flush(60) == 0
    consumer = Consumer(conf | {"group.id": f"g-{topic}", "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        for _ in range(120):
            msg = consumer.poll(0.5)
            if msg is not None:
                assert msg.error() is None, msg.error()
                return msg.key(), msg.value()
        return None, None
    finally:
        consumer.close()


def _tls_and_token(cluster: LocalCluster) -> tuple[str, str, str]:
    doc: dict[str, Any] = cluster_doc(cluster.dir / "cluster.json")
    admin = token(cluster_secret(cluster), "admin")
    return str(doc["kafka_bootstrap"]), str(cluster.dir / doc["tls"]["ca_file"]), admin


async def test_librdkafka_over_tls(cluster: LocalCluster) -> None:
    got = await asyncio.to_thread(_roundtrip, *_tls_and_token(cluster))
    assert got == (b"k", b"secret")


def _kafka_python_roundtrip(bootstrap: str, ca_file: str, admin: str) -> tuple[Any, Any]:
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition
    from kafka.admin import KafkaAdminClient, NewTopic

    conf: dict[str, Any] = {
        "bootstrap_servers": bootstrap,
        "security_protocol": "SASL_SSL",
        "ssl_cafile": ca_file,
        "sasl_mechanism": "PLAIN",
        "sasl_plain_username": "admin",
        "sasl_plain_password": admin,
    }
    topic = f"tls-{uuid.uuid4().hex[:8]}"
    admin_client = KafkaAdminClient(**conf)
    try:
        admin_client.create_topics([NewTopic(topic, 1, 1)])
    finally:
        admin_client.close()
    producer = KafkaProducer(acks="all", **conf)
    try:
        producer.send(topic, b"secret", key=b"k").get(timeout=60)
    finally:
        producer.close()
    consumer = KafkaConsumer(enable_auto_commit=False, group_id=None, **conf)
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        for _ in range(120):
            for records in consumer.poll(timeout_ms=500).values():
                return records[0].key, records[0].value
        return None, None
    finally:
        consumer.close()


async def _aiokafka_roundtrip(bootstrap: str, ca_file: str, admin: str) -> tuple[Any, Any]:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
    from aiokafka.admin import AIOKafkaAdminClient, NewTopic
    from aiokafka.helpers import create_ssl_context

    conf: dict[str, Any] = {
        "bootstrap_servers": bootstrap,
        "security_protocol": "SASL_SSL",
        "ssl_context": create_ssl_context(cafile=ca_file),
        "sasl_mechanism": "PLAIN",
        "sasl_plain_username": "admin",
        "sasl_plain_password": admin,
    }
    topic = f"tls-{uuid.uuid4().hex[:8]}"
    admin_client = AIOKafkaAdminClient(**conf)
    await admin_client.start()
    try:
        await admin_client.create_topics([NewTopic(topic, 1, 1)])
    finally:
        await admin_client.close()
    producer = AIOKafkaProducer(acks="all", **conf)
    await producer.start()
    try:
        await producer.send_and_wait(topic, b"secret", key=b"k")
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(enable_auto_commit=False, **conf)
    await consumer.start()
    try:
        tp = TopicPartition(topic, 0)
        consumer.assign([tp])
        await consumer.seek_to_beginning(tp)
        record = await asyncio.wait_for(consumer.getone(), 60)
        return record.key, record.value
    finally:
        await consumer.stop()


async def test_kafka_python_and_aiokafka_over_sasl_ssl(cluster: LocalCluster) -> None:
    args = _tls_and_token(cluster)
    assert await asyncio.to_thread(_kafka_python_roundtrip, *args) == (b"k", b"secret")
    assert await _aiokafka_roundtrip(*args) == (b"k", b"secret")


async def test_plain_text_gets_no_kafka_answer(cluster: LocalCluster) -> None:
    doc = cluster_doc(cluster.dir / "cluster.json")
    host, port = str(doc["kafka_bootstrap"]).split(",", maxsplit=1)[0].rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(frame(encode_request(API_VERSIONS, 3, 1, "t", {})))
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(4), 30)
        # No Kafka frame: a TLS alert, or the connection closed.
        assert answer == b"" or struct.unpack(">i", answer.ljust(4, b"\0"))[0] > 1 << 24
    finally:
        writer.close()
