"""Group coordinators hosted by real write proxy processes (``proxy_cluster``: ZooKeeper,
3 bookies, 2 write proxies, 1 read proxy): the /v1/groups routes through the
CoordinatorClient, redirects to the coordinator, errors with their stable codes and
nothing changed, lag in the HTTP answer, the metrics and the CLI, and the coordinator's
proxy killed with kill -9 (last: it restarts the proxy)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import subprocess
import uuid
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from foundation.errors import (
    BadRequestError,
    GroupNotEmptyError,
    NotAssignedError,
    NotFoundError,
    OutOfRangeError,
    StaleGenerationError,
)
from foundation.names import partition_stream
from groups.assignors import TopicPartition
from groups.coordinator_client import CoordinatorClient, group_path
from groups.topics import TopicAdmin
from ops.cluster import procs
from ops.cluster.local import CLUSTER_ROOT, LocalCluster
from streams.namespace import Namespace
from streams.records import LogRecord
from tests.background import in_background
from tests.cli_support import run_cli
from thinclient.client import ClientConfig, ProxyClient

pytestmark = pytest.mark.integration

CLIENT_CONFIG = ClientConfig(proxy_down_ms=1_000, retry_deadline_ms=40_000)
SESSION_MS = 20_000  # members outlive a coordinator failover (4 s proxy sessions)
CLI_TIMEOUT_S = 60


def _uid() -> str:
    return uuid.uuid4().hex[:8]


def _wurls(cluster: LocalCluster) -> list[str]:
    return [p.extra["url"] for p in cluster.write_proxies]


@pytest.fixture
async def client(proxy_cluster: LocalCluster) -> AsyncIterator[ProxyClient]:
    c = ProxyClient(write_urls=_wurls(proxy_cluster), config=CLIENT_CONFIG)
    await c.start()
    try:
        yield c
    finally:
        await c.close()


@pytest.fixture
async def ns(proxy_cluster: LocalCluster) -> AsyncIterator[Namespace]:
    n = await Namespace.open(proxy_cluster.zk_connect, CLUSTER_ROOT, "default")
    try:
        yield n
    finally:
        await n.close()


async def _topic(ns: Namespace, counts: list[int]) -> str:
    """A new topic with ``counts[p]`` records in partition p."""
    topic = f"t-{_uid()}"
    await TopicAdmin(ns).create_topic(topic, len(counts))
    for p, n in enumerate(counts):
        writer = await ns.open_writer(partition_stream(topic, p))
        try:
            await writer.write_many([LogRecord(b"x%d" % i) for i in range(n)])
        finally:
            await writer.close()
    return topic


async def _metric(url: str, name: str, labels: dict[str, str]) -> float | None:
    async with aiohttp.ClientSession() as session, session.get(f"{url}/metrics") as resp:
        text = await resp.text()
    for m in re.finditer(rf"^{re.escape(name)}\{{([^}}]*)\}} ([0-9.e+-]+)$", text, re.M):
        got = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        if all(got.get(k) == v for k, v in labels.items()):
            return float(m.group(2))
    return None


async def _cli(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    file = cluster.dir / "cluster.json"
    return await asyncio.to_thread(run_cli, "group", *args, cluster=file, timeout_s=CLI_TIMEOUT_S)


@contextlib.asynccontextmanager
async def _alive(cc: CoordinatorClient, group: str, member: Any) -> AsyncIterator[None]:
    """Heartbeats for ``member`` every heartbeat interval, as its consumer would: the
    steps of a test (CLI processes among them) can outlast a session on a loaded
    machine. A heartbeat that fails is raised when the block ends."""

    async def beat() -> None:
        while True:
            await asyncio.sleep(member.heartbeat_interval_ms / 1000)  # the member's period
            await cc.heartbeat(group, member.member_id, member.generation, member.assignment)

    async with in_background(beat()):
        yield


def _lags(d: dict[str, Any]) -> dict[TopicPartition, int]:
    return {(p["topic"], p["partition"]): p["lag"] for p in d["partitions"]}


async def test_group_routes_errors_lag_metrics_and_cli(
    proxy_cluster: LocalCluster, client: ProxyClient, ns: Namespace
) -> None:
    cc = CoordinatorClient.of(client)
    topic = await _topic(ns, [10, 4])
    g = f"g-{_uid()}"
    a = await cc.join(g, [topic], session_timeout_ms=SESSION_MS)
    assert a.assignment == {(topic, 0), (topic, 1)} and a.heartbeat_interval_ms == SESSION_MS // 3
    await cc.heartbeat(g, a.member_id, a.generation, a.assignment)
    async with _alive(cc, g, a):
        # Lag before consumption: HTTP, metrics (on the coordinator's proxy), CLI.
        d = await cc.describe(g)
        coordinator = d["coordinator"]
        assert coordinator in _wurls(proxy_cluster) and d["generation"] == a.generation
        assert _lags(d) == {(topic, 0): 10, (topic, 1): 4} and d["lag"] == 14
        lag0 = {"group": g, "topic": topic, "partition": "0"}
        assert await _metric(coordinator, "bookline_group_lag_records", lag0) == 10
        assert await _metric(coordinator, "bookline_group_members", {"group": g}) == 1
        assert await _metric(coordinator, "bookline_group_generation", {"group": g}) == a.generation
        rebalances = await _metric(coordinator, "bookline_group_rebalances_total", {"group": g})
        assert rebalances is not None
        other = next(u for u in _wurls(proxy_cluster) if u != coordinator)
        assert await _metric(other, "bookline_group_members", {"group": g}) is None

        # ... and after: a commit moves every view.
        await cc.commit(g, a.member_id, a.generation, {(topic, 0): 7, (topic, 1): 4})
        d = await cc.describe(g)
        assert _lags(d) == {(topic, 0): 3, (topic, 1): 0} and d["lag"] == 3
        assert await _metric(coordinator, "bookline_group_lag_records", lag0) == 3
        assert await cc.offsets(g) == {(topic, 0): 7, (topic, 1): 4}
        run = await _cli(proxy_cluster, "describe", g, "--json")
        assert run.returncode == 0, run.stderr
        assert json.loads(run.stdout)["lag"] == 3
        run = await _cli(proxy_cluster, "describe", g)
        assert run.returncode == 0 and g in run.stdout and "LAG" in run.stdout, run.stderr

        # Bad input: a clear error with its stable code, nothing changed.
        with pytest.raises(BadRequestError, match="unknown assignor 'nope'"):
            await cc.join(f"new-{g}", [topic], assignor="nope")
        with pytest.raises(BadRequestError, match="unknown assignor"):
            await cc.join(g, [topic], assignor="nope")
        with pytest.raises(OutOfRangeError, match="end offset 10"):
            await cc.commit(g, a.member_id, a.generation, {(topic, 0): 11})
        with pytest.raises(NotAssignedError):
            await cc.commit(g, a.member_id, a.generation, {("elsewhere", 0): 1})
        with pytest.raises(StaleGenerationError):
            await cc.heartbeat(g, a.member_id, a.generation - 1, a.assignment)
        with pytest.raises(GroupNotEmptyError):
            await cc.reset_offsets(g, "earliest")
        run = await _cli(proxy_cluster, "reset-offsets", g, "--to-earliest")
        assert run.returncode == 1 and "GROUP_NOT_EMPTY (46)" in run.stderr
        with pytest.raises(GroupNotEmptyError):
            await cc.delete(g)
        assert f"new-{g}" not in await cc.list_groups()
        assert await cc.offsets(g) == {(topic, 0): 7, (topic, 1): 4}
        assert (await cc.describe(g))["generation"] == a.generation

        # The other proxy redirects to the coordinator; bodies are validated strictly.
        async with aiohttp.ClientSession() as session:
            url = other + group_path(g, "/join")
            async with session.post(url, json={"topics": [topic]}, allow_redirects=False) as resp:
                assert resp.status == 307 and resp.headers["Location"].startswith(coordinator)
            url = coordinator + group_path(g, "/join")
            async with session.post(url, json={"topics": [topic], "colour": "red"}) as resp:
                body = await resp.json()
                assert resp.status == 400 and body["code"] == 2 and "colour" in body["message"]

    # Without members: reset (CLI and client), list, delete.
    await cc.leave(g, a.member_id)
    # A plan by default (nothing changes); --execute applies it; past the end clamps.
    run = await _cli(proxy_cluster, "reset-offsets", g, "--to-offset", "5")
    assert run.returncode == 0 and "add --execute to apply" in run.stdout, run.stderr
    assert "clamped to the end 4" in run.stdout
    assert await cc.offsets(g) == {(topic, 0): 7, (topic, 1): 4}
    run = await _cli(proxy_cluster, "reset-offsets", g, "--to-offset", "5", "--execute", "--json")
    assert run.returncode == 0, run.stderr
    answer = json.loads(run.stdout)
    assert answer["executed"] and [o["clamped"] for o in answer["offsets"]] == [False, True]
    assert await cc.offsets(g) == {(topic, 0): 5, (topic, 1): 4}
    run = await _cli(proxy_cluster, "reset-offsets", g, "--to-offset", "2", "--execute", "--json")
    assert run.returncode == 0, run.stderr
    assert [o["offset"] for o in json.loads(run.stdout)["offsets"]] == [2, 2]
    # A dry run for a group that does not exist yet shows the plan and creates nothing.
    run = await _cli(
        proxy_cluster, "reset-offsets", f"plan-{g}", "--topic", topic, "--to-latest", "--json"
    )
    assert run.returncode == 0 and not json.loads(run.stdout)["executed"], run.stderr
    assert f"plan-{g}" not in await cc.list_groups()
    assert await cc.reset_offsets(g, "latest") == {(topic, 0): 10, (topic, 1): 4}
    run = await _cli(proxy_cluster, "list", "--json")
    listed = {x["group"]: x for x in json.loads(run.stdout)["groups"]}
    assert listed[g]["state"] == "empty" and listed[g]["lag"] == 0
    run = await _cli(proxy_cluster, "delete", g)
    assert run.returncode == 0 and f"deleted group {g}" in run.stdout, run.stderr
    assert g not in await cc.list_groups()
    with pytest.raises(NotFoundError):
        await cc.describe(g)


async def _lag_everywhere(cluster: LocalCluster, cc: CoordinatorClient, g: str) -> list[int]:
    """The group's total lag as HTTP, the CLI and the metrics (after describe refreshed
    the coordinator's offsets) show it."""
    d = await cc.describe(g)
    run = await _cli(cluster, "describe", g, "--json")
    assert run.returncode == 0, run.stderr
    total = 0.0
    for p in d["partitions"]:
        labels = {"group": g, "topic": p["topic"], "partition": str(p["partition"])}
        total += await _metric(d["coordinator"], "bookline_group_lag_records", labels) or 0.0
    return [d["lag"], json.loads(run.stdout)["lag"], int(total)]


