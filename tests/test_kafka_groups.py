"""Consumer groups over Kafka's protocol on Bookline's coordinators, with real clients
against a real local cluster: committed offsets of assign() consumers, subscribe() with
kafka-python, librdkafka (eager and cooperative-sticky) and aiokafka, members splitting
partitions, a member killed with kill -9, the group admin APIs, and kcat."""

from __future__ import annotations

import asyncio
import functools
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kafkaapi.protocol.apis_data import PRODUCE
from ops.cluster.local import LocalCluster
from tests.kafka_cluster import (
    PARTITIONS,
    bootstrap_of,
    create_topic,
    kafka_call,
    kafka_cluster,
    kafka_python_roundtrip,
    leader_address,
    new_topic,
    one_record_batch,
    produce_body,
)
from tests.waiting import wait_for


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with kafka_cluster(tmp_path_factory.mktemp("kafka-cluster")) as c:
        yield c


@pytest.fixture(scope="module")
def bootstrap(cluster: LocalCluster) -> str:
    return bootstrap_of(cluster)


def _kafka_python_commit(bootstrap: str, topic: str, group: str) -> dict[int, int | None]:
    from kafka import KafkaConsumer, OffsetAndMetadata, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    try:
        parts = [TopicPartition(topic, p) for p in range(2)]
        consumer.assign(parts)
        consumer.commit({parts[0]: OffsetAndMetadata(3, "", -1)})
    finally:
        consumer.close()
    fresh = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    try:
        return {p: fresh.committed(TopicPartition(topic, p)) for p in range(2)}
    finally:
        fresh.close()


def _confluent_commit(bootstrap: str, topic: str, group: str) -> dict[int, int]:
    from confluent_kafka import Consumer, TopicPartition

    conf = {"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False}
    consumer = Consumer(conf)
    try:
        consumer.assign([TopicPartition(topic, 1, 0)])
        consumer.commit(offsets=[TopicPartition(topic, 1, 2)], asynchronous=False)
        got = consumer.committed([TopicPartition(topic, p) for p in range(2)], timeout=30)
        return {tp.partition: tp.offset for tp in got}
    finally:
        consumer.close()


async def test_committed_offsets_of_assign_consumers(bootstrap: str) -> None:
    """OffsetCommit/OffsetFetch on the group coordinators: kafka-python and librdkafka
    consumers that assign() partitions commit and read back the group's offsets."""
    address = bootstrap.split(",", maxsplit=1)[0]
    topic, group = new_topic(), f"g-{uuid.uuid4().hex[:8]}"
    await create_topic(address, topic, partitions=2)
    leader = await leader_address(address, topic, 0)
    for p in range(2):
        for _ in range(4):
            await kafka_call(leader if p == 0 else await leader_address(address, topic, 1),
                        PRODUCE, 9, produce_body(topic, p, one_record_batch(b"v")))  # fmt: skip
    assert await asyncio.to_thread(_kafka_python_commit, bootstrap, topic, group) == {
        0: 3,
        1: None,
    }
    # librdkafka commits partition 1 of the same group and sees both (-1001: none).
    assert await asyncio.to_thread(_confluent_commit, bootstrap, topic, group) == {0: 3, 1: 2}


def _kafka_python_subscribe(bootstrap: str, topic: str, group: str, n: int) -> set[tuple[int, int]]:
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group,
                             enable_auto_commit=False, auto_offset_reset="earliest",
                             session_timeout_ms=10_000, heartbeat_interval_ms=500)  # fmt: skip
    try:
        got: set[tuple[int, int]] = set()
        deadline = time.monotonic() + 60
        while len(got) < n and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=500).values():
                got.update((r.partition, r.offset) for r in records)
        consumer.commit()
        return got
    finally:
        consumer.close()


def _confluent_subscribe(bootstrap: str, topic: str, group: str, n: int) -> set[tuple[int, int]]:
    from confluent_kafka import Consumer

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                         "enable.auto.commit": False, "auto.offset.reset": "earliest",
                         "session.timeout.ms": 10_000})  # fmt: skip
    try:
        consumer.subscribe([topic])
        got: set[tuple[int, int]] = set()
        deadline = time.monotonic() + 60
        while len(got) < n and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                where: Any = (msg.partition(), msg.offset())
                got.add(where)
        consumer.commit(asynchronous=False)
        return got
    finally:
        consumer.close()


async def _aiokafka_subscribe(
    bootstrap: str, topic: str, group: str, n: int
) -> set[tuple[int, int]]:
    from aiokafka import AIOKafkaConsumer

    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group,
                                enable_auto_commit=False, auto_offset_reset="earliest",
                                session_timeout_ms=10_000, heartbeat_interval_ms=500)  # fmt: skip
    await consumer.start()
    try:
        got: set[tuple[int, int]] = set()
        deadline = time.monotonic() + 60
        while len(got) < n and time.monotonic() < deadline:
            for records in (await consumer.getmany(timeout_ms=500)).values():
                got.update((r.partition, r.offset) for r in records)
        await consumer.commit()
        return got
    finally:
        await consumer.stop()


