"""Kafka's classic group protocol with the clients' own assignors, against a real local
cluster: members are processes of kafka-python, aiokafka and librdkafka
(tests/kafka_group_member.py) with their eager assignors (range, roundrobin) and
librdkafka's cooperative-sticky one; a fourth member joins, one is killed with kill -9,
a static member restarts; the leader's assignment bytes reach the followers verbatim;
committed offsets and lag show in ``bookline group describe``."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kafkaapi.protocol.apis_groups import (
    DESCRIBE_GROUPS,
    FIND_COORDINATOR,
    HEARTBEAT,
    JOIN_GROUP,
    LEAVE_GROUP,
    SYNC_GROUP,
)
from ops.cluster.local import LocalCluster
from tests.cli_support import cli_json
from tests.kafka_cluster import (
    PARTITIONS,
    bootstrap_of,
    create_topic,
    kafka_call,
    kafka_cluster,
    kafka_python_roundtrip,
    new_topic,
)
from tests.waiting import wait_for

RECORDS = 60
KILL_SESSION_MS = 6_000  # a killed member's partitions move once this expires
STATIC_SESSION_MS = 60_000  # a restarted static member comes back well within it


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with kafka_cluster(tmp_path_factory.mktemp("kafka-classic")) as c:
        yield c


@pytest.fixture(scope="module")
def bootstrap(cluster: LocalCluster) -> str:
    return bootstrap_of(cluster)


class Member:
    """A member process and the last state it printed."""

    def __init__(self, argv: list[str], log: Path | None = None) -> None:
        self.log = log
        env = os.environ.copy() | ({"GROUP_MEMBER_LOG": str(log)} if log else {})
        self.proc = subprocess.Popen(  # stopped by pid in Fleet.stop
            [sys.executable, "-m", "tests.kafka_group_member", *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        self.state: dict[str, Any] = {"held": [], "revoked": {}, "read": 0}
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.state = json.loads(line)

    @property
    def held(self) -> set[int]:
        return set(self.state["held"])

    @property
    def revoked(self) -> dict[int, int]:
        return {int(p): n for p, n in self.state["revoked"].items()}


class Fleet:
    """Members of one group; every process is stopped by pid at the end. With ``logs`` (a
    directory) each member process logs its client's group coordinator there."""

    def __init__(
        self,
        client: str,
        bootstrap: str,
        topic: str,
        group: str,
        assignor: str,
        *,
        logs: Path | None = None,
    ):
        self.base = [client, bootstrap, topic, group, assignor]
        self.members: dict[str, Member] = {}
        self.logs = logs
        self.started: list[Member] = []

    def start(self, name: str, session_ms: int, instance: str | None = None) -> Member:
        argv = [*self.base, str(session_ms), *([instance] if instance else [])]
        log = self.logs / f"{name}-{len(self.started)}.log" if self.logs else None
        self.members[name] = Member(argv, log)
        self.started.append(self.members[name])
        return self.members[name]

    def print_logs(self, lines: int = 80) -> None:
        """The tail of every member's log (pytest shows it with a failure)."""
        for member in self.started:
            if member.log and member.log.exists():
                tail = member.log.read_text(errors="replace").splitlines()[-lines:]
                print(f"---- {member.log} (last {lines} lines)", *tail, sep="\n")

    def kill(self, name: str) -> None:
        proc = self.members.pop(name).proc
        proc.kill()  # kill -9: no LeaveGroup
        proc.wait()

    def split(self) -> bool:
        """Every live member holds partitions, none twice, all of them together."""
        sets = [m.held for m in self.members.values()]
        union = set().union(*sets)
        disjoint = sum(len(s) for s in sets) == len(union)
        return all(sets) and disjoint and union == set(range(PARTITIONS))

    def stop(self) -> None:
        for member in self.members.values():
            if member.proc.poll() is None:
                member.proc.send_signal(signal.SIGTERM)  # closes: leaves the group
        for member in self.members.values():
            try:
                member.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                member.proc.kill()
                member.proc.wait()


async def _topic_with_records(bootstrap: str) -> str:
    topic = new_topic()
    await create_topic(bootstrap.split(",", maxsplit=1)[0], topic)
    sent, _ = await asyncio.to_thread(kafka_python_roundtrip, bootstrap, topic, RECORDS)
    assert len(sent) == RECORDS
    return topic


def _describe(cluster: LocalCluster, group: str) -> dict[str, Any]:
    doc: dict[str, Any] = cli_json("group", "describe", group, cluster=cluster.dir / "cluster.json")
    return doc


