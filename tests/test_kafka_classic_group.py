"""Kafka's classic group state machine (kafkaapi/classic_group.py), pure: the join
barrier, the leader's assignment relayed verbatim, heartbeats during a rebalance,
session expiry, MEMBER_ID_REQUIRED, static membership and offset commit checks."""

from __future__ import annotations

import struct
from typing import Any

from kafkaapi.classic_group import (
    COMPLETING,
    EMPTY,
    PREPARING,
    STABLE,
    ClassicConfig,
    ClassicGroup,
    JoinAnswer,
    JoinArgs,
    Refused,
    SyncAnswer,
    SyncArgs,
)
from kafkaapi.consumer_protocol import decode_assignment, decode_subscription, encode_assignment

SESSION_MS = 10_000
REBALANCE_MS = 30_000
DELAY_MS = 3_000


def _group() -> ClassicGroup:
    return ClassicGroup("g", ClassicConfig(initial_delay_ms=DELAY_MS))


def _args(
    member_id: str = "",
    *,
    instance: str | None = None,
    meta: bytes = b"m",
    protocols: tuple[str, ...] = ("range",),
    v4: bool = False,
    v9: bool = False,
    session_ms: int = SESSION_MS,
) -> JoinArgs:
    return JoinArgs(
        member_id,
        instance,
        session_ms,
        REBALANCE_MS,
        "consumer",
        tuple((p, meta) for p in protocols),
        v4,
        client_id="c",
        supports_skip_assignment=v9,
    )


class Box:
    """Drives a group, collecting each ticket's answer."""

    def __init__(self, group: ClassicGroup) -> None:
        self.group = group
        self.answers: dict[int, Any] = {}
        self.next = 0

    def _drain(self) -> None:
        for ticket, answer in self.group.outbox:
            self.answers[ticket] = answer
        self.group.outbox.clear()

    def join(self, now: int, args: JoinArgs) -> int:
        self.next += 1
        self.group.join(now, self.next, args)
        self._drain()
        return self.next

    def sync(
        self, now: int, member: str, generation: int, assignments: dict[str, bytes] | None = None
    ) -> int:
        self.next += 1
        self.group.sync(
            now, self.next, SyncArgs(member, None, generation, None, None, assignments or {})
        )
        self._drain()
        return self.next

    def tick(self, now: int) -> None:
        self.group.tick(now)
        self._drain()


def _stable_group_of(box: Box, n: int) -> list[str]:
    """n members joined in one generation, the leader's assignment synced."""
    tickets = [box.join(0, _args(meta=f"m{i}".encode())) for i in range(n)]
    assert not any(t in box.answers for t in tickets)  # the initial delay holds them
    box.tick(DELAY_MS)
    answers = [box.answers[t] for t in tickets]
    members = [a.member_id for a in answers]
    assert {a.generation for a in answers} == {1} and box.group.state == COMPLETING
    leader = answers[0].leader
    for a in answers:
        assert a.leader == leader
        assert (len(a.members) == n) == (a.member_id == leader)
    assignment = {m: f"assignment of {m}".encode() for m in members}
    follower_syncs = [box.sync(DELAY_MS, m, 1) for m in members if m != leader]
    assert not any(t in box.answers for t in follower_syncs)  # wait for the leader
    box.sync(DELAY_MS, leader, 1, assignment)
    assert box.group.state == STABLE
    for m, t in zip([m for m in members if m != leader], follower_syncs, strict=True):
        assert box.answers[t] == SyncAnswer("NONE", assignment[m], "consumer", "range")
    return members


def test_the_leader_gets_every_members_metadata_and_its_assignment_is_relayed() -> None:
    box = Box(_group())
    _stable_group_of(box, 3)


