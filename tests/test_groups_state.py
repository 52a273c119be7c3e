"""A consumer group's rules (groups.state), with an injected clock and no I/O."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from foundation.errors import (
    BadRequestError,
    GroupNotEmptyError,
    NotAssignedError,
    OutOfRangeError,
    StaleGenerationError,
)
from groups.state import GroupState

SESSION = 10_000
END = 1_000  # every partition's end offset in these tests


def end(_tp: tuple[str, int]) -> int:
    return END


def _join(g: GroupState, now: int, **kw: object) -> tuple[str, int, frozenset[tuple[str, int]]]:
    args: dict[str, object] = {
        "member_id": None,
        "instance_id": None,
        "topics": ["t"],
        "assignor": "cooperative-sticky",
        "session_timeout_ms": SESSION,
    }
    args.update(kw)
    r = g.join(now, **args)  # type: ignore[arg-type]
    return r.member_id, r.generation, r.partitions


def _settle(g: GroupState, now: int) -> dict[str, frozenset[tuple[str, int]]]:
    """Every member heartbeats until nothing moves, each owning what it was given."""
    for _ in range(10):
        before = {m: frozenset(x.owned) for m, x in g.members.items()}
        for member_id in list(g.members):
            got = g.heartbeat(now, member_id, g.generation, g.members[member_id].owned)
            g.heartbeat(now, member_id, g.generation, got)
        if before == {m: frozenset(x.owned) for m, x in g.members.items()}:
            break
    return {m: frozenset(x.owned) for m, x in g.members.items()}


def _owners_unique(owned: dict[str, frozenset[tuple[str, int]]], n: int) -> None:
    seen = [tp for tps in owned.values() for tp in tps]
    assert len(seen) == len(set(seen)), owned
    assert set(seen) == {("t", p) for p in range(n)}


def test_three_members_share_ten_partitions_each_owned_once() -> None:
    g = GroupState("g", {"t": 10})
    for _ in range(3):
        _join(g, 0)
    owned = _settle(g, 0)
    _owners_unique(owned, 10)
    assert sorted(len(v) for v in owned.values()) == [3, 3, 4]


def test_a_fourth_member_gets_partitions_only_once_their_owner_let_go() -> None:
    g = GroupState("g", {"t": 12})
    members = [_join(g, 0)[0] for _ in range(3)]
    before = _settle(g, 0)
    gen_before = g.generation
    new, gen, now_parts = _join(g, 1)
    assert gen == gen_before + 1
    assert now_parts == frozenset()  # everything it will get is still owned by others
    # The old members keep consuming what they keep, and learn what to give up.
    for m in members:
        with pytest.raises(StaleGenerationError):
            g.heartbeat(1, m, gen_before, before[m])
        r = g.join(
            1,
            member_id=m,
            instance_id=None,
            topics=["t"],
            assignor="cooperative-sticky",
            session_timeout_ms=SESSION,
            owned=before[m],
        )
        assert not r.rebalanced
        assert r.partitions <= before[m]  # never anything new before a handoff
        assert len(before[m]) - len(r.partitions) == 1  # each gives up one
        g.heartbeat(1, m, gen, r.partitions)  # stops consuming the moved one
    assert len(g.heartbeat(2, new, gen, ())) == 3
    owned = _settle(g, 2)
    _owners_unique(owned, 12)
    assert sorted(len(v) for v in owned.values()) == [3, 3, 3, 3]


def test_an_expired_member_is_replaced_and_cannot_commit() -> None:
    g = GroupState("g", {"t": 4})
    a, _, _ = _join(g, 0)
    b, _, _ = _join(g, 0, session_timeout_ms=2_000)
    owned = _settle(g, 0)
    gen = g.generation
    g.heartbeat(5_000, a, gen, owned[a])  # a keeps its session alive; b is paused
    assert g.expire(5_000) == [b]
    assert g.generation == gen + 1
    with pytest.raises(StaleGenerationError):
        g.check_commit(b, gen, {next(iter(owned[b])): 5}, end)
    with pytest.raises(StaleGenerationError):
        g.heartbeat(5_001, b, gen, owned[b])
    r = g.join(
        5_001,
        member_id=a,
        instance_id=None,
        topics=["t"],
        assignor="cooperative-sticky",
        session_timeout_ms=SESSION,
        owned=owned[a],
    )
    assert r.partitions == {("t", p) for p in range(4)}


def test_a_static_member_restarted_in_time_gets_its_partitions_without_a_rebalance() -> None:
    g = GroupState("g", {"t": 6})
    s, _, _ = _join(g, 0, instance_id="host-1")
    _join(g, 0)
    owned = _settle(g, 0)
    gen = g.generation
    assert not g.leave(s)  # a static member's close keeps its place
    s2, gen2, parts = _join(g, 3_000, instance_id="host-1")
    assert s2 != s
    assert gen2 == gen
    assert parts == owned[s]
    with pytest.raises(StaleGenerationError):  # the old incarnation is fenced
        g.check_commit(s, gen, {next(iter(owned[s])): 1}, end)


def test_commits_only_for_held_partitions_within_the_end() -> None:
    g = GroupState("g", {"t": 2})
    a, gen, _ = _join(g, 0)
    b, _, _ = _join(g, 0)
    owned = _settle(g, 0)
    gen = g.generation
    mine = next(iter(owned[a]))
    theirs = next(iter(owned[b]))
    g.check_commit(a, gen, {mine: 10}, end)
    with pytest.raises(NotAssignedError):
        g.check_commit(a, gen, {theirs: 10}, end)
    with pytest.raises(OutOfRangeError):
        g.check_commit(a, gen, {mine: END + 1}, end)
    with pytest.raises(BadRequestError):
        g.check_commit(a, gen, {mine: -1}, end)


def test_bad_joins_are_clear_errors_and_change_nothing() -> None:
    g = GroupState("g", {"t": 2})
    with pytest.raises(BadRequestError, match="unknown assignor 'sticky-ish'"):
        _join(g, 0, assignor="sticky-ish")
    with pytest.raises(BadRequestError, match="unknown topic"):
        _join(g, 0, topics=["nope"])
    with pytest.raises(BadRequestError, match="session timeout"):
        _join(g, 0, session_timeout_ms=10)
    assert g.generation == 0
    assert not g.members
    _join(g, 0, assignor="range")
    with pytest.raises(BadRequestError, match="uses the 'range' assignor"):
        _join(g, 0, assignor="roundrobin")
    assert len(g.members) == 1


def test_offsets_reset_only_when_the_group_is_empty() -> None:
    g = GroupState("g", {"t": 1})
    a, _, _ = _join(g, 0)
    with pytest.raises(GroupNotEmptyError):
        g.reset_offsets({("t", 0): 0}, end)
    g.leave(a)
    g.reset_offsets({("t", 0): 7}, end)
    assert g.offsets == {("t", 0): 7}


def test_a_snapshot_restores_membership_and_assignment() -> None:
    g = GroupState("g", {"t": 5})
    ids = [_join(g, 0)[0] for _ in range(2)]
    _settle(g, 0)
    h = GroupState("g")
    h.restore(g.snapshot(), now_ms=100)
    assert h.generation == g.generation
    for m in ids:
        assert h.members[m].assigned == g.members[m].assigned
        assert h.heartbeat(100, m, g.generation, g.members[m].owned) == frozenset(
            g.members[m].assigned
        )


def test_a_growing_topic_rebalances_and_never_shrinks() -> None:
    g = GroupState("g", {"t": 2})
    _join(g, 0)
    gen = g.generation
    assert g.set_partitions({"t": 4})
    assert g.generation == gen + 1
    assert not g.set_partitions({"t": 4})


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_random_membership_changes_never_give_a_partition_two_consumers(seed: int) -> None:
    rng = random.Random(seed)
    g = GroupState("g", {"t": rng.randint(1, 12)})
    now = 0
    for _ in range(30):
        now += rng.randint(0, 3_000)
        action = rng.random()
        if action < 0.4 or not g.members:
            _join(g, now, session_timeout_ms=rng.choice([2_000, SESSION]))
        elif action < 0.55:
            g.leave(rng.choice(list(g.members)))
        elif action < 0.7:
            g.expire(now)
        # Members heartbeat (some late); each consumes exactly what it was last given.
        for member_id in list(g.members):
            if rng.random() < 0.8:
                m = g.members[member_id]
                try:
                    got = g.heartbeat(now, member_id, g.generation, m.owned)
                except StaleGenerationError:
                    continue
                g.heartbeat(now, member_id, g.generation, got)
        consumed = [tp for m in g.members.values() for tp in m.owned]
        assert len(consumed) == len(set(consumed)), (seed, g.snapshot())
