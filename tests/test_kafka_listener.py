"""The Kafka listener shell with real clients on 127.0.0.1: kafka-python's, aiokafka's
and confluent-kafka's (librdkafka's) admin clients list the topics it announces."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator

import pytest

from kafkaapi.listener import Broker, KafkaListener
from kafkaapi.protocol.apis_cluster import API_VERSIONS
from kafkaapi.protocol.frames import frame
from kafkaapi.protocol.messages import decode_response, encode_request

TOPICS = {"orders": 6, "audit": 1}


@pytest.fixture
async def bootstrap() -> AsyncIterator[str]:
    listener = KafkaListener(cluster_id="bookline-test", topics=TOPICS)
    port = await listener.start("127.0.0.1", 0)
    listener.announce([Broker(1, "127.0.0.1", port)])
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await listener.stop()


async def test_kafka_python_admin_lists_topics(bootstrap: str) -> None:
    from kafka.admin import KafkaAdminClient

    def list_topics() -> set[str]:
        admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=20000)
        try:
            return set(admin.list_topics())
        finally:
            admin.close()

    assert await asyncio.to_thread(list_topics) == set(TOPICS)


async def test_aiokafka_admin_lists_topics(bootstrap: str) -> None:
    from aiokafka.admin import AIOKafkaAdminClient

    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=20000)
    await admin.start()
    try:
        assert set(await admin.list_topics()) == set(TOPICS)
    finally:
        await admin.close()


async def test_confluent_kafka_admin_lists_topics(bootstrap: str) -> None:
    from confluent_kafka.admin import AdminClient

    def list_topics() -> dict[str, int]:
        admin = AdminClient({"bootstrap.servers": bootstrap})
        metadata = admin.list_topics(timeout=20)
        assert [b.id for b in metadata.brokers.values()] == [1]
        return {name: len(t.partitions) for name, t in metadata.topics.items()}

    assert await asyncio.to_thread(list_topics) == TOPICS


async def test_unknown_api_versions_version_gets_a_v0_answer(bootstrap: str) -> None:
    host, port = bootstrap.split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        request = struct.pack(">hhih", API_VERSIONS.key, 99, 5, -1)
        writer.write(frame(request))
        await writer.drain()
        size = struct.unpack(">i", await reader.readexactly(4))[0]
        correlation_id, body = decode_response(API_VERSIONS, 0, await reader.readexactly(size))
        assert (correlation_id, body["error_code"]) == (5, 35)
        assert {k["api_key"] for k in body["api_keys"]} == {18, 3}
        # Then the same connection speaks a version it offered.
        writer.write(frame(encode_request(API_VERSIONS, 3, 6, "t", {})))
        await writer.drain()
        size = struct.unpack(">i", await reader.readexactly(4))[0]
        correlation_id, body = decode_response(API_VERSIONS, 3, await reader.readexactly(size))
        assert (correlation_id, body["error_code"]) == (6, 0)
    finally:
        writer.close()


async def test_garbage_closes_the_connection(bootstrap: str) -> None:
    host, port = bootstrap.split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(struct.pack(">i", 1 << 30))  # a 1 GiB frame: refused at once
        await writer.drain()
        assert await reader.read() == b""
    finally:
        writer.close()
