"""Consumer groups as real processes (issue 14's acceptance): members are
``tests/group_member.py`` processes on the shared proxy cluster (ZooKeeper, 3 bookies,
2 write proxies, a read proxy), killed with ``kill -9`` and paused with SIGSTOP while a
producer in this process writes to every partition. Members use a 3 s session and
500 ms heartbeats; every process is stopped by pid, also on failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from subprocess import Popen
from typing import Any

import pytest

from bookline import Namespace, NamespaceConfig
from groups.coordinator_client import CoordinatorClient
from groups.producer import TopicProducer
from groups.topics import TopicAdmin
from ops.cluster import procs
from ops.cluster.local import LocalCluster
from tests.background import in_background
from tests.waiting import scaled, time_scale, wait_for
from thinclient.client import ClientConfig, ProxyClient

pytestmark = pytest.mark.integration

SESSION_S = 3.0
# What the coordinator needs past a member's session to move its partitions, and the
# longest pause of a kept partition's consumption, on a quiet machine (records arrive at
# 20/s; both stretch with the machine's load: tests.waiting).
MOVE_SLACK_S = 1.0
KEPT_PAUSE_S = 1.5
# A member's process starts (imports, connections, join) within this on a busy machine.
START_S = 30.0


def _uid() -> str:
    return uuid.uuid4().hex[:8]


class Member:
    """One ``tests.group_member`` process and its event log."""

    def __init__(self, cluster: LocalCluster, workdir: Path, group: str, topic: str,
                 *extra: str) -> None:  # fmt: skip
        self.events_path = workdir / f"member-{_uid()}.jsonl"
        self.log_path = self.events_path.with_suffix(".log")
        argv = [
            sys.executable, "-m", "tests.group_member", "--cluster",
            str(cluster.dir / "cluster.json"), "--group", group, "--topic", topic,
            "--events", str(self.events_path), *extra,
        ]  # fmt: skip
        self.proc: Popen[bytes] = procs.spawn(argv, log_path=self.log_path, cwd=Path.cwd())
        self.killed = False
        _all_members.append(self)

    def events(self, ev: str | None = None) -> list[dict[str, Any]]:
        if not self.events_path.exists():
            return []
        out = []
        for line in self.events_path.read_text().splitlines():
            with contextlib.suppress(ValueError):
                obj = json.loads(line)
                if ev is None or obj["ev"] == ev:
                    out.append(obj)
        return out

    @property
    def member_id(self) -> str | None:
        ids = self.events("member")
        return ids[-1]["member"] if ids else None

    def held(self) -> set[int]:
        """What its callbacks say it consumes now."""
        held: set[int] = set()
        for e in self.events():
            if e["ev"] == "assign":
                held |= set(e["tps"])
            elif e["ev"] in ("revoke", "lost"):
                held -= set(e["tps"])
        return held

    def stop(self) -> None:
        procs.stop(self.proc, grace_s=10.0)

    def tail(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:] if self.log_path.exists() else ""


_all_members: list[Member] = []  # of the running test: _wait fails fast if one died


@pytest.fixture
def members() -> Iterator[list[Member]]:
    started: list[Member] = []
    try:
        yield started
    finally:
        for m in started:
            procs.stop(m.proc, grace_s=5.0)
        _all_members.clear()


@pytest.fixture
async def ns(proxy_cluster: LocalCluster) -> AsyncIterator[Namespace]:
    n = await Namespace.open(
        proxy_cluster.zk_connect, "/bookline", "default", NamespaceConfig(session_timeout_ms=4000)
    )
    try:
        yield n
    finally:
        await n.close()


@pytest.fixture
async def coordinator(proxy_cluster: LocalCluster) -> AsyncIterator[CoordinatorClient]:
    client = ProxyClient.from_cluster_file(
        proxy_cluster.dir / "cluster.json", config=ClientConfig(retry_deadline_ms=10_000)
    )
    await client.start()
    try:
        yield CoordinatorClient.of(client)
    finally:
        await client.close()


@contextlib.asynccontextmanager
async def producing(
    ns: Namespace, topic: str, partitions: int, per_s: float
) -> AsyncIterator[None]:
    """Records to every partition, ``per_s`` a second each, until the block ends."""
    producer = TopicProducer(ns)

    async def run() -> None:
        i = 0
        while True:
            await asyncio.gather(*(
                producer.send(topic, f"{p}-{i}".encode(), partition=p) for p in range(partitions)
            ))  # fmt: skip
            i += 1
            await asyncio.sleep(1 / per_s)  # pacing: per_s rounds a second

    try:
        async with in_background(run()):
            yield
    finally:
        await producer.close()


async def _wait(what: str, timeout_s: float, check: Any) -> float:
    """Wait until ``await check()`` is true (tests.waiting: the deadline scales); fail
    at once if a member not meant to die exited. The seconds it took."""
    t0 = time.monotonic()

    async def ready() -> bool:
        for m in _all_members:
            if not m.killed and m.proc.poll() is not None:
                raise AssertionError(f"member pid {m.proc.pid} exited:\n{m.tail()}")
        return bool(await check())

    await wait_for(ready, what, timeout_s=timeout_s)
    return time.monotonic() - t0


def _owners(desc: dict[str, Any]) -> dict[str, set[int]]:
    """member id -> partitions it reports consuming (the coordinator's view)."""
    return {m["member_id"]: {p for _t, p in m["owned"]} for m in desc["members"]}


def _settled(desc: dict[str, Any], members: int, partitions: int) -> bool:
    """``members`` members, every partition owned by exactly one, balanced, and each
    member consuming exactly its target."""
    owners = _owners(desc)
    if len(owners) != members:
        return False
    counts = sorted(len(ps) for ps in owners.values())
    flat = [p for ps in owners.values() for p in ps]
    targets = {m["member_id"]: {p for _t, p in m["assignment"]} for m in desc["members"]}
    return (
        sorted(flat) == list(range(partitions))
        and counts[-1] - counts[0] <= 1
        and all(owners[m] == targets[m] for m in owners)
    )


def _one_owner_each(members: list[Member], partitions: int) -> None:
    held = [m.held() for m in members]
    flat = sorted(p for h in held for p in h)
    assert flat == list(range(partitions)), f"members' own views: {held}"


async def test_group_rebalances_cooperatively_and_survives_kill9(
    proxy_cluster: LocalCluster, ns: Namespace, coordinator: CoordinatorClient,
    members: list[Member], tmp_path: Path,
) -> None:  # fmt: skip
    topic, group, n = f"t{_uid()}", f"g{_uid()}", 10
    await TopicAdmin(ns).create_topic(topic, n)
    async with producing(ns, topic, n, per_s=20):
        for _ in range(3):
            members.append(Member(proxy_cluster, tmp_path, group, topic))

        async def settled(count: int) -> bool:
            with contextlib.suppress(Exception):
                return _settled(await coordinator.describe(group), count, n)
            return False

        try:
            await _wait("3 members sharing 10 partitions", START_S, lambda: settled(3))
        except AssertionError:
            print(json.dumps(await coordinator.describe(group), indent=1, default=str))
            for m in members:
                print(m.member_id, json.dumps(m.events()[-15:]), m.tail(), sep="\n")
            raise
        await _wait(
            "the members' callbacks", 10, _async(lambda: sum(len(m.held()) for m in members) == n)
        )
        _one_owner_each(members, n)
        before = {m.member_id: m.held() for m in members}
        gen_before = (await coordinator.describe(group))["generation"]

        # A 4th member joins: cooperative rebalance.
        t_join = time.time()
        members.append(Member(proxy_cluster, tmp_path, group, topic))
        await _wait("4 members sharing 10 partitions", START_S, lambda: settled(4))
        await _wait("the 4th member's callbacks", 10, _async(lambda: len(members[3].held()) >= 2))
        # Records keep flowing on the partitions that stayed: each kept one is consumed
        # again after the group settled.
        t_settled = time.time()
        await _wait("the kept partitions consumed after the rebalance", 10, _async(
            lambda: all(_consumed_since(m, before[m.member_id] & m.held(), t_settled)
                        for m in members[:3])
        ))  # fmt: skip
        _one_owner_each(members, n)
        assert (await coordinator.describe(group))["generation"] > gen_before
        for m in members[:3]:
            kept = before[m.member_id] & m.held()
            revoked = {p for e in m.events("revoke") for p in e["tps"]}
            assert kept and not kept & revoked, (m.member_id, kept, revoked)
            _consumed_throughout(m, kept, since=t_join - 1.0)

        # kill -9 one member: its partitions move within session timeout + 1 s.
        victim = members[0]
        victim_parts = victim.held()
        victim.killed = True
        procs.kill9(victim.proc)

        async def moved() -> bool:
            desc = await coordinator.describe(group)
            owners = _owners(desc)
            return victim.member_id not in owners and _settled(desc, 3, n)

        took = await _wait("the killed member's partitions to move", 20, moved)
        # The session is the coordinator's clock; what it takes to notice and rebalance
        # past it is the machine's (scaled).
        assert took <= SESSION_S + scaled(MOVE_SLACK_S), (
            f"{victim_parts} moved after {took:.2f}s (time scale {time_scale():g})"
        )
        print(f"kill -9: partitions {sorted(victim_parts)} moved in {took:.2f}s")
        survivors = members[1:]
        await _wait("the survivors' callbacks", 10,
                    _async(lambda: sum(len(m.held()) for m in survivors) == n))  # fmt: skip
        _one_owner_each(survivors, n)


def _consumed(m: Member) -> set[int]:
    """Partitions ``m`` has returned records of."""
    return {int(p) for e in m.events("batch") for p in e["ranges"]}


def _consumed_since(m: Member, parts: set[int], since: float) -> bool:
    """``m`` returned records of every partition in ``parts`` after ``since``."""
    fresh = {int(p) for e in m.events("batch") if e["t"] > since for p in e["ranges"]}
    return parts <= fresh


def _async(fn: Any) -> Any:
    async def check() -> bool:
        return bool(fn())

    return check


def _consumed_throughout(m: Member, kept: set[int], since: float) -> None:
    """Offsets of ``kept`` partitions follow each other from batch to batch (no record
    skipped or repeated) and no pause over KEPT_PAUSE_S (scaled) since ``since``
    (records arrive at 20/s on each partition)."""
    last_offset: dict[int, int] = {}
    last_time: dict[int, float] = {}
    for e in m.events("batch"):
        for raw, (first, last) in e["ranges"].items():
            p = int(raw)
            if p not in kept:
                continue
            if p in last_offset:
                assert first == last_offset[p] + 1, (m.member_id, p, last_offset[p], first)
            if e["t"] >= since and p in last_time:
                gap = e["t"] - last_time[p]
                assert gap < scaled(KEPT_PAUSE_S), (
                    f"{m.member_id} stopped consuming {p} for {gap:.2f}s (scale {time_scale():g})"
                )
            last_offset[p] = last
            last_time[p] = e["t"]


async def test_member_paused_past_its_session_cannot_commit_and_rejoins(
    proxy_cluster: LocalCluster, ns: Namespace, coordinator: CoordinatorClient,
    members: list[Member], tmp_path: Path,
) -> None:  # fmt: skip
    topic, group, n = f"t{_uid()}", f"g{_uid()}", 6
    await TopicAdmin(ns).create_topic(topic, n)

    async def settled(count: int) -> bool:
        with contextlib.suppress(Exception):
            return _settled(await coordinator.describe(group), count, n)
        return False

    async with producing(ns, topic, n, per_s=20):
        for _ in range(2):
            members.append(Member(proxy_cluster, tmp_path, group, topic))
        await _wait("2 members sharing 6 partitions", START_S, lambda: settled(2))
        sleeper, other = members
        await _wait("the sleeper's callbacks", 10, _async(lambda: len(sleeper.held()) == 3))
        await _wait(
            "the sleeper consuming", 10, _async(lambda: _consumed(sleeper) >= sleeper.held())
        )
        old_id = sleeper.member_id
        old_parts = sleeper.held()
        os.kill(sleeper.proc.pid, signal.SIGSTOP)
        try:
            # Past its session: the coordinator expires it; the other member takes all.
            await _wait("the other member to own everything", 15, lambda: settled(1))
            committed_before = await coordinator.offsets(group)
            await asyncio.sleep(0.5)  # the other member consumes and commits meanwhile
        finally:
            os.kill(sleeper.proc.pid, signal.SIGCONT)
        await _wait("the resumed member's commit attempt", 10,
                    _async(lambda: sleeper.events("resume_commit")))  # fmt: skip
        attempt = sleeper.events("resume_commit")[0]
        assert attempt["ok"] is False and attempt["code"] == 44, attempt  # STALE_GENERATION
        # It rejoined under a new member id, and the group settles again.
        await _wait("the paused member to rejoin", 15,
                    _async(lambda: sleeper.member_id not in (None, old_id)))  # fmt: skip
        await _wait("2 members again", 15, lambda: settled(2))
        assert old_id not in _owners(await coordinator.describe(group))
        assert sleeper.events("lost") and set(sleeper.events("lost")[0]["tps"]) == old_parts
        # Nothing it held before the pause was committed by it after the other member
        # took over: the committed offsets only moved forward from what they were.
        after = await coordinator.offsets(group)
        for tp, offset in committed_before.items():
            assert after[tp] >= offset
        await _wait("both members' callbacks", 10,
                    _async(lambda: len(sleeper.held()) + len(other.held()) == n))  # fmt: skip
        _one_owner_each(members, n)


async def test_static_member_restarted_in_time_keeps_partitions_without_rebalance(
    proxy_cluster: LocalCluster, ns: Namespace, coordinator: CoordinatorClient,
    members: list[Member], tmp_path: Path,
) -> None:  # fmt: skip
    topic, group, n = f"t{_uid()}", f"g{_uid()}", 6
    await TopicAdmin(ns).create_topic(topic, n)
    # A longer session: the restarted process must be back before it ends.
    static = ("--session-ms", "15000", "--heartbeat-ms", "500")

    async def settled(count: int) -> bool:
        with contextlib.suppress(Exception):
            return _settled(await coordinator.describe(group), count, n)
        return False

    async with producing(ns, topic, n, per_s=10):
        members.append(Member(proxy_cluster, tmp_path, group, topic, "--instance-id", "a", *static))
        members.append(Member(proxy_cluster, tmp_path, group, topic, "--instance-id", "b", *static))
        await _wait("2 static members", START_S, lambda: settled(2))
        first = members[0]
        await _wait("a's callbacks", 10, _async(lambda: len(first.held()) == 3))
        await _wait("b's callbacks", 10, _async(lambda: len(members[1].held()) == 3))
        parts = first.held()
        desc = await coordinator.describe(group)
        generation = desc["generation"]
        first.killed = True
        procs.kill9(first.proc)
        t_kill = time.time()
        restarted = Member(proxy_cluster, tmp_path, group, topic, "--instance-id", "a", *static)
        members.append(restarted)
        await _wait("the restarted member's partitions", START_S,
                    _async(lambda: len(restarted.held()) == 3))  # fmt: skip
        assert restarted.held() == parts
        assert restarted.member_id != first.member_id
        desc = await coordinator.describe(group)
        assert desc["generation"] == generation
        assert {m["instance_id"] for m in desc["members"]} == {"a", "b"}
        since_kill = [e for e in members[1].events() if e["t"] >= t_kill]
        assert not [e for e in since_kill if e["ev"] in ("revoke", "lost", "assign")]