CASES = [
    ("kafka-python", "range"),
    ("kafka-python", "roundrobin"),
    ("aiokafka", "range"),
    ("aiokafka", "roundrobin"),
    ("confluent-kafka", "range"),
    ("confluent-kafka", "roundrobin"),
    ("confluent-kafka", "cooperative-sticky"),
]


@pytest.mark.parametrize(("client", "assignor"), CASES)
async def test_members_split_a_fourth_joins_one_is_killed(
    cluster: LocalCluster, bootstrap: str, client: str, assignor: str
) -> None:
    """Three members split six partitions with the clients' assignor (two each), read
    and commit every record (offsets and lag 0 in ``bookline group describe``); a
    fourth joins (cooperative: no member gives up a partition it keeps); one is killed
    with kill -9 and the others hold every partition once its session expired."""
    topic, group = await _topic_with_records(bootstrap), f"g-{uuid.uuid4().hex[:8]}"
    fleet = Fleet(client, bootstrap, topic, group, assignor)
    try:
        for name in ("a", "b", "c"):
            fleet.start(name, KILL_SESSION_MS)
        await wait_for(fleet.split, "three members split the partitions", timeout_s=120)
        await wait_for(
            lambda: all(len(m.held) == 2 for m in fleet.members.values()), "two partitions each"
        )

        def committed_all() -> dict[str, Any] | None:
            doc = _describe(cluster, group)
            done = sum(p["committed"] or 0 for p in doc["partitions"]) == RECORDS
            return doc if done else None

        doc = await wait_for(committed_all, "every record committed", timeout_s=120)
        assert doc["lag"] == 0 and {p["lag"] for p in doc["partitions"]} == {0}
        # The Kafka members show as the group's members, with what their leader gave them.
        shown = {tuple(tp) for m in doc["members"] for tp in m["consuming"]}
        assert (len(doc["members"]), doc["state"]) == (3, "Stable")
        assert shown == {(topic, p) for p in range(PARTITIONS)}
        assert all(m["topics"] == [topic] for m in doc["members"])
        assert {p["member_id"] for p in doc["partitions"]} == {
            m["member_id"] for m in doc["members"]
        }
        before = {n: m.revoked for n, m in fleet.members.items()}
        fleet.start("d", KILL_SESSION_MS)
        await wait_for(
            lambda: fleet.split() and len(fleet.members) == 4, "four split them", timeout_s=120
        )
        if assignor == "cooperative-sticky":
            for name, counts in before.items():
                member = fleet.members[name]
                moved = {p for p, n in member.revoked.items() if n > counts.get(p, 0)}
                assert not moved & member.held, f"{name} gave up partitions it kept"
        fleet.kill("a")
        await wait_for(fleet.split, "the other three hold every partition", timeout_s=120)
    finally:
        await asyncio.to_thread(fleet.stop)


@pytest.mark.parametrize("client", ["kafka-python", "aiokafka", "confluent-kafka"])
async def test_a_static_member_restarting_gets_its_partitions_back_alone(
    bootstrap: str, client: str, tmp_path: Path
) -> None:
    """Static members (``group.instance.id``): one killed with kill -9 and started again
    within its session timeout holds the same partitions, and no other member gave any
    partition up (no rebalance).

    The restarted member is a follower: b joins first and stays the group's leader. Kafka
    promises no rebalance only for that case: a JoinGroup from the leader in Stable
    always starts one (GroupMetadataManager's classic join, "Leader ... re-joining group
    during Stable"), and a restarted static leader is the leader again under its new
    member id (ClassicGroup.replaceStaticMember). kafka-python sometimes sends that
    second JoinGroup right after a successful SyncGroup: when join and sync outlast one
    ``poll(timeout_ms)``, its next poll finds the finished join task and starts another
    (ConsumerCoordinator.join_group_async), so a restarted leader would rebalance the
    group against Kafka too."""
    topic, group = await _topic_with_records(bootstrap), f"g-{uuid.uuid4().hex[:8]}"
    fleet = Fleet(client, bootstrap, topic, group, "range", logs=tmp_path)
    try:
        leader = fleet.start("b", STATIC_SESSION_MS, instance=f"{group}-b")
        everything = set(range(PARTITIONS))
        await wait_for(lambda: leader.held == everything, "b leads alone", timeout_s=120)
        for name in ("a", "c"):
            fleet.start(name, STATIC_SESSION_MS, instance=f"{group}-{name}")
        await wait_for(fleet.split, "three static members split the partitions", timeout_s=120)
        held = {n: m.held for n, m in fleet.members.items()}
        revoked = {n: m.revoked for n, m in fleet.members.items()}
        fleet.kill("a")
        again = fleet.start("a", STATIC_SESSION_MS, instance=f"{group}-a")
        await wait_for(
            lambda: again.held == held["a"], "the restarted member's partitions", timeout_s=120
        )
        for name in ("b", "c"):
            assert fleet.members[name].held == held[name]
            assert fleet.members[name].revoked == revoked[name], f"{name} was rebalanced"
    except BaseException:
        fleet.print_logs()
        raise
    finally:
        await asyncio.to_thread(fleet.stop)


