"""Topic configs by Kafka's names through the write proxies as real processes (issue
24, 5): the HTTP API (create body ``configs``, ``PATCH /v1/topics/{t}/configs``, every
effective config and its source in a topic answer), the thin client, refused names and
values answered with their stable codes and nothing changed, and max.message.bytes
refusing an oversized record written through a proxy."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from foundation.errors import InvalidConfigError, TooLargeError, UnknownConfigError
from metadata.topic_configs import CONFIGS
from ops.cluster.local import LocalCluster
from tests.waiting import wait_for
from thinclient.client import ProxyClient, SyncProxyClient

pytestmark = pytest.mark.integration


def _uid() -> str:
    return uuid.uuid4().hex[:8]


def _wurls(cluster: LocalCluster) -> list[str]:
    return [p.extra["url"] for p in cluster.write_proxies]


@pytest.fixture
async def client(proxy_cluster: LocalCluster) -> AsyncIterator[ProxyClient]:
    async with ProxyClient(write_urls=_wurls(proxy_cluster)) as c:
        yield c


async def _http(
    method: str, url: str, body: dict[str, Any] | None = None
) -> tuple[int, dict[str, Any]]:
    async with (
        aiohttp.ClientSession() as session,
        session.request(method, url, json=body) as resp,
    ):
        return resp.status, await resp.json()


def _by_name(configs: list[dict[str, str]]) -> dict[str, tuple[str, str]]:
    return {c["name"]: (c["value"], c["source"]) for c in configs}


async def test_configs_over_http(proxy_cluster: LocalCluster) -> None:
    base = _wurls(proxy_cluster)[0] + "/v1"
    t = f"cfg-{_uid()}"
    body = {"name": t, "partitions": 2, "retention_bytes": 5000,
            "configs": {"cleanup.policy": "compact,delete", "retention.ms": 60000,
                        "min.cleanable.dirty.ratio": "0.2"}}  # fmt: skip
    status, created = await _http("POST", f"{base}/topics", body)
    assert status == 201, created
    shown = _by_name(created["configs"])
    assert list(shown) == list(CONFIGS)
    assert shown["cleanup.policy"] == ("compact,delete", "topic")
    assert shown["retention.ms"] == ("60000", "topic")
    assert shown["retention.bytes"] == ("5000", "topic")  # the alias
    assert shown["min.cleanable.dirty.ratio"] == ("0.2", "topic")
    assert shown["delete.retention.ms"] == ("86400000", "default")
    assert shown["bookline.ensemble.size"][1] == "default"
    status, described = await _http("GET", f"{base}/topics/{t}")
    assert status == 200 and described["configs"] == created["configs"]

    change = {"configs": {"cleanup.policy": "delete", "retention.ms": None, "segment.ms": 9000}}
    status, altered = await _http("PATCH", f"{base}/topics/{t}/configs", change)
    assert status == 200, altered
    shown = _by_name(altered["configs"])
    assert shown["cleanup.policy"] == ("delete", "topic")
    assert shown["retention.ms"] == ("-1", "default")
    assert shown["segment.ms"] == ("9000", "topic")

    bad: list[tuple[str, str, dict[str, Any], int, int]] = [
        ("POST", "/topics", {"name": f"z-{t}", "partitions": 1, "configs": {"x.y": "1"}}, 400, 53),
        (
            "POST",
            "/topics",
            {"name": f"z-{t}", "partitions": 1, "configs": {"cleanup.policy": "keep"}},
            400,
            52,
        ),
        ("POST", "/topics", {"name": f"z-{t}", "partitions": 1, "configs": ["a"]}, 400, 2),
        ("PATCH", f"/topics/{t}/configs", {"configs": {"retention.msec": "1"}}, 400, 53),
        ("PATCH", f"/topics/{t}/configs", {"configs": {"segment.ms": "-1"}}, 400, 52),
        (
            "PATCH",
            f"/topics/{t}/configs",
            {"configs": {"bookline.write.quorum": "2", "bookline.ack.quorum": "3"}},
            400,
            52,
        ),
        ("PATCH", f"/topics/{t}/configs", {"partitions": 3}, 400, 2),
        ("PATCH", f"/topics/nope-{t}/configs", {"configs": {"segment.ms": "1"}}, 404, 17),
    ]
    for method, path, req, want_status, want_code in bad:
        status, answer = await _http(method, base + path, req)
        assert (status, answer.get("code")) == (want_status, want_code), (method, path, answer)
    _status, unknown = await _http("PATCH", f"{base}/topics/{t}/configs",
                                   {"configs": {"retention.msec": "1"}})  # fmt: skip
    assert all(name in unknown["message"] for name in CONFIGS)  # the known ones, listed
    _status, after = await _http("GET", f"{base}/topics/{t}")
    assert after == altered  # nothing changed
    assert f"z-{t}" not in (await _http("GET", f"{base}/topics"))[1]["topics"]
    assert (await _http("DELETE", f"{base}/topics/{t}"))[0] == 200


async def test_configs_through_the_thin_client(client: ProxyClient) -> None:
    t = f"cfgc-{_uid()}"
    record = await client.create_topic(t, 1, configs={"max.message.bytes": 1000})
    assert dict(record.configs) == {"max.message.bytes": "1000"}
    assert await client.send(t, b"x" * 1000) == (0, 0)
    with pytest.raises(TooLargeError) as caught:  # the partition's writer refuses it
        await client.send(t, b"x" * 1001)
    assert caught.value.code == 22
    assert await client.send(t, b"ok") == (0, 1)  # the partition goes on

    altered = await client.alter_configs(t, {"message.timestamp.type": "LogAppendTime"})
    assert altered.configs["message.timestamp.type"] == "LogAppendTime"
    configs = {c.name: (c.value, c.source) for c in await client.describe_configs(t)}
    assert configs["message.timestamp.type"] == ("LogAppendTime", "topic")
    assert configs["max.message.bytes"] == ("1000", "topic")
    info = await client.describe_topic(t)
    assert {c.name: (c.value, c.source) for c in info.configs} == configs
    with pytest.raises(UnknownConfigError):
        await client.alter_configs(t, {"max.messages.bytes": "5"})
    with pytest.raises(InvalidConfigError):
        await client.alter_configs(t, {"max.message.bytes": "-5"})
    back = await client.alter_configs(t, {}, delete=["max.message.bytes"])
    assert "max.message.bytes" not in back.configs
    await client.delete_topic(t)


def test_configs_through_the_sync_client(proxy_cluster: LocalCluster) -> None:
    t = f"cfgs-{_uid()}"
    with SyncProxyClient(write_urls=_wurls(proxy_cluster)) as client:
        created = client.create_topic(t, 1, configs={"cleanup.policy": "compact"})
        assert created.configs == {"cleanup.policy": "compact"}
        client.alter_configs(t, {"delete.retention.ms": 1000})
        configs = {c.name: c.value for c in client.describe_configs(t)}
        assert (configs["cleanup.policy"], configs["delete.retention.ms"]) == ("compact", "1000")
        client.delete_topic(t)


async def test_an_altered_limit_reaches_the_proxy_owning_the_partition(
    client: ProxyClient,
) -> None:
    """The write proxy owning a partition (its writer open) applies an alter made
    through any proxy: a record above the new max.message.bytes is refused (413)."""
    t = f"cfgl-{_uid()}"
    await client.create_topic(t, 1)
    assert await client.send(t, b"x" * 3000) == (0, 0)  # a proxy now owns partition 0
    await client.alter_configs(t, {"max.message.bytes": "2000"})

    async def refused() -> bool:
        try:
            await client.send(t, b"x" * 3000)
        except TooLargeError:
            return True
        return False

    await wait_for(refused, "the owning proxy refusing a record above the new limit")
    assert (await client.send(t, b"x" * 2000))[0] == 0
    await client.delete_topic(t)
