"""KIP-848's consumer protocol (ConsumerGroupHeartbeat) on Bookline's coordinators:
raw requests for epochs, fencing, reconciliation, leaving and static members; librdkafka
(confluent-kafka with ``group.protocol=consumer``) members splitting a 6-partition
topic, a 4th joining, one killed with kill -9, their commits and the lag
``bookline group describe`` shows."""

from __future__ import annotations

import asyncio
import functools
import json
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kafkaapi.protocol.apis_cluster import API_VERSIONS, METADATA
from kafkaapi.protocol.apis_groups import (
    CONSUMER_GROUP_HEARTBEAT,
    FIND_COORDINATOR,
    OFFSET_COMMIT,
)
from ops.cluster.local import LocalCluster
from tests.cli_support import CLI_TIMEOUT_S, run_cli
from tests.kafka_cluster import (
    PARTITIONS,
    bootstrap_of,
    create_topic,
    kafka_call,
    kafka_cluster,
    kafka_python_roundtrip,
    new_topic,
)
from tests.kafka_support import MemberProcess
from tests.waiting import wait_for

FENCED_MEMBER_EPOCH = 110
UNKNOWN_MEMBER_ID = 25
INVALID_REGULAR_EXPRESSION = 128


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with kafka_cluster(tmp_path_factory.mktemp("kafka-kip848")) as c:
        yield c


@pytest.fixture(scope="module")
def bootstrap(cluster: LocalCluster) -> str:
    return bootstrap_of(cluster)


async def _coordinator(bootstrap: str, group: str) -> str:
    first = bootstrap.split(",", maxsplit=1)[0]
    found = await kafka_call(first, FIND_COORDINATOR, 3, {"key": group, "key_type": 0})
    assert found["error_code"] == 0, found
    return f"{found['host']}:{found['port']}"


class _Member:
    """One member speaking ConsumerGroupHeartbeat v1 by hand."""

    def __init__(self, address: str, group: str, topic: str, instance: str | None = None) -> None:
        self.address, self.group, self.topic, self.instance = address, group, topic, instance
        self.member_id, self.epoch = uuid.uuid4().hex[:22], 0
        self.topic_id: uuid.UUID | None = None

    async def beat(
        self, owned: set[int] | None = None, *, epoch: int | None = None, **extra: Any
    ) -> dict[str, Any]:
        """A heartbeat with ``owned`` partitions (None: unchanged); the full answer."""
        epoch = self.epoch if epoch is None else epoch
        body = {
            "group_id": self.group,
            "member_id": self.member_id,
            "member_epoch": epoch,
            "instance_id": self.instance,
            "rack_id": None,
            "rebalance_timeout_ms": 30_000,
            "subscribed_topic_names": [self.topic] if epoch == 0 else None,
            "subscribed_topic_regex": None,
            "server_assignor": None,
            "topic_partitions": (
                [] if epoch == 0 else None if owned is None
                else [{"topic_id": self.topic_id, "partitions": sorted(owned)}]
            ),
        } | extra  # fmt: skip
        answer = await kafka_call(self.address, CONSUMER_GROUP_HEARTBEAT, 1, body)
        if answer["error_code"] == 0 and epoch >= 0:
            self.member_id, self.epoch = answer["member_id"], answer["member_epoch"]
        return answer

    def partitions(self, answer: dict[str, Any]) -> set[int]:
        assigned = answer["assignment"]["topic_partitions"]
        assert all(entry["topic_id"] == self.topic_id for entry in assigned), assigned
        return {p for entry in assigned for p in entry["partitions"]}


async def _topic_and_members(
    bootstrap: str, *instances: str | None
) -> tuple[str, str, list[_Member]]:
    topic, group = new_topic(), f"g-{uuid.uuid4().hex[:8]}"
    first = bootstrap.split(",", maxsplit=1)[0]
    await create_topic(first, topic)
    meta = await kafka_call(
        first, METADATA, 12, {"topics": [{"name": topic, "topic_id": uuid.UUID(int=0)}]}
    )
    topic_id = meta["topics"][0]["topic_id"]
    address = await _coordinator(bootstrap, group)
    members = [_Member(address, group, topic, i) for i in instances]
    for m in members:
        m.topic_id = topic_id
    return topic, group, members