def test_a_new_member_rebalances_heartbeats_say_so_and_commits_wait() -> None:
    box = Box(_group())
    members = _stable_group_of(box, 2)
    g = box.group
    assert g.heartbeat(4_000, members[0], None, 1) == "NONE"
    newcomer = box.join(4_000, _args())
    assert g.state == PREPARING and newcomer not in box.answers
    assert g.heartbeat(4_100, members[0], None, 1) == "REBALANCE_IN_PROGRESS"
    # Eager members commit what they give up at the generation they had.
    assert g.check_commit(members[0], None, 1) == "NONE"
    rejoins = [box.join(4_200, _args(m, meta=f"m{i}".encode())) for i, m in enumerate(members)]
    for t in [*rejoins, newcomer]:
        assert isinstance(box.answers[t], JoinAnswer) and box.answers[t].generation == 2
    assert g.state == COMPLETING
    assert g.check_commit(members[0], None, 2) == "REBALANCE_IN_PROGRESS"
    assert g.heartbeat(4_300, members[0], None, 1) == "ILLEGAL_GENERATION"
    assert g.heartbeat(4_300, "nobody", None, 2) == "UNKNOWN_MEMBER_ID"


def test_a_member_not_rejoining_is_dropped_at_the_rebalance_timeout() -> None:
    box = Box(_group())
    members = _stable_group_of(box, 2)
    t = box.join(4_000, _args())  # a newcomer: a rebalance
    box.join(4_000, _args(members[0], meta=b"m0"))
    # members[1] keeps heartbeating but never rejoins: dropped at the barrier's end.
    box.group.heartbeat(10_000, members[1], None, 1)
    box.tick(4_000 + REBALANCE_MS)
    assert box.answers[t].generation == 2 and set(box.group.members) == {
        members[0],
        box.answers[t].member_id,
    }


def test_an_expired_session_starts_a_rebalance() -> None:
    box = Box(_group())
    members = _stable_group_of(box, 2)
    box.group.heartbeat(5_000, members[0], None, 1)
    box.tick(DELAY_MS + SESSION_MS)  # members[1] never heartbeated since its sync
    assert members[1] not in box.group.members and box.group.state == PREPARING
    t = box.join(DELAY_MS + SESSION_MS, _args(members[0], meta=b"m0"))
    assert box.answers[t].generation == 2  # the barrier ends: everybody rejoined


def test_member_id_required_then_the_join_with_it() -> None:
    box = Box(_group())
    t = box.join(0, _args(v4=True))
    first = box.answers[t]
    assert first.error == "MEMBER_ID_REQUIRED" and first.member_id
    assert box.group.state == EMPTY and not box.group.members
    t = box.join(10, _args(first.member_id, v4=True))
    box.tick(10 + DELAY_MS)
    assert box.answers[t].member_id == first.member_id and box.answers[t].generation == 1


def test_inconsistent_protocols_are_refused() -> None:
    box = Box(_group())
    _stable_group_of(box, 1)
    t = box.join(4_000, _args(protocols=("roundrobin",)))
    assert box.answers[t].error == "INCONSISTENT_GROUP_PROTOCOL"
    t = box.join(4_000, _args(protocols=()))
    assert box.answers[t].error == "INCONSISTENT_GROUP_PROTOCOL"


def test_the_protocol_all_support_with_most_votes_is_chosen() -> None:
    box = Box(_group())
    a = box.join(0, _args(protocols=("cooperative-sticky", "range")))
    b = box.join(0, _args(protocols=("range", "cooperative-sticky")))
    c = box.join(0, _args(protocols=("range",)))
    box.tick(DELAY_MS)
    assert {box.answers[t].protocol_name for t in (a, b, c)} == {"range"}


def test_a_static_member_restarting_gets_its_assignment_without_a_rebalance() -> None:
    box = Box(_group())
    s = box.join(0, _args(instance="i-1", meta=b"s"))
    d = box.join(0, _args(meta=b"d"))
    box.tick(DELAY_MS)
    old, other = box.answers[s].member_id, box.answers[d].member_id
    leader = box.answers[s].leader
    box.sync(DELAY_MS, other if leader == old else old, 1)  # the follower
    box.sync(DELAY_MS, leader, 1, {old: b"static's", other: b"other's"})
    assert box.group.state == STABLE
    # It restarts (a new process, no member id, JoinGroup v9) with the same protocols.
    t = box.join(5_000, _args(instance="i-1", meta=b"s", v9=True))
    again = box.answers[t]
    assert again.error == "NONE" and again.generation == 1 and again.member_id != old
    # A restarted leader is told to skip assigning (JoinGroup v9's skip_assignment).
    assert again.skip_assignment == (leader == old)
    assert box.group.state == STABLE  # nobody else is disturbed
    assert box.group.heartbeat(5_000, other, None, 1) == "NONE"
    synced = box.sync(5_000, again.member_id, 1)
    assert box.answers[synced].assignment == b"static's"
    # The old incarnation is fenced; leaving by instance id names the new one.
    assert box.group.heartbeat(5_000, old, "i-1", 1) == "FENCED_INSTANCE_ID"
    assert box.group.leave(5_100, "", "i-1") == "NONE"
    assert again.member_id not in box.group.members and box.group.state == PREPARING