async def test_lag_before_and_after_a_group_consumer_consumed(
    proxy_cluster: LocalCluster, ns: Namespace
) -> None:
    """Acceptance: lag is right before and after consumption, in HTTP, CLI and metrics
    (a real GroupConsumer reading through the read proxy, committing through the
    coordinator)."""
    from groups.consumer import ConsumerConfig, GroupConsumer

    topic = await _topic(ns, [9, 6])
    g = f"lag-{_uid()}"
    urls = _wurls(proxy_cluster)
    rurls = [p.extra["url"] for p in proxy_cluster.read_proxies]
    async with ProxyClient(write_urls=urls, read_urls=rurls, config=CLIENT_CONFIG) as client:
        cc = CoordinatorClient.of(client)
        config = ConsumerConfig(auto_offset_reset="earliest", enable_auto_commit=False)
        consumer = GroupConsumer(g, [topic], client=client, config=config)
        await consumer.start()
        try:
            assert await _lag_everywhere(proxy_cluster, cc, g) == [15, 15, 15]
            got = 0
            for _ in range(100):
                got += len(await consumer.poll(timeout_s=0.2))
                if got >= 15:
                    break
            assert got == 15
            await consumer.commit()
            assert await _lag_everywhere(proxy_cluster, cc, g) == [0, 0, 0]
            writer = await ns.open_writer(partition_stream(topic, 1))
            try:
                await writer.write_many([LogRecord(b"more") for _ in range(4)])
            finally:
                await writer.close()
            assert await _lag_everywhere(proxy_cluster, cc, g) == [4, 4, 4]
        finally:
            await consumer.close()


