"""The Kafka listener's connection rules without a cluster behind it: ApiVersions
answered (also at an unknown version), garbage closing the connection. With a real
cluster and real clients: tests/test_kafka_serving.py."""

from __future__ import annotations

import asyncio
import struct
from collections.abc import AsyncIterator
from typing import Any

import pytest

from foundation.errors import UnavailableError
from kafkaapi.context import KafkaServing, Session
from kafkaapi.listener import HANDLERS, KafkaListener
from kafkaapi.protocol.apis_cluster import API_VERSIONS
from kafkaapi.protocol.frames import frame
from kafkaapi.protocol.messages import decode_response, encode_request


def _serving() -> KafkaServing:
    """A listener's serving side before its proxy started: every core call raises
    UNAVAILABLE, so only what needs no core answers."""

    def starting() -> Any:
        raise UnavailableError("proxy is starting")

    return KafkaServing("wp-1", 1, ns=starting, pages=starting, write=None, authority=None)


@pytest.fixture
async def bootstrap() -> AsyncIterator[str]:
    listener = KafkaListener(_serving())
    port = await listener.start("127.0.0.1", 0)
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await listener.stop()


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
        assert {k["api_key"] for k in body["api_keys"]} == set(HANDLERS)
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


async def test_a_request_while_the_proxy_starts_closes_only_its_connection(bootstrap: str) -> None:
    from kafkaapi.protocol.apis_cluster import METADATA

    host, port = bootstrap.split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(frame(encode_request(METADATA, 9, 1, "t", {"topics": None})))
        await writer.drain()
        assert await reader.read() == b""
    finally:
        writer.close()
    # The listener still answers.
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(frame(encode_request(API_VERSIONS, 3, 2, "t", {})))
        await writer.drain()
        size = struct.unpack(">i", await reader.readexactly(4))[0]
        assert decode_response(API_VERSIONS, 3, await reader.readexactly(size))[0] == 2
    finally:
        writer.close()


def test_docs_table_of_served_apis_matches_the_handlers() -> None:
    """docs/kafka.md's "What is served" table is the listener's, row for row."""
    from pathlib import Path

    text = (Path(__file__).parent.parent / "docs" / "kafka.md").read_text()
    served = text.split("## What is served", 1)[1].split("How Kafka's model", 1)[0]
    rows = {line for line in served.splitlines() if line.startswith("| ") and "---" not in line}
    expected = {
        f"| {row.api.name} | {key} | {row.versions[0]}-{row.versions[1]} |"
        for key, row in HANDLERS.items()
    }
    assert rows - {"| API | key | versions served |"} == expected


def test_bookline_local_turns_the_listeners_on(tmp_path: Any) -> None:
    """`bookline local`'s cluster has a Kafka listener in every proxy (cluster.json then
    names them in "kafka_bootstrap": tests/test_kafka_serving.py)."""
    import argparse

    from ops.cluster.supervisor import _cluster_from_args, add_cluster_flags

    parser = argparse.ArgumentParser()
    parser.add_argument("--dir")  # the command's own flag, beside the cluster's
    add_cluster_flags(parser)
    args = parser.parse_args(["--dir", str(tmp_path)])
    assert _cluster_from_args(args).with_kafka


async def test_big_frames_wait_for_the_listeners_buffer_budget() -> None:
    """A frame's declared size is reserved from the listener-wide budget before its body
    is read: while one connection holds all of it, another's big request waits (memory
    stays bounded however many connections send big frames), and is answered once the
    first connection goes."""
    from kafkaapi.listener import ListenerLimits
    from tests.waiting import wait_for

    limit = 1 << 20
    listener = KafkaListener(
        _serving(), ListenerLimits(frame_bytes_max=limit, buffered_bytes_max=limit)
    )
    port = await listener.start("127.0.0.1", 0)
    try:
        _, hog = await asyncio.open_connection("127.0.0.1", port)
        hog.write(struct.pack(">i", limit - 4) + b"\0" * 100)  # a whole budget's frame, begun
        await hog.drain()
        await wait_for(lambda: listener.free_bytes == 0, "the big frame's reservation")
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        # Big too: an ApiVersions request padded (bytes after a body are ignored).
        writer.write(frame(encode_request(API_VERSIONS, 3, 9, "t", {}) + b"\0" * (200 << 10)))
        await writer.drain()
        answer = asyncio.create_task(reader.readexactly(4))
        await asyncio.sleep(0.5)  # the behaviour under test: no answer meanwhile
        assert not answer.done()
        hog.close()
        size = struct.unpack(">i", await asyncio.wait_for(answer, 30))[0]
        assert decode_response(API_VERSIONS, 3, await reader.readexactly(size))[0] == 9
        writer.close()
        await wait_for(lambda: listener.free_bytes == limit, "every reservation given back")
    finally:
        await listener.stop()


async def test_a_heartbeat_of_a_member_joined_elsewhere_asks_it_to_join_again() -> None:
    """A member whose JoinGroup went to another proxy (the coordinator moved): this one
    does not know it (the classic group's state is not logged), and answers
    UNKNOWN_MEMBER_ID, so the client joins again here instead of reading on."""
    from kafkaapi.membership import heartbeat
    from kafkaapi.protocol.apis_groups import HEARTBEAT
    from kafkaapi.protocol.messages import decode_request

    class Coordinator:
        usable = True
        state = type("State", (), {"members": {}})()

    class Groups:
        async def coordinator(self, group: str, *, create: bool = False) -> Coordinator:
            return Coordinator()

    serving = _serving()
    serving.groups = Groups()  # type: ignore[assignment]
    body = {"group_id": "g", "generation_id": 1, "member_id": "m-1"}
    request = decode_request(encode_request(HEARTBEAT, 1, 1, "t", body))
    answer = await heartbeat(serving, Session("peer"), request)
    assert answer["error_code"] == 25  # UNKNOWN_MEMBER_ID