async def test_api_versions_offers_it_and_metadata_answers_stable_topic_ids(
    bootstrap: str,
) -> None:
    first, *others = bootstrap.split(",")
    hello = {"client_software_name": "t", "client_software_version": "1"}
    offered = await kafka_call(first, API_VERSIONS, 3, hello)
    keys = {k["api_key"]: (k["min_version"], k["max_version"]) for k in offered["api_keys"]}
    assert keys[CONSUMER_GROUP_HEARTBEAT.key] == (0, 1)
    topic = new_topic()
    await create_topic(first, topic)
    asked = {"topics": [{"name": topic, "topic_id": uuid.UUID(int=0)}]}
    ids = {
        (await kafka_call(a, METADATA, 12, asked))["topics"][0]["topic_id"]
        for a in bootstrap.split(",")
    }
    assert len(ids) == 1 and uuid.UUID(int=0) not in ids  # one id, the same on every broker
    (topic_id,) = ids
    by_id = await kafka_call(
        others[0], METADATA, 12, {"topics": [{"name": None, "topic_id": topic_id}]}
    )
    assert (by_id["topics"][0]["name"], by_id["topics"][0]["error_code"]) == (topic, 0)
    assert len(by_id["topics"][0]["partitions"]) == PARTITIONS
    unknown = {"topics": [{"name": None, "topic_id": uuid.uuid4()}]}
    assert (await kafka_call(first, METADATA, 12, unknown))["topics"][0]["error_code"] == 100


async def test_epochs_fencing_reconciliation_and_leaving(bootstrap: str) -> None:
    topic, group, (a, b) = await _topic_and_members(bootstrap, None, None)
    joined = await a.beat()
    assert joined["error_code"] == 0 and a.epoch > 0
    assert a.partitions(joined) == set(range(PARTITIONS))
    assert joined["heartbeat_interval_ms"] > 0
    # b joins: nothing yet, a still owns every partition.
    joined_b = await b.beat()
    assert joined_b["error_code"] == 0 and b.partitions(joined_b) == set()
    # a's lagging epoch is no fence: it is told to keep half.
    kept = a.partitions(await a.beat(set(range(PARTITIONS))))
    assert 0 < len(kept) < PARTITIONS
    # a commits with the epoch it has, what it still holds.
    commit = {"group_id": group, "generation_id_or_member_epoch": a.epoch, "member_id": a.member_id,
              "group_instance_id": None, "topics": [{"name": topic, "partitions": [
                  {"partition_index": p, "committed_offset": 0, "committed_leader_epoch": -1,
                   "committed_metadata": None} for p in sorted(kept)]}]}  # fmt: skip
    answer = await kafka_call(a.address, OFFSET_COMMIT, 8, commit)
    assert {p["error_code"] for p in answer["topics"][0]["partitions"]} == {0}, answer
    # b gets the rest once a says it gave them up.
    assert b.partitions(await b.beat(set())) == set()
    await a.beat(kept)
    rest = b.partitions(await b.beat(set()))
    assert rest == set(range(PARTITIONS)) - kept
    # Fencing: an epoch the group never gave, a member it does not know, a regex.
    assert (await a.beat(epoch=a.epoch + 5))["error_code"] == FENCED_MEMBER_EPOCH
    stranger = _Member(a.address, group, topic)
    assert (await stranger.beat(epoch=3))["error_code"] == UNKNOWN_MEMBER_ID
    regex = await stranger.beat(epoch=0, subscribed_topic_regex="app-(")
    assert regex["error_code"] == INVALID_REGULAR_EXPRESSION
    # a leaves (epoch -1): b is handed every partition at once.
    left = await a.beat(epoch=-1)
    assert (left["error_code"], left["member_epoch"]) == (0, -1)
    assert b.partitions(await b.beat(rest)) == set(range(PARTITIONS))
    assert (await a.beat(epoch=a.epoch))["error_code"] == UNKNOWN_MEMBER_ID