# -- the protocol itself, by hand ----------------------------------------------------------


async def _coordinator(bootstrap: str, group: str) -> str:
    answer = await kafka_call(
        bootstrap.split(",", maxsplit=1)[0], FIND_COORDINATOR, 3, {"key": group, "key_type": 0}
    )
    assert answer["error_code"] == 0, answer
    return f"{answer['host']}:{answer['port']}"


def _join_body(
    group: str, member_id: str, metadata: bytes, instance: str | None = None
) -> dict[str, Any]:
    return {
        "group_id": group,
        "session_timeout_ms": 30_000,
        "rebalance_timeout_ms": 30_000,
        "member_id": member_id,
        "group_instance_id": instance,
        "protocol_type": "consumer",
        "protocols": [{"name": "custom", "metadata": metadata}],
        "reason": None,
    }


async def _join(coordinator: str, group: str, metadata: bytes) -> dict[str, Any]:
    """JoinGroup v9: the MEMBER_ID_REQUIRED round, then the join itself."""
    first = await kafka_call(coordinator, JOIN_GROUP, 9, _join_body(group, "", metadata))
    assert first["error_code"] == 79 and first["member_id"], first  # MEMBER_ID_REQUIRED
    return await kafka_call(
        coordinator, JOIN_GROUP, 9, _join_body(group, first["member_id"], metadata)
    )


def _sync_body(
    group: str, generation: int, member: str, assignments: dict[str, bytes]
) -> dict[str, Any]:
    return {
        "group_id": group,
        "generation_id": generation,
        "member_id": member,
        "group_instance_id": None,
        "protocol_type": "consumer",
        "protocol_name": "custom",
        "assignments": [{"member_id": m, "assignment": a} for m, a in assignments.items()],
    }


async def test_the_leaders_assignment_bytes_reach_each_follower_verbatim(bootstrap: str) -> None:
    """A custom protocol ("custom"; metadata and assignments any bytes): the leader gets
    every member's metadata, each follower the bytes the leader sent for it, and
    DescribeGroups shows the group Stable with them."""
    group = f"g-{uuid.uuid4().hex[:8]}"
    coordinator = await _coordinator(bootstrap, group)
    metas = [b"\x00meta of one\xff", b"\x01meta of two\xfe", b"\x02meta of three"]
    joined = await asyncio.gather(*(_join(coordinator, group, m) for m in metas))
    assert {j["error_code"] for j in joined} == {0} and len(
        {j["generation_id"] for j in joined}
    ) == 1
    leader = joined[0]["leader"]
    by_id = {j["member_id"]: j for j in joined}
    assert by_id[leader]["members"] and all(
        not j["members"] for m, j in by_id.items() if m != leader
    )
    assert sorted(m["metadata"] for m in by_id[leader]["members"]) == sorted(metas)
    generation = joined[0]["generation_id"]
    # Any bytes: the consumer protocol's framing is the clients' business, not Bookline's.
    assignment = {m: b"user data for " + m.encode() + bytes(range(256)) for m in by_id}
    follower_syncs = [
        asyncio.create_task(
            kafka_call(coordinator, SYNC_GROUP, 5, _sync_body(group, generation, m, {}))
        )
        for m in by_id
        if m != leader
    ]
    led = await kafka_call(
        coordinator, SYNC_GROUP, 5, _sync_body(group, generation, leader, assignment)
    )
    assert led["error_code"] == 0 and led["assignment"] == assignment[leader]
    for member, task in zip([m for m in by_id if m != leader], follower_syncs, strict=True):
        got = await task
        assert got["error_code"] == 0 and got["assignment"] == assignment[member]
        assert got["protocol_name"] == "custom"
    described = await kafka_call(
        coordinator, DESCRIBE_GROUPS, 5, {"groups": [group], "include_authorized_operations": False}
    )
    view = described["groups"][0]
    assert view["group_state"] == "Stable" and view["protocol_data"] == "custom"
    assert {m["member_id"]: m["member_assignment"] for m in view["members"]} == assignment
    beat = await kafka_call(
        coordinator,
        HEARTBEAT,
        4,
        {
            "group_id": group,
            "generation_id": generation,
            "member_id": leader,
            "group_instance_id": None,
        },
    )
    assert beat["error_code"] == 0
    left = await kafka_call(
        coordinator,
        LEAVE_GROUP,
        5,
        {
            "group_id": group,
            "members": [{"member_id": m, "group_instance_id": None, "reason": None} for m in by_id],
        },
    )
    assert [m["error_code"] for m in left["members"]] == [0, 0, 0]