def _two_static_members(box: Box, *protocols: tuple[str, ...]) -> tuple[str, str]:
    """Static members i-1 (the leader: it joined first) and i-2, Stable at generation 1,
    the leader's assignment "1's" and "2's"; their member ids."""
    t1 = box.join(0, _args(instance="i-1", meta=b"1", protocols=protocols[0]))
    t2 = box.join(0, _args(instance="i-2", meta=b"2", protocols=protocols[-1]))
    box.tick(DELAY_MS)
    one, two = box.answers[t1].member_id, box.answers[t2].member_id
    assert box.answers[t1].leader == one
    box.sync(DELAY_MS, two, 1)
    box.sync(DELAY_MS, one, 1, {one: b"1's", two: b"2's"})
    assert box.group.state == STABLE
    return one, two


def test_a_restarted_static_leader_before_join_v9_is_told_the_previous_leader() -> None:
    """JoinGroup before v9 has no skip_assignment: a restarted leader told it leads would
    run its assignor and watch its fresh metadata, and rejoin (a rebalance of all) when
    that arrives. Kafka names the previous leader's id instead: it acts as a follower."""
    box = Box(_group())
    one, two = _two_static_members(box, ("range",))
    t = box.join(5_000, _args(instance="i-1", meta=b"1"))
    again = box.answers[t]
    assert (again.error, again.generation, again.leader) == ("NONE", 1, one)
    assert (again.members, again.skip_assignment) == ((), False)
    assert box.group.leader == again.member_id  # it leads the next rebalance
    assert box.group.state == STABLE
    assert box.answers[box.sync(5_000, again.member_id, 1)].assignment == b"1's"
    assert box.group.heartbeat(5_000, two, "i-2", 1) == "NONE"


def test_a_restarted_static_members_second_join_rebalances_only_if_it_leads() -> None:
    """kafka-python may send a second JoinGroup right after its SyncGroup (when join and
    sync outlast one poll). Kafka answers it as any member's JoinGroup in Stable: a
    follower's with the same metadata gets the current generation; the leader's starts
    a rebalance, and a restarted static leader leads again under its new member id
    (ClassicGroup.replaceStaticMember). So only a restarted follower is sure not to
    disturb the others (tests/test_kafka_classic_groups.py's restart test)."""
    box = Box(_group())
    one, _ = _two_static_members(box, ("range",))
    restarted = box.answers[box.join(5_000, _args(instance="i-2", meta=b"2"))]
    box.sync(5_000, restarted.member_id, 1)
    again = box.answers[box.join(5_010, _args(restarted.member_id, instance="i-2", meta=b"2"))]
    assert (again.error, again.generation, again.leader) == ("NONE", 1, one)
    assert box.group.state == STABLE
    restarted = box.answers[box.join(6_000, _args(instance="i-1", meta=b"1"))]
    assert restarted.leader == one  # told the previous leader: it acts as a follower
    box.sync(6_000, restarted.member_id, 1)
    t = box.join(6_010, _args(restarted.member_id, instance="i-1", meta=b"1"))
    assert t not in box.answers and box.group.state == PREPARING