@pytest.mark.parametrize("client", ["kafka-python", "confluent-kafka", "aiokafka"])
async def test_a_subscribed_consumer_gets_every_partition_and_commits(
    bootstrap: str, client: str
) -> None:
    """JoinGroup/SyncGroup/Heartbeat on Bookline's coordinator: a lone member is given
    every partition, reads them all, commits; the group's offsets are its end offsets."""
    topic, group, n = new_topic(), f"g-{uuid.uuid4().hex[:8]}", 30
    await create_topic(bootstrap.split(",", maxsplit=1)[0], topic)
    sent, _ = await asyncio.to_thread(kafka_python_roundtrip, bootstrap, topic, n)
    if client == "kafka-python":
        got = await asyncio.to_thread(_kafka_python_subscribe, bootstrap, topic, group, n)
    elif client == "confluent-kafka":
        got = await asyncio.to_thread(_confluent_subscribe, bootstrap, topic, group, n)
    else:
        got = await _aiokafka_subscribe(bootstrap, topic, group, n)
    assert got == set(sent)
    committed = await asyncio.to_thread(_committed, bootstrap, topic, group)
    ends = {p: sum(q == p for q, _ in sent) for p in range(PARTITIONS)}
    # An empty partition's position may be committed (0) or not (None), per client.
    assert {p: o if o is not None or ends[p] else 0 for p, o in committed.items()} == ends


def _committed(bootstrap: str, topic: str, group: str) -> dict[int, int | None]:
    from kafka import KafkaConsumer, TopicPartition

    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
    try:
        return {p: consumer.committed(TopicPartition(topic, p)) for p in range(PARTITIONS)}
    finally:
        consumer.close()


def _member(  # noqa: PLR0917 - one thread's arguments
    bootstrap: str, topic: str, group: str, stop: Any, out: dict[str, Any], name: str
) -> None:
    """A kafka-python member polling until ``stop``; its records and final assignment."""
    from kafka import KafkaConsumer

    consumer = KafkaConsumer(topic, bootstrap_servers=bootstrap, group_id=group,
                             enable_auto_commit=False, auto_offset_reset="earliest",
                             session_timeout_ms=10_000, heartbeat_interval_ms=300)  # fmt: skip
    got: set[tuple[int, int]] = set()
    try:
        while not stop.is_set():
            for records in consumer.poll(timeout_ms=300).values():
                got.update((r.partition, r.offset) for r in records)
            out[name] = (set(got), {tp.partition for tp in consumer.assignment()})
    finally:
        consumer.close()


async def test_two_members_split_the_partitions(bootstrap: str) -> None:
    """A second member joining takes some partitions over: in the end the members hold
    disjoint sets covering every partition, and every record was read."""
    import threading

    from tests.waiting import wait_for

    topic, group, n = new_topic(), f"g-{uuid.uuid4().hex[:8]}", 60
    await create_topic(bootstrap.split(",", maxsplit=1)[0], topic)
    sent, _ = await asyncio.to_thread(kafka_python_roundtrip, bootstrap, topic, n)
    stop = threading.Event()
    out: dict[str, Any] = {}
    a = asyncio.create_task(asyncio.to_thread(_member, bootstrap, topic, group, stop, out, "a"))
    b: asyncio.Task[None] | None = None
    try:
        await wait_for(lambda: "a" in out and len(out["a"][1]) == PARTITIONS, "a holds all")
        b = asyncio.create_task(asyncio.to_thread(_member, bootstrap, topic, group, stop, out, "b"))

        def split() -> bool:
            if "b" not in out:
                return False
            held_a, held_b = out["a"][1], out["b"][1]
            whole = held_a | held_b == set(range(PARTITIONS))
            return bool(held_b) and not held_a & held_b and whole

        await wait_for(split, "the partitions split between a and b", timeout_s=60)
        await wait_for(lambda: out["a"][0] | out["b"][0] >= set(sent), "every record read")
    finally:
        stop.set()
        await a
        if b is not None:
            await b


def _admin_groups(bootstrap: str, group: str) -> tuple[set[str], str, set[str]]:
    from kafka.admin import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30_000)
    try:
        listed = {g["group_id"] for g in admin.list_groups()}
        described = admin.describe_groups([group])[group]
        admin.delete_groups([group])
        after = {g["group_id"] for g in admin.list_groups()}
        return listed, str(described["group_state"]), after
    finally:
        admin.close()


