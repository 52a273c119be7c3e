"""Topics and groups, the pure parts: Kafka's partitioner and the assignors."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from foundation.errors import BadRequestError
from groups.assignors import assign, assignor_names
from groups.partitioner import StickyPartitioner, murmur2, partition_for_key

# Kafka's own test vectors (UtilsTest.testMurmur2 and librdkafka's rdmurmur2 cases):
# a user moving from Kafka keeps every key's partition only if these hold bit for bit.
KAFKA_MURMUR2 = {
    "21": -973932308,
    "foobar": -790332482,
    "a-little-bit-long-string": -985981536,
    "a-little-bit-longer-string": -1486304829,
    "lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    "abc": 479470107,
    "1": -1993445489,
    "12": 126087238,
    "123": -267702483,
    "1234": -1614185708,
    "12345": -1188365604,
    "kafka": -798503068,
}


@pytest.mark.parametrize(("key", "expected"), sorted(KAFKA_MURMUR2.items()))
def test_murmur2_matches_kafka(key: str, expected: int) -> None:
    assert murmur2(key.encode()) == expected


def test_partition_for_key_is_kafkas_default_partitioner() -> None:
    # Utils.toPositive(Utils.murmur2(key)) % numPartitions, computed by hand here.
    for key, h in KAFKA_MURMUR2.items():
        for n in (1, 3, 6, 10, 12, 100):
            assert partition_for_key(key.encode(), n) == (h & 0x7FFFFFFF) % n
    assert partition_for_key(b"foobar", 6) == 0  # Kafka: (-790332482 & 0x7fffffff) % 6
    with pytest.raises(BadRequestError):
        partition_for_key(b"k", 0)


def test_sticky_partitioner_sticks_then_moves_and_covers_all() -> None:
    sp = StickyPartitioner(random.Random(7))
    first = sp.partition("t", 6)
    assert all(sp.partition("t", 6) == first for _ in range(10))
    seen = {first}
    for _ in range(200):
        before = sp.partition("t", 6)
        sp.next_batch("t", 6)
        assert sp.partition("t", 6) != before
        seen.add(sp.partition("t", 6))
    assert seen == set(range(6))


def _check_valid(
    assignment: dict[str, set[tuple[str, int]]],
    members: dict[str, set[str]],
    partitions: dict[str, int],
) -> None:
    owners: dict[tuple[str, int], str] = {}
    for member, tps in assignment.items():
        for tp in tps:
            assert tp not in owners, f"{tp} owned twice"
            assert tp[0] in members[member], f"{member} not subscribed to {tp[0]}"
            owners[tp] = member
    wanted = {
        (t, p)
        for t, n in partitions.items()
        if any(t in s for s in members.values())
        for p in range(n)
    }
    assert set(owners) == wanted


def test_range_assignor_is_kafkas() -> None:
    members = {"c0": {"t"}, "c1": {"t"}, "c2": {"t"}}
    out = assign("range", members, {"t": 10})
    assert out == {
        "c0": {("t", p) for p in range(4)},
        "c1": {("t", p) for p in range(4, 7)},
        "c2": {("t", p) for p in range(7, 10)},
    }


def test_roundrobin_assignor_is_kafkas() -> None:
    members = {"a": {"t0", "t1"}, "b": {"t0", "t1"}}
    out = assign("roundrobin", members, {"t0": 3, "t1": 3})
    assert out == {"a": {("t0", 0), ("t0", 2), ("t1", 1)}, "b": {("t0", 1), ("t1", 0), ("t1", 2)}}


def test_unknown_assignor_is_a_clear_error() -> None:
    with pytest.raises(BadRequestError, match="unknown assignor 'bogus'"):
        assign("bogus", {"a": {"t"}}, {"t": 1})
    assert assignor_names() == ["cooperative-sticky", "range", "roundrobin"]


def test_sticky_moves_as_few_as_possible_when_a_fourth_member_joins() -> None:
    members = {f"m{i}": {"t"} for i in range(3)}
    before = assign("cooperative-sticky", members, {"t": 12})
    assert sorted(len(v) for v in before.values()) == [4, 4, 4]
    members["m3"] = {"t"}
    after = assign("cooperative-sticky", members, {"t": 12}, before)
    _check_valid(after, members, {"t": 12})
    assert sorted(len(v) for v in after.values()) == [3, 3, 3, 3]
    moved = sum(len(before[m] - after[m]) for m in before)
    assert moved == 3  # exactly what the new member takes
    for m in before:
        assert after[m] <= before[m]  # the others only give up, never swap


topics_st = st.dictionaries(st.sampled_from(["a", "b", "c"]), st.integers(1, 12), min_size=1)


@settings(max_examples=200, deadline=None)
@given(data=st.data(), partitions=topics_st, name=st.sampled_from(assignor_names()))
def test_every_assignor_gives_each_partition_one_subscribed_owner(
    data: st.DataObject, partitions: dict[str, int], name: str
) -> None:
    topics = sorted(partitions)
    members = data.draw(
        st.dictionaries(
            st.text("xyz", min_size=1, max_size=3),
            st.sets(st.sampled_from(topics), min_size=1),
            min_size=1,
            max_size=6,
        )
    )
    current = {
        m: data.draw(st.sets(st.tuples(st.sampled_from(topics), st.integers(0, 12))))
        for m in members
    }
    out = assign(name, members, partitions, current)
    assert set(out) == set(members)
    _check_valid(out, members, partitions)
    if name == "cooperative-sticky" and all(s == set(topics) for s in members.values()):
        counts = [len(v) for v in out.values()]
        assert max(counts) - min(counts) <= 1