def test_a_static_member_restarting_while_the_leader_assigns_rebalances() -> None:
    """The leader may be assigning to the member's old id (CompletingRebalance): as
    Kafka does, the restart starts a rebalance, else the new id would get nothing and
    the old id's partitions nobody."""
    box = Box(_group())
    t1 = box.join(0, _args(meta=b"l"))
    t2 = box.join(0, _args(instance="i-2", meta=b"2"))
    box.tick(DELAY_MS)
    leader, old = box.answers[t1].member_id, box.answers[t2].member_id
    assert box.group.state == COMPLETING
    t = box.join(4_000, _args(instance="i-2", meta=b"2"))
    assert t not in box.answers and box.group.state == PREPARING
    late = box.sync(4_000, leader, 1, {leader: b"l's", old: b"2's"})
    assert box.answers[late].error == "REBALANCE_IN_PROGRESS"
    rejoined = box.answers[box.join(4_100, _args(leader, meta=b"l"))]
    again = box.answers[t]
    assert again.generation == rejoined.generation == 2 and again.member_id != old
    assert {m for m, _, _ in rejoined.members} == {leader, again.member_id}


def test_a_static_member_restarting_rebalances_only_if_the_protocol_chosen_changes() -> None:
    """Kafka's rule: new metadata bytes (say, owned partitions forgotten by the restart)
    keep the generation, and the leader sees them at the next rebalance; protocols that
    change the group's choice start a rebalance."""
    box = Box(_group())
    _two_static_members(box, ("range", "roundrobin"), ("roundrobin", "range"))
    assert box.group.protocol == "range"  # a tie: the first member's choice
    t = box.join(5_000, _args(instance="i-1", meta=b"new", protocols=("range", "roundrobin")))
    again = box.answers[t]
    assert (again.error, again.generation, box.group.state) == ("NONE", 1, STABLE)
    assert box.group.members[again.member_id].metadata("range") == b"new"
    assert box.answers[box.sync(5_000, again.member_id, 1)].assignment == b"1's"
    t = box.join(6_000, _args(instance="i-1", meta=b"new", protocols=("roundrobin", "range")))
    assert t not in box.answers and box.group.state == PREPARING


def test_a_static_members_session_still_expires() -> None:
    box = Box(_group())
    s = box.join(0, _args(instance="i-1"))
    box.tick(DELAY_MS)
    member = box.answers[s].member_id
    box.sync(DELAY_MS, member, 1, {member: b"a"})
    box.tick(DELAY_MS + SESSION_MS)
    assert not box.group.members and "i-1" not in box.group.instances


def test_the_leaders_missing_sync_drops_it_and_rebalances() -> None:
    box = Box(_group())
    # Sessions longer than the rebalance timeout: the sync phase's bound ends it.
    tickets = [box.join(0, _args(session_ms=60_000)) for _ in range(2)]
    box.tick(DELAY_MS)
    leader = box.answers[tickets[0]].leader
    follower = next(box.answers[t].member_id for t in tickets if box.answers[t].member_id != leader)
    waiting = box.sync(DELAY_MS, follower, 1)
    box.tick(DELAY_MS + REBALANCE_MS)
    assert isinstance(box.answers[waiting], Refused | SyncAnswer)
    assert box.answers[waiting].error == "REBALANCE_IN_PROGRESS"
    assert leader not in box.group.members and box.group.state == PREPARING


def test_consumer_protocol_bytes_decode_for_group_describe() -> None:
    """What ``bookline group describe`` shows of a Kafka member: the partitions of its
    assignment and the topics of its subscription, as the clients encode them (v0-v3:
    the topic array first); bytes of another protocol show none."""
    parts = frozenset({("t", 0), ("t", 3), ("ü", 1)})
    assert sorted(decode_assignment(encode_assignment(parts)) or []) == sorted(parts)
    # A v1 subscription: topics, user data, owned partitions (ignored here).
    sub = struct.pack(">hi", 1, 2) + struct.pack(">h", 1) + b"a" + struct.pack(">h", 2)
    sub += "ü".encode() + struct.pack(">ii", -1, 0)
    assert decode_subscription(sub) == ["a", "ü"]
    for junk in (b"", b"\x00\x00\xff\xff\xff\xff", b"\x00\x00\x00\x00\x00\x05\x00\x09ab"):
        assert decode_assignment(junk) is None and decode_subscription(junk) is None