def _describe_cluster(bootstrap: str) -> int:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    return len(admin.describe_cluster(request_timeout=30).result(60).nodes)


async def test_admin_clients_list_describe_and_delete_groups(bootstrap: str) -> None:
    topic, group = new_topic(), f"g-{uuid.uuid4().hex[:8]}"
    address = bootstrap.split(",", maxsplit=1)[0]
    await create_topic(address, topic, partitions=2)
    leader = await leader_address(address, topic, 0)
    for _ in range(4):
        await kafka_call(leader, PRODUCE, 9, produce_body(topic, 0, one_record_batch(b"v")))
    await asyncio.to_thread(_kafka_python_commit, bootstrap, topic, group)
    listed, state, after = await asyncio.to_thread(_admin_groups, bootstrap, group)
    assert group in listed and state == "Empty" and group not in after
    assert await asyncio.to_thread(_describe_cluster, bootstrap) == 3


def _confluent_member(  # noqa: PLR0917 - one thread's arguments
    bootstrap: str, topic: str, group: str, stop: Any, out: dict[str, Any], name: str
) -> None:
    """A librdkafka member with the cooperative-sticky assignor, polling until ``stop``."""
    from confluent_kafka import Consumer

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group,
                         "partition.assignment.strategy": "cooperative-sticky",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest",
                         "session.timeout.ms": 10_000, "heartbeat.interval.ms": 300})  # fmt: skip
    got: set[tuple[int, int]] = set()
    try:
        consumer.subscribe([topic])
        while not stop.is_set():
            msg = consumer.poll(0.3)
            if msg is not None and msg.error() is None:
                where: Any = (msg.partition(), msg.offset())
                got.add(where)
            out[name] = (set(got), {tp.partition for tp in consumer.assignment()})
    finally:
        consumer.close()


async def test_cooperative_librdkafka_members_split_the_partitions(bootstrap: str) -> None:
    """librdkafka's cooperative-sticky members (incremental assign and unassign): the
    second one takes some partitions over, the two hold disjoint sets covering every
    partition, and every record is read."""
    import threading

    from tests.waiting import wait_for

    topic, group, n = new_topic(), f"g-{uuid.uuid4().hex[:8]}", 60
    await create_topic(bootstrap.split(",", maxsplit=1)[0], topic)
    sent, _ = await asyncio.to_thread(kafka_python_roundtrip, bootstrap, topic, n)
    stop = threading.Event()
    out: dict[str, Any] = {}

    def run(name: str) -> asyncio.Task[None]:
        member = functools.partial(_confluent_member, bootstrap, topic, group, stop, out, name)
        return asyncio.create_task(asyncio.to_thread(member))

    a = run("a")
    b: asyncio.Task[None] | None = None
    try:
        await wait_for(lambda: "a" in out and len(out["a"][1]) == PARTITIONS, "a holds all")
        b = run("b")

        def split() -> bool:
            if "b" not in out:
                return False
            held_a, held_b = out["a"][1], out["b"][1]
            whole = held_a | held_b == set(range(PARTITIONS))
            return bool(held_a) and bool(held_b) and not held_a & held_b and whole

        await wait_for(split, "the partitions split between a and b", timeout_s=60)
        await wait_for(lambda: out["a"][0] | out["b"][0] >= set(sent), "every record read")
    finally:
        stop.set()
        await a
        if b is not None:
            await b


_MEMBER_SCRIPT = """
import sys
from kafka import KafkaConsumer
consumer = KafkaConsumer(sys.argv[2], bootstrap_servers=sys.argv[1], group_id=sys.argv[3],
                         enable_auto_commit=False, session_timeout_ms=6000,
                         heartbeat_interval_ms=300)
while True:
    consumer.poll(timeout_ms=300)
    print(len(consumer.assignment()), flush=True)
"""


async def test_a_killed_members_partitions_move_within_its_session_timeout(
    bootstrap: str, tmp_path: Path
) -> None:
    """A member in another process, kill -9: once its session (6 s) expires the other
    member holds every partition."""
    import threading

    from tests.kafka_support import MemberProcess
    from tests.waiting import wait_for

    topic, group = new_topic(), f"g-{uuid.uuid4().hex[:8]}"
    await create_topic(bootstrap.split(",", maxsplit=1)[0], topic)
    script = tmp_path / "member.py"
    script.write_text(_MEMBER_SCRIPT)
    first = MemberProcess(script, bootstrap, topic, group)
    stop = threading.Event()
    out: dict[str, Any] = {}
    b: asyncio.Task[None] | None = None
    try:
        await wait_for(lambda: first.held == PARTITIONS, "the first member holds all")
        b = asyncio.create_task(asyncio.to_thread(_member, bootstrap, topic, group, stop, out, "b"))
        await wait_for(lambda: 0 < first.held < PARTITIONS and "b" in out and out["b"][1],
                       "the partitions split")  # fmt: skip
        first.kill()
        await wait_for(lambda: len(out["b"][1]) == PARTITIONS, "b holds every partition")
    finally:
        first.stop()
        stop.set()
        if b is not None:
            await b


