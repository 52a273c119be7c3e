"""SASL/PLAIN and OAUTHBEARER on the Kafka listener of a cluster with auth on
(``bookline local``'s default): username = principal, password = a Bookline token, or
the token as OAUTHBEARER's bearer token; grants per topic prefix as on HTTP; no API
but ApiVersions and SASL's before authenticating; a wrong password or token gets
SASL_AUTHENTICATION_FAILED and a closed connection."""

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


# -- SASL/OAUTHBEARER: the Bookline token as the bearer token ------------------------------


def _oauth(tok: str, authzid: str = "") -> bytes:
    """RFC 7628's client initial response carrying ``tok``."""
    header = f"n,a={authzid}," if authzid else "n,,"
    return f"{header}\x01auth=Bearer {tok}\x01\x01".encode()


async def _oauth_answer(bootstrap: str, auth_bytes: bytes) -> tuple[dict[str, Any], bool]:
    """SaslAuthenticate's answer to ``auth_bytes`` after an OAUTHBEARER handshake, and
    whether the connection was closed after it."""
    conn = await _connect(bootstrap)
    try:
        shake = await conn.call(SASL_HANDSHAKE, 1, {"mechanism": "OAUTHBEARER"})
        assert shake["error_code"] == 0 and "OAUTHBEARER" in shake["mechanisms"], shake
        answer = await conn.call(SASL_AUTHENTICATE, 1, {"auth_bytes": auth_bytes})
        if answer["error_code"] != 0:
            return answer, await conn.closed()
        metadata = await conn.call(METADATA, 9, {"topics": None})  # authenticated: served
        assert "brokers" in metadata
        return answer, False
    finally:
        conn.writer.close()


async def test_oauthbearer_takes_the_tokens_principal_and_life(
    cluster: LocalCluster, bootstrap: str
) -> None:
    secret = cluster_secret(cluster)
    answer, closed = await _oauth_answer(bootstrap, _oauth(token(secret, "alice", 600)))
    assert answer["error_code"] == 0 and not closed
    assert 0 < answer["session_lifetime_ms"] <= 600_000
    # An authzid, when given, must be the token's principal.
    answer, closed = await _oauth_answer(bootstrap, _oauth(token(secret, "alice"), "alice"))
    assert answer["error_code"] == 0
    # KIP-342's extensions (key=value pairs after auth) are ignored.
    extended = f"n,,\x01auth=Bearer {token(secret, 'alice')}\x01traceId=abc\x01\x01".encode()
    answer, closed = await _oauth_answer(bootstrap, extended)
    assert answer["error_code"] == 0


async def test_a_wrong_or_expired_oauth_token_is_refused_and_closed(
    cluster: LocalCluster, bootstrap: str
) -> None:
    secret = cluster_secret(cluster)
    refused = {
        "forged": _oauth(token(b"not the cluster's secret" * 2, "alice")),
        "expired": _oauth(token(secret, "alice", -60)),
        "other authzid": _oauth(token(secret, "bob"), "alice"),
        "no bearer": b"n,,\x01auth=Basic abc\x01\x01",
        "no terminator": _oauth(token(secret, "alice"))[:-1],
        "channel binding": b"p=tls-unique,," + _oauth(token(secret, "alice"))[3:],
    }
    for what, auth_bytes in refused.items():
        answer, closed = await _oauth_answer(bootstrap, auth_bytes)
        assert (answer["error_code"], closed) == (58, True), what  # SASL_AUTHENTICATION_FAILED


def _oauth_conf(bootstrap: str, tok: str) -> dict[str, Any]:
    def oauth_cb(_config: str) -> tuple[str, float]:
        from foundation.auth import token_expiry

        expiry = token_expiry(tok)
        return tok, float(expiry if expiry is not None else 0)

    return {
        "bootstrap.servers": bootstrap,
        "security.protocol": "SASL_PLAINTEXT",
        "sasl.mechanisms": "OAUTHBEARER",
        "oauth_cb": oauth_cb,
    }


