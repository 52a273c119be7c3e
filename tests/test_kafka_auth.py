"""SASL/PLAIN on the Kafka listener of a cluster with auth on (``bookline local``'s
default): username = principal, password = a Bookline token; grants per topic prefix
as on HTTP; no API but ApiVersions and SASL's before authenticating; a wrong password
gets SASL_AUTHENTICATION_FAILED and a closed connection."""

from __future__ import annotations

import asyncio
import struct
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from kafkaapi.protocol.apis_cluster import METADATA, SASL_AUTHENTICATE, SASL_HANDSHAKE
from kafkaapi.protocol.frames import frame
from kafkaapi.protocol.messages import decode_response, encode_request
from ops.cluster.local import LocalCluster
from tests.cluster_support import cluster_doc, cluster_secret, started_cluster, token

GRANTS = """\
superusers = ["admin"]
[[grants]]
principal = "alice"
permission = "produce"
kind = "topic"
prefix = "app-"
[[grants]]
principal = "alice"
permission = "consume"
kind = "topic"
prefix = "app-"
[[grants]]
principal = "alice"
permission = "consume"
kind = "group"
prefix = "app-"
"""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    directory = tmp_path_factory.mktemp("kafka-auth-cluster")
    (directory / "auth").mkdir(mode=0o700)
    (directory / "auth" / "grants.toml").write_text(GRANTS)
    with started_cluster(directory, bookies=3, write_proxies=1, auth=True, kafka=True) as c:
        yield c


@pytest.fixture(scope="module")
def bootstrap(cluster: LocalCluster) -> str:
    return str(cluster_doc(cluster.dir / "cluster.json")["kafka_bootstrap"])


def _conf(bootstrap: str, user: str, password: str) -> dict[str, Any]:
    return {
        "bootstrap.servers": bootstrap,
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanisms": "PLAIN",
        "sasl.username": user,
        "sasl.password": password,
    }