async def _static_sync(
    coordinator: str, group: str, generation: int, member: str, instance: str,
    *, assignments: dict[str, bytes] | None = None,
) -> dict[str, Any]:  # fmt: skip
    body = _sync_body(group, generation, member, assignments or {})
    return await kafka_call(coordinator, SYNC_GROUP, 5, body | {"group_instance_id": instance})


async def _beat(coordinator: str, group: str, generation: int, member: str, instance: str) -> int:
    body = {"group_id": group, "generation_id": generation, "member_id": member,
            "group_instance_id": instance}  # fmt: skip
    return int((await kafka_call(coordinator, HEARTBEAT, 4, body))["error_code"])


async def test_a_restarted_static_leader_is_not_asked_to_assign_again(bootstrap: str) -> None:
    """Three static members, Stable; the leader's process restarts (a JoinGroup with its
    instance id, no member id). Before JoinGroup v9 it is told the previous leader's id,
    so it syncs as a follower and runs no assignor (Kafka's answer: a restarted client
    that assigns watches its fresh metadata and rejoins when it arrives, rebalancing
    every member); from v9 it is the leader with skip_assignment. Neither rebalances:
    the others' heartbeats say NONE and its SyncGroup answers the instance's assignment."""
    group = f"g-{uuid.uuid4().hex[:8]}"
    coordinator = await _coordinator(bootstrap, group)
    instances = ["i-a", "i-b", "i-c"]
    joined = await asyncio.gather(*(
        kafka_call(coordinator, JOIN_GROUP, 7, _join_body(group, "", i.encode(), i))
        for i in instances
    ))  # fmt: skip
    assert {j["error_code"] for j in joined} == {0}, joined
    generation, leader = joined[0]["generation_id"], joined[0]["leader"]
    ids = {i: j["member_id"] for i, j in zip(instances, joined, strict=True)}
    [lead] = [i for i in instances if ids[i] == leader]
    assignment = {ids[i]: b"partitions of " + i.encode() for i in instances}
    followers = [
        asyncio.create_task(_static_sync(coordinator, group, generation, ids[i], i))
        for i in instances
        if i != lead
    ]
    await _static_sync(coordinator, group, generation, leader, lead, assignments=assignment)
    assert {(await f)["error_code"] for f in followers} == {0}
    for version in (7, 9):
        old = ids[lead]
        body = _join_body(group, "", lead.encode(), lead)
        again = await kafka_call(coordinator, JOIN_GROUP, version, body)
        assert again["error_code"] == 0 and again["generation_id"] == generation, again
        assert again["member_id"] != old
        if version < 9:  # the previous leader's id: it does not take itself for the leader
            assert (again["leader"], again["members"]) == (old, []), again
        else:
            assert again["leader"] == again["member_id"] and again["skip_assignment"]
            assert len(again["members"]) == len(instances)
        ids[lead] = again["member_id"]
        synced = await _static_sync(coordinator, group, generation, ids[lead], lead)
        assert synced["error_code"] == 0 and synced["assignment"] == assignment[leader]
        beats = [await _beat(coordinator, group, generation, ids[i], i) for i in instances]
        assert beats == [0, 0, 0]  # nobody is asked to rejoin
        assert await _beat(coordinator, group, generation, old, lead) == 82  # FENCED_INSTANCE_ID
    left = await kafka_call(coordinator, LEAVE_GROUP, 5, {"group_id": group, "members": [
        {"member_id": "", "group_instance_id": i, "reason": None} for i in instances]})  # fmt: skip
    assert [m["error_code"] for m in left["members"]] == [0, 0, 0]