def _kcat(*args: str, stdin: bytes = b"") -> str:
    import subprocess

    done = subprocess.run(  # checked below: a failure shows kcat's own words
        ["kcat", *args], check=False, input=stdin, capture_output=True, timeout=120
    )
    assert done.returncode == 0, done.stderr.decode()
    return done.stdout.decode()


async def test_kcat_lists_produces_and_consumes(bootstrap: str) -> None:
    """kcat's -L (metadata), -P (keyed produce) and -C (consume to the end), and -G (a
    balanced consumer group) against the listeners."""
    import shutil

    if shutil.which("kcat") is None:
        pytest.fail("kcat is not installed (ops/setup.sh installs it)")
    topic = new_topic()
    await create_topic(bootstrap.split(",", maxsplit=1)[0], topic, partitions=2)
    listing = await asyncio.to_thread(_kcat, "-b", bootstrap, "-L", "-t", topic)
    assert f'topic "{topic}" with 2 partitions' in listing
    lines = b"".join(f"k{i}:v{i}\n".encode() for i in range(10))
    await asyncio.to_thread(_kcat, "-b", bootstrap, "-P", "-t", topic, "-K:", stdin=lines)
    out = await asyncio.to_thread(
        _kcat, "-b", bootstrap, "-C", "-t", topic, "-e", "-f", "%k=%s@%o\\n"
    )
    assert sorted(line.split("@")[0] for line in out.splitlines()) == sorted(
        f"k{i}=v{i}" for i in range(10)
    )
    group = f"g-{uuid.uuid4().hex[:8]}"
    out = await asyncio.to_thread(
        _kcat, "-b", bootstrap, "-G", group, "-o", "beginning", "-e", "-f", "%s\\n", topic
    )
    assert sorted(out.split()) == sorted(f"v{i}" for i in range(10))


def _confluent_listed(bootstrap: str, stable_only: bool) -> set[str]:
    from confluent_kafka import ConsumerGroupState
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap})
    states = {ConsumerGroupState.STABLE} if stable_only else set()
    listed = admin.list_consumer_groups(states=states, request_timeout=30).result(60)
    assert not listed.errors, listed.errors
    return {g.group_id for g in listed.valid}


async def test_list_groups_answers_each_groups_state_once_and_filters_by_it(
    bootstrap: str,
) -> None:
    """Every broker's ListGroups together list each group once with its state and type
    (a group with a live Kafka member Stable, one with only committed offsets Empty),
    and ``states_filter`` keeps only the groups in those states, as librdkafka's admin
    client asks."""
    import threading

    from kafkaapi.protocol.apis_groups import LIST_GROUPS

    topic, live, idle = new_topic(), f"g-{uuid.uuid4().hex[:8]}", f"g-{uuid.uuid4().hex[:8]}"
    address = bootstrap.split(",", maxsplit=1)[0]
    await create_topic(address, topic, partitions=2)
    leader = await leader_address(address, topic, 0)
    for _ in range(4):
        await kafka_call(leader, PRODUCE, 9, produce_body(topic, 0, one_record_batch(b"v")))
    await asyncio.to_thread(_kafka_python_commit, bootstrap, topic, idle)
    stop, out = threading.Event(), dict[str, Any]()
    member = asyncio.create_task(asyncio.to_thread(_member, bootstrap, topic, live, stop, out, "a"))

    async def listed(*states: str) -> list[tuple[str, str, str]]:
        body = {"states_filter": list(states), "types_filter": []}
        answers = [await kafka_call(a, LIST_GROUPS, 5, body) for a in bootstrap.split(",")]
        return [
            (g["group_id"], g["group_state"], g["group_type"])
            for answer in answers
            for g in answer["groups"]
            if g["group_id"] in (live, idle)
        ]

    try:
        await wait_for(lambda: len(out.get("a", ((), ()))[1]) == 2, "the member holds both")
        both = sorted(await listed())
        assert both == sorted([(live, "Stable", "classic"), (idle, "Empty", "classic")])
        assert await listed("Stable") == [(live, "Stable", "classic")]
        assert await listed("Empty") == [(idle, "Empty", "classic")]
        stable = await asyncio.to_thread(_confluent_listed, bootstrap, True)
        assert live in stable and idle not in stable
        assert {live, idle} <= await asyncio.to_thread(_confluent_listed, bootstrap, False)
    finally:
        stop.set()
        await member