class _Conn:
    """One raw connection: requests answered in order."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer, self.cid = reader, writer, 0

    async def call(self, api: Any, version: int, body: dict[str, Any]) -> dict[str, Any]:
        self.cid += 1
        self.writer.write(frame(encode_request(api, version, self.cid, "t", body)))
        await self.writer.drain()
        size = struct.unpack(">i", await self.reader.readexactly(4))[0]
        return decode_response(api, version, await self.reader.readexactly(size))[1]

    async def closed(self) -> bool:
        return await asyncio.wait_for(self.reader.read(), 30) == b""


async def _connect(bootstrap: str) -> _Conn:
    host, port = bootstrap.split(",", maxsplit=1)[0].rsplit(":", 1)
    return _Conn(*await asyncio.open_connection(host, int(port)))


async def test_requests_before_authenticating_close_the_connection(bootstrap: str) -> None:
    conn = await _connect(bootstrap)
    try:
        conn.writer.write(frame(encode_request(METADATA, 9, 1, "t", {"topics": None})))
        await conn.writer.drain()
        assert await conn.closed()
    finally:
        conn.writer.close()


async def test_a_wrong_password_is_refused_and_closed(
    cluster: LocalCluster, bootstrap: str
) -> None:
    forged = token(b"not the cluster's secret" * 2, "alice")
    conn = await _connect(bootstrap)
    try:
        assert (await conn.call(SASL_HANDSHAKE, 1, {"mechanism": "PLAIN"}))["error_code"] == 0
        answer = await conn.call(
            SASL_AUTHENTICATE, 1, {"auth_bytes": b"\0alice\0" + forged.encode()}
        )
        assert answer["error_code"] == 58  # SASL_AUTHENTICATION_FAILED
        assert await conn.closed()
    finally:
        conn.writer.close()
    # Another principal's valid token is no password for alice either.
    bobs = token(cluster_secret(cluster), "bob")
    conn = await _connect(bootstrap)
    try:
        await conn.call(SASL_HANDSHAKE, 1, {"mechanism": "PLAIN"})
        answer = await conn.call(SASL_AUTHENTICATE, 1, {"auth_bytes": b"\0alice\0" + bobs.encode()})
        assert answer["error_code"] == 58
    finally:
        conn.writer.close()


def _roundtrip(bootstrap: str, admin_token: str, alice_token: str) -> dict[str, Any]:
    from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    mine, other = f"app-{uuid.uuid4().hex[:6]}", f"other-{uuid.uuid4().hex[:6]}"
    admin = AdminClient(_conf(bootstrap, "admin", admin_token))
    for future in admin.create_topics([NewTopic(mine, 2), NewTopic(other, 1)]).values():
        future.result(60)
    producer = Producer(_conf(bootstrap, "alice", alice_token) | {"acks": "all"})
    results: dict[str, Any] = {}

    def report(err: Any, msg: Any) -> None:
        results[msg.topic()] = err if err is not None else (msg.partition(), msg.offset())

    producer.produce(mine, b"hello", key=b"k", on_delivery=report)
    producer.produce(other, b"nope", key=b"k", on_delivery=report)
    producer.flush(60)
    consumer = Consumer(_conf(bootstrap, "alice", alice_token) | {"group.id": "app-alice"})
    try:
        partition = results[mine][0]
        consumer.assign([TopicPartition(mine, partition, OFFSET_BEGINNING)])
        msg = None
        for _ in range(120):
            msg = consumer.poll(0.5)
            if msg is not None:
                break
        assert msg is not None and msg.error() is None, msg
        results["consumed"] = (msg.key(), msg.value())
    finally:
        consumer.close()
    results["other"] = results.pop(other)
    return results


async def test_alice_produces_and_consumes_only_where_granted(
    cluster: LocalCluster, bootstrap: str
) -> None:
    secret = cluster_secret(cluster)
    results = await asyncio.to_thread(
        _roundtrip, bootstrap, token(secret, "admin"), token(secret, "alice")
    )
    assert results["consumed"] == (b"k", b"hello")
    assert str(results["other"].name()) == "TOPIC_AUTHORIZATION_FAILED"


async def test_a_big_frame_before_authenticating_closes_the_connection(bootstrap: str) -> None:
    conn = await _connect(bootstrap)
    try:
        conn.writer.write(struct.pack(">i", 4 << 20) + b"\0" * 1024)  # 4 MiB declared
        await conn.writer.drain()
        assert await conn.closed()
    finally:
        conn.writer.close()


def _group_denied(bootstrap: str, alice_token: str) -> str:
    from confluent_kafka import Consumer

    consumer = Consumer(_conf(bootstrap, "alice", alice_token) | {"group.id": "other-group"})
    try:
        consumer.subscribe([f"app-{uuid.uuid4().hex[:6]}"])
        for _ in range(120):
            msg = consumer.poll(0.5)
            error = None if msg is None else msg.error()
            if error is not None:
                return str(error.name())
        return "no error"
    finally:
        consumer.close()


async def test_a_group_without_a_grant_is_refused(cluster: LocalCluster, bootstrap: str) -> None:
    alice = token(cluster_secret(cluster), "alice")
    assert await asyncio.to_thread(_group_denied, bootstrap, alice) == "GROUP_AUTHORIZATION_FAILED"


def _configs_as_alice(bootstrap: str, admin_token: str, alice_token: str) -> dict[str, Any]:
    """Alice (produce and consume on app-*) describes her topic's configs but may not
    alter them (admin); another prefix she may not even describe."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import (  # type: ignore[attr-defined]
        AdminClient,
        AlterConfigOpType,
        ConfigEntry,
        ConfigResource,
        NewTopic,
        ResourceType,
    )

    mine, other = f"app-{uuid.uuid4().hex[:6]}", f"other-{uuid.uuid4().hex[:6]}"
    admin = AdminClient(_conf(bootstrap, "admin", admin_token))
    topics = [NewTopic(t, 1, config={"segment.ms": "60000"}) for t in (mine, other)]
    for future in admin.create_topics(topics).values():
        future.result(60)
    alice = AdminClient(_conf(bootstrap, "alice", alice_token))
    out: dict[str, Any] = {}

    def outcome(future: Any) -> Any:
        try:
            return future.result(60)
        except KafkaException as exc:
            return str(exc.args[0].name())

    for name in (mine, other):
        resource = ConfigResource(ResourceType.TOPIC, name)
        described = outcome(alice.describe_configs([resource])[resource])
        out[f"describe {name[:3]}"] = (
            described if isinstance(described, str) else described["segment.ms"].value
        )
    entry = ConfigEntry("segment.ms", "1000", incremental_operation=AlterConfigOpType.SET)
    resource = ConfigResource(ResourceType.TOPIC, mine, incremental_configs=[entry])
    out["alter app"] = outcome(alice.incremental_alter_configs([resource])[resource])
    resource = ConfigResource(ResourceType.TOPIC, mine, incremental_configs=[entry])
    out["admin alter app"] = outcome(admin.incremental_alter_configs([resource])[resource])
    return out


async def test_config_apis_follow_the_grants(cluster: LocalCluster, bootstrap: str) -> None:
    secret = cluster_secret(cluster)
    out = await asyncio.to_thread(
        _configs_as_alice, bootstrap, token(secret, "admin"), token(secret, "alice")
    )
    assert out == {
        "describe app": "60000",
        "describe oth": "TOPIC_AUTHORIZATION_FAILED",
        "alter app": "TOPIC_AUTHORIZATION_FAILED",
        "admin alter app": None,
    }