async def test_a_group_has_kafka_members_or_bookline_members_not_both(
    cluster: LocalCluster, bootstrap: str
) -> None:
    """While Kafka classic members use a group, a Bookline (thin client) member may not
    join it (GROUP_NOT_EMPTY); while a Bookline member lives, a Kafka JoinGroup is
    INCONSISTENT_GROUP_PROTOCOL, Kafka's answer for a group of another protocol type."""
    from foundation.errors import GroupNotEmptyError
    from groups.coordinator_client import CoordinatorClient
    from thinclient.client import ClientConfig, ProxyClient

    topic, group = new_topic(), f"g-{uuid.uuid4().hex[:8]}"
    await create_topic(bootstrap.split(",", maxsplit=1)[0], topic)
    coordinator = await _coordinator(bootstrap, group)
    # A static member: no MEMBER_ID_REQUIRED round.
    joined = await kafka_call(coordinator, JOIN_GROUP, 9, _join_body(group, "", b"m", "i-1"))
    assert joined["error_code"] == 0
    client = ProxyClient.from_cluster_file(
        cluster.dir / "cluster.json", config=ClientConfig(retry_deadline_ms=10_000)
    )
    await client.start()
    try:
        bookline = CoordinatorClient.of(client)
        with pytest.raises(GroupNotEmptyError):
            await bookline.join(group, [topic])
        left = await kafka_call(coordinator, LEAVE_GROUP, 5, {"group_id": group, "members": [
            {"member_id": "", "group_instance_id": "i-1", "reason": None}]})  # fmt: skip
        assert left["members"][0]["error_code"] == 0
        member = await bookline.join(group, [topic])
        refused = await kafka_call(coordinator, JOIN_GROUP, 9, _join_body(group, "", b"m", "i-2"))
        assert refused["error_code"] == 23  # INCONSISTENT_GROUP_PROTOCOL
        await bookline.leave(group, member.member_id)
    finally:
        await client.close()


@pytest.fixture
def own_cluster(tmp_path: Any) -> Iterator[LocalCluster]:
    """A cluster of its own: the test kills a write proxy."""
    from tests.cluster_support import started_cluster

    with started_cluster(tmp_path / "c", bookies=3, write_proxies=2, kafka=True) as c:
        yield c


async def test_members_rejoin_when_the_coordinator_proxy_dies(
    own_cluster: LocalCluster, tmp_path: Path
) -> None:
    """kill -9 of the write proxy coordinating a classic group: the members find the
    new coordinator, join again and split the partitions; the offsets they committed
    (in the group's log) are still there."""
    from ops.cluster import procs

    bootstrap = str(own_cluster.kafka_bootstrap())
    topic, group = await _topic_with_records(bootstrap), f"g-{uuid.uuid4().hex[:8]}"
    fleet = Fleet("kafka-python", bootstrap, topic, group, "range", logs=tmp_path)
    try:
        for name in ("a", "b"):
            fleet.start(name, KILL_SESSION_MS)
        await wait_for(fleet.split, "two members split the partitions", timeout_s=120)

        async def all_committed() -> dict[int, int] | None:
            got = await asyncio.to_thread(_committed_offsets, bootstrap, topic, group)
            return got if sum(got.values()) == RECORDS else None

        # What the members committed, read before the kill (OffsetFetch, any client).
        committed = await wait_for(all_committed, "every record committed", timeout_s=120)
        coordinator = await _coordinator(bootstrap, group)
        [victim] = [p for p in own_cluster.write_proxies if p.extra["kafka"] == coordinator]
        procs.kill9(victim.proc)
        moved = await wait_for(
            lambda: _coordinator_or_none(bootstrap, victim.extra["kafka"], group),
            "the group's new coordinator",
            timeout_s=120,
        )
        assert moved != coordinator

        async def rejoined() -> bool:
            body = {"groups": [group], "include_authorized_operations": False}
            view = (await kafka_call(moved, DESCRIBE_GROUPS, 5, body))["groups"][0]
            return view["group_state"] == "Stable" and len(view["members"]) == 2

        await wait_for(rejoined, "both members joined at the new coordinator", timeout_s=120)
        await wait_for(fleet.split, "the members split the partitions again", timeout_s=120)
        assert await asyncio.to_thread(_committed_offsets, moved, topic, group) == committed
    except BaseException:
        fleet.print_logs()  # the members' DEBUG logs: whom they asked, what they were told
        raise
    finally:
        await asyncio.to_thread(fleet.stop)


async def _coordinator_or_none(bootstrap: str, dead: str, group: str) -> str | None:
    for address in bootstrap.split(","):
        if address == dead:
            continue
        answer = await kafka_call(address, FIND_COORDINATOR, 3, {"key": group, "key_type": 0})
        if answer["error_code"] == 0 and f"{answer['host']}:{answer['port']}" != dead:
            return f"{answer['host']}:{answer['port']}"
    return None


def _committed_offsets(bootstrap: str, topic: str, group: str) -> dict[int, int]:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    try:
        return {p: consumer.committed(TopicPartition(topic, p)) or 0 for p in range(PARTITIONS)}
    finally:
        consumer.close()