async def test_a_static_member_gets_its_partitions_back(bootstrap: str) -> None:
    _topic, _group, (a, b) = await _topic_and_members(bootstrap, "static-a", None)
    await a.beat()
    await b.beat()
    mine = a.partitions(await a.beat(set(range(PARTITIONS))))
    await a.beat(mine)
    assert 0 < len(mine) < PARTITIONS
    # A static leave (-2): its partitions wait for it, b is not handed them.
    assert (await a.beat(epoch=-2))["error_code"] == 0
    others = set(range(PARTITIONS)) - mine
    assert b.partitions(await b.beat(set())) == others
    # Restarted with the same instance id: its partitions back, a new member id.
    restarted = _Member(a.address, a.group, a.topic, "static-a")
    restarted.topic_id = a.topic_id
    answer = await restarted.beat()
    assert answer["error_code"] == 0 and restarted.partitions(answer) == mine
    assert restarted.member_id != a.member_id
    assert (await a.beat(epoch=a.epoch))["error_code"] == UNKNOWN_MEMBER_ID


def _member(  # noqa: PLR0917 - one thread's arguments
    bootstrap: str, topic: str, group: str, stop: Any, out: dict[str, Any], name: str
) -> None:
    """A librdkafka member of the consumer protocol, committing every record it reads,
    polling until ``stop``; its records and assignment in ``out[name]``."""
    from confluent_kafka import Consumer

    # Commits are asynchronous; one refused while its partition moved is made again by
    # the partition's next member, so the test checks the group's lag at the end.
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                         "group.protocol": "consumer", "enable.auto.commit": False,
                         "auto.offset.reset": "earliest"})  # fmt: skip
    got: set[tuple[int, int]] = set()
    try:
        consumer.subscribe([topic])
        while not stop.is_set():
            msg = consumer.poll(0.3)
            error = None if msg is None else msg.error()
            if error is not None and error.fatal():
                raise RuntimeError(f"member {name}: {error}")  # fails the wait at once
            if msg is not None and error is None:
                where: Any = (msg.partition(), msg.offset())
                got.add(where)
                consumer.commit(message=msg, asynchronous=True)
            out[name] = (set(got), {tp.partition for tp in consumer.assignment()})
    finally:
        consumer.close()


_MEMBER_SCRIPT = """
import sys
from confluent_kafka import Consumer
consumer = Consumer({"bootstrap.servers": sys.argv[1], "group.id": sys.argv[3],
                     "group.protocol": "consumer", "enable.auto.commit": False,
                     "auto.offset.reset": "earliest"})
consumer.subscribe([sys.argv[2]])
while True:
    consumer.poll(0.3)
    print(len(consumer.assignment()), flush=True)
"""


def _describe(cluster: LocalCluster, group: str) -> dict[str, Any]:
    run = run_cli("group", "describe", group, "--json", cluster=cluster.dir / "cluster.json",
                  timeout_s=CLI_TIMEOUT_S)  # fmt: skip
    assert run.returncode == 0, run.stderr
    described: dict[str, Any] = json.loads(run.stdout)
    return described