def _oauth_roundtrip(bootstrap: str, admin_token: str, alice_token: str) -> tuple[Any, ...]:
    """confluent-kafka (librdkafka) with an ``oauth_cb`` returning the Bookline token:
    create, produce and consume as alice; a forged token's producer fails."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    topic = f"app-{uuid.uuid4().hex[:6]}"
    admin = AdminClient(_oauth_conf(bootstrap, admin_token))
    admin.create_topics([NewTopic(topic, 1)])[topic].result(60)
    producer = Producer(_oauth_conf(bootstrap, alice_token) | {"acks": "all"})
    delivered: list[Any] = []
    producer.produce(topic, b"over oauth", key=b"k", on_delivery=lambda e, m: delivered.append(e))
    producer.flush(60)
    consumer = Consumer(_oauth_conf(bootstrap, alice_token) | {"group.id": "app-oauth"})
    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        msg = None
        for _ in range(120):
            msg = consumer.poll(0.5)
            if msg is not None:
                break
        assert msg is not None and msg.error() is None, msg
        got = (msg.key(), msg.value())
    finally:
        consumer.close()
    errors: list[Any] = []
    forged = token(b"not the cluster's secret" * 2, "alice")
    bad = Producer(_oauth_conf(bootstrap, forged) | {"error_cb": errors.append})
    bad.produce(topic, b"never", on_delivery=lambda e, m: errors.append(e))
    for _ in range(120):
        bad.poll(0.5)
        if errors:
            break
    bad.purge()
    bad.flush(5)
    return delivered, got, errors[0].name() if errors else "no error"


async def test_confluent_kafka_authenticates_with_oauthbearer(
    cluster: LocalCluster, bootstrap: str
) -> None:
    secret = cluster_secret(cluster)
    delivered, got, refused = await asyncio.to_thread(
        _oauth_roundtrip, bootstrap, token(secret, "admin"), token(secret, "alice")
    )
    assert delivered == [None]
    assert got == (b"k", b"over oauth")
    assert refused == "_AUTHENTICATION"


async def test_aiokafka_authenticates_with_oauthbearer(
    cluster: LocalCluster, bootstrap: str
) -> None:
    from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
    from aiokafka.abc import AbstractTokenProvider
    from aiokafka.errors import KafkaConnectionError
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    secret = cluster_secret(cluster)

    class Tokens(AbstractTokenProvider):  # type: ignore[misc]
        def __init__(self, tok: str) -> None:
            self.tok = tok

        async def token(self) -> str:
            return self.tok

    def oauth(tok: str) -> dict[str, Any]:
        return {
            "bootstrap_servers": bootstrap,
            "security_protocol": "SASL_PLAINTEXT",
            "sasl_mechanism": "OAUTHBEARER",
            "sasl_oauth_token_provider": Tokens(tok),
        }

    topic = f"app-{uuid.uuid4().hex[:6]}"
    admin = AdminClient(_oauth_conf(bootstrap, token(secret, "admin")))
    await asyncio.to_thread(admin.create_topics([NewTopic(topic, 1)])[topic].result, 60)
    producer = AIOKafkaProducer(**oauth(token(secret, "alice")), acks="all")
    await producer.start()
    try:
        sent = await producer.send_and_wait(topic, b"aio oauth", key=b"k")
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(**oauth(token(secret, "alice")), auto_offset_reset="earliest")
    await consumer.start()
    try:
        consumer.assign([TopicPartition(topic, 0)])
        msg = await asyncio.wait_for(consumer.getone(), 60)
    finally:
        await consumer.stop()
    assert (msg.offset, msg.key, msg.value) == (sent.offset, b"k", b"aio oauth")
    forged = AIOKafkaProducer(**oauth(token(b"not the cluster's secret" * 2, "alice")))
    with pytest.raises(KafkaConnectionError):
        await forged.start()
    await forged.stop()


def _consumer_protocol_as_alice(bootstrap: str, admin_token: str, alice_token: str) -> Any:
    """A librdkafka member of KIP-848's consumer protocol, authenticated with
    OAUTHBEARER: subscribed in a group alice may consume, it reads her record; in a
    group she may not, it is refused."""
    from confluent_kafka import Consumer, Producer
    from confluent_kafka.admin import AdminClient, NewTopic  # type: ignore[attr-defined]

    topic = f"app-{uuid.uuid4().hex[:6]}"
    admin = AdminClient(_oauth_conf(bootstrap, admin_token))
    admin.create_topics([NewTopic(topic, 2)])[topic].result(60)
    producer = Producer(_oauth_conf(bootstrap, alice_token))
    producer.produce(topic, b"kip-848", key=b"k")
    producer.flush(60)
    out: dict[str, Any] = {}
    for group in (f"app-{uuid.uuid4().hex[:6]}", f"other-{uuid.uuid4().hex[:6]}"):
        member = {"group.id": group, "group.protocol": "consumer", "auto.offset.reset": "earliest"}
        consumer = Consumer(_oauth_conf(bootstrap, alice_token) | member)
        try:
            consumer.subscribe([topic])
            for _ in range(240):
                msg = consumer.poll(0.5)
                if msg is not None:
                    error = msg.error()
                    out[group[:3]] = msg.value() if error is None else str(error.code())
                    break
        finally:
            consumer.close()
    return out


async def test_a_consumer_protocol_member_follows_the_group_grants(
    cluster: LocalCluster, bootstrap: str
) -> None:
    from confluent_kafka import KafkaError

    secret = cluster_secret(cluster)
    out = await asyncio.to_thread(
        _consumer_protocol_as_alice, bootstrap, token(secret, "admin"), token(secret, "alice")
    )
    assert out == {"app": b"kip-848", "oth": str(KafkaError.GROUP_AUTHORIZATION_FAILED)}
