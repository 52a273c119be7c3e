"""TLS on the Kafka listeners from the proxies' ``[tls]`` settings (``bookline local
--tls``): librdkafka produces and consumes over SSL, verifying the cluster's CA and the
host name; a plain-text client gets no answer."""

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
from tests.cluster_support import cluster_doc, started_cluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with started_cluster(
        tmp_path_factory.mktemp("kafka-tls"), bookies=3, write_proxies=1, tls=True, kafka=True
    ) as c:
        yield c


def _roundtrip(bootstrap: str, ca_file: str) -> tuple[bytes | None, bytes | None]:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    conf: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "security.protocol": "SSL",
        "ssl.ca.location": ca_file,
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


async def test_librdkafka_over_tls(cluster: LocalCluster) -> None:
    doc: dict[str, Any] = cluster_doc(cluster.dir / "cluster.json")
    ca_file = str(cluster.dir / doc["tls"]["ca_file"])
    got = await asyncio.to_thread(_roundtrip, str(doc["kafka_bootstrap"]), ca_file)
    assert got == (b"k", b"secret")


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