# -- a paused coordinator (SIGSTOP) is replaced, and fenced when it wakes -------------


async def test_a_paused_coordinator_is_replaced_and_cannot_commit_when_it_wakes(
    proxy_cluster: LocalCluster, client: ProxyClient, ns: Namespace
) -> None:
    cc = CoordinatorClient.of(client)
    topic = await _topic(ns, [20])
    g = f"zombie-{_uid()}"
    a = await cc.join(g, [topic], session_timeout_ms=SESSION_MS)
    await cc.heartbeat(g, a.member_id, a.generation, a.assignment)
    await cc.commit(g, a.member_id, a.generation, {(topic, 0): 5})
    old = (await cc.describe(g))["coordinator"]
    paused = next(p for p in proxy_cluster.write_proxies if p.extra["url"] == old)
    os.kill(paused.proc.pid, signal.SIGSTOP)
    try:
        # The member goes on through another proxy once the paused one's session expired.
        h = await cc.heartbeat(g, a.member_id, a.generation, a.assignment)
        await cc.commit(g, a.member_id, h.generation, {(topic, 0): 8})
        assert (await cc.describe(g))["coordinator"] != old
    finally:
        os.kill(paused.proc.pid, signal.SIGCONT)
    # The old coordinator wakes believing it still coordinates: its commit must fail
    # (its writer is fenced, its session gone), never overwrite its successor's.
    body = {"member_id": a.member_id, "generation": h.generation, "offsets": [[topic, 0, 6]]}
    url = old + group_path(g, "/commit")
    async with aiohttp.ClientSession() as session, session.post(url, json=body) as resp:
        answer = await resp.json()
        assert resp.status != 200, answer
    assert await cc.offsets(g) == {(topic, 0): 8}
    await cc.leave(g, a.member_id)