async def test_librdkafka_members_split_rebalance_and_survive_a_kill(
    cluster: LocalCluster, bootstrap: str, tmp_path: Path
) -> None:
    """Three members split six partitions (one in another process), a 4th joins and
    takes its share, the other process is killed with kill -9 and its partitions move to
    the rest once its session expires; every record is read and committed: lag 0."""
    topic, group, n = new_topic(), f"g-{uuid.uuid4().hex[:8]}", 60
    await create_topic(bootstrap.split(",", maxsplit=1)[0], topic)
    sent, _ = await asyncio.to_thread(kafka_python_roundtrip, bootstrap, topic, n)
    script = tmp_path / "member.py"
    script.write_text(_MEMBER_SCRIPT)
    c = MemberProcess(script, bootstrap, topic, group)
    stop = threading.Event()
    out: dict[str, Any] = {}
    tasks: list[asyncio.Task[None]] = []

    def run(name: str) -> None:
        member = functools.partial(_member, bootstrap, topic, group, stop, out, name)
        tasks.append(asyncio.create_task(asyncio.to_thread(member)))

    def split(names: str, other: int) -> bool:
        for task in tasks:
            if task.done():
                task.result()  # a member's failure ends the wait
        if any(name not in out for name in names):
            return False
        sets = [out[name][1] for name in names]
        union = set().union(*sets)
        disjoint = sum(map(len, sets)) == len(union)
        return disjoint and all(sets) and len(union) + other == PARTITIONS

    try:
        run("a")
        run("b")
        await wait_for(lambda: split("ab", c.held) and c.held > 0, "a, b, c split", timeout_s=90)
        run("d")
        await wait_for(lambda: split("abd", c.held) and c.held > 0, "d joins", timeout_s=90)
        c.kill()
        await wait_for(lambda: split("abd", 0), "c's partitions move", timeout_s=90)

        def read_all() -> bool:
            read: set[tuple[int, int]] = set().union(*(out[name][0] for name in "abd"))
            return read >= set(sent)

        await wait_for(read_all, "every record read", timeout_s=60)

        async def caught_up() -> dict[str, Any] | None:
            described = await asyncio.to_thread(_describe, cluster, group)
            return described if described["lag"] == 0 else None

        described = await wait_for(caught_up, "every record committed: lag 0", timeout_s=60)
        assert len(described["members"]) == 3
    finally:
        c.stop()
        stop.set()
        for task in tasks:
            await task
    committed = {(p["topic"], p["partition"]): p for p in described["partitions"]}
    assert {k[1] for k in committed} == set(range(PARTITIONS))


def _regex_member(bootstrap: str, pattern: str, group: str, stop: Any, got: set[str]) -> None:
    """A librdkafka member of the consumer protocol subscribed to ``pattern`` (a regex:
    librdkafka sends it as ``subscribed_topic_regex``), adding the topics of the
    records it reads to ``got`` until ``stop``."""
    from confluent_kafka import Consumer

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                         "group.protocol": "consumer", "auto.offset.reset": "earliest",
                         "topic.metadata.refresh.interval.ms": 1000})  # fmt: skip
    try:
        consumer.subscribe([pattern])
        while not stop.is_set():
            msg = consumer.poll(0.3)
            error = None if msg is None else msg.error()
            if error is not None and error.fatal():
                raise RuntimeError(f"regex member: {error}")
            if msg is not None and error is None:
                got.add(str(msg.topic()))
    finally:
        consumer.close()


async def test_a_regex_subscription_takes_matching_topics_also_new_ones(bootstrap: str) -> None:
    """librdkafka subscribed to ``^rx-TAG-.*`` with the consumer protocol reads the two
    matching topics, then a third created while it runs, never the one that does not
    match (Kafka matches the whole name: ``xrx-TAG-...`` is not ``^rx-TAG-.*``)."""
    tag = uuid.uuid4().hex[:6]
    first = bootstrap.split(",", maxsplit=1)[0]
    names = [f"rx-{tag}-a", f"rx-{tag}-b", f"x-rx-{tag}-c"]
    for name in names:
        await create_topic(first, name)
        await asyncio.to_thread(kafka_python_roundtrip, bootstrap, name, 6)
    stop, got = threading.Event(), set[str]()
    member = functools.partial(_regex_member, bootstrap, f"^rx-{tag}-.*", f"g-{tag}", stop, got)
    task = asyncio.create_task(asyncio.to_thread(member))

    def read(*topics: str) -> bool:
        if task.done():
            task.result()  # the member's failure ends the wait
        return got >= set(topics)

    try:
        await wait_for(lambda: read(*names[:2]), "the matching topics read", timeout_s=90)
        late = f"rx-{tag}-late"
        await create_topic(first, late)
        await asyncio.to_thread(kafka_python_roundtrip, bootstrap, late, 6)
        await wait_for(lambda: read(late), "the new matching topic read", timeout_s=90)
        assert names[2] not in got
    finally:
        stop.set()
        await task