# -- failover (last: it kills a proxy and restarts it) ---------------------------------


async def _settle(
    cc: CoordinatorClient, g: str, members: dict[str, tuple[int, frozenset[TopicPartition]]]
) -> dict[str, tuple[int, frozenset[TopicPartition]]]:
    """Heartbeat every member (owning what it was given) until nothing moves."""
    for _ in range(10):
        before = dict(members)
        for member_id, (gen, owned) in list(members.items()):
            h = await cc.heartbeat(g, member_id, gen, owned)
            members[member_id] = (h.generation, h.assignment)
        if members == before:
            return members
    raise AssertionError(f"group {g} did not settle: {members}")


async def test_kill9_coordinator_another_proxy_takes_the_group_over(
    proxy_cluster: LocalCluster, client: ProxyClient, ns: Namespace
) -> None:
    cc = CoordinatorClient.of(client)
    topic = await _topic(ns, [20, 20, 20, 20])
    g = f"fo-{_uid()}"
    a = await cc.join(g, [topic], session_timeout_ms=SESSION_MS)
    await cc.heartbeat(g, a.member_id, a.generation, a.assignment)
    b = await cc.join(g, [topic], session_timeout_ms=SESSION_MS)
    a2 = await cc.join(g, [topic], member_id=a.member_id, owned=a.assignment)
    members = await _settle(
        cc,
        g,
        {a.member_id: (a2.generation, a2.assignment), b.member_id: (b.generation, b.assignment)},
    )
    generation = members[a.member_id][0]
    assert all(len(tps) == 2 for _gen, tps in members.values())
    committed: dict[TopicPartition, int] = {}
    for member_id, (gen, tps) in members.items():
        offsets = {tp: 5 + tp[1] for tp in tps}
        await cc.commit(g, member_id, gen, offsets)
        committed.update(offsets)
    coordinator = (await cc.describe(g))["coordinator"]
    victim = next(p for p in proxy_cluster.write_proxies if p.extra["url"] == coordinator)
    survivor = next(u for u in _wurls(proxy_cluster) if u != coordinator)

    procs.kill9(victim.proc)
    try:
        rejoins = 0
        for member_id, (gen, tps) in list(members.items()):
            try:
                h = await cc.heartbeat(g, member_id, gen, tps)
            except StaleGenerationError:
                rejoins += 1
                j = await cc.join(g, [topic], member_id=member_id, owned=tps)
                h = await cc.heartbeat(g, member_id, j.generation, tps)
            members[member_id] = (h.generation, h.assignment)
        assert rejoins <= 1, "members needed more than one rejoin after the failover"
        assert await cc.offsets(g) == committed, "committed offsets lost in the failover"
        d = await cc.describe(g)
        assert d["coordinator"] == survivor and d["generation"] >= generation
        assert {m["member_id"] for m in d["members"]} == set(members)
        # Members go on: commits and heartbeats work on the new coordinator.
        for member_id, (gen, tps) in members.items():
            await cc.commit(g, member_id, gen, {tp: 20 for tp in tps})
        assert (await cc.describe(g))["lag"] == 0
        assert await _metric(survivor, "bookline_group_members", {"group": g}) == 2
        for member_id in members:
            await cc.leave(g, member_id)
    finally:
        proxy_cluster.restart_proxy(victim)
