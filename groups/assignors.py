"""Partition assignors: who in a consumer group reads which topic partition (pure).

Every assignor maps ``members`` (member id -> the topics it subscribes to), the topics'
partition counts and the ``current`` assignment to a new assignment in which every
partition of a subscribed topic has exactly one owner, and only a member subscribed to
its topic. The coordinator runs the group's assignor; members never compute their own
share (Kafka's old ZooKeeper consumers did, and saw split-brain views).

* ``range`` -- Kafka's RangeAssignor: per topic, members sorted by id get contiguous
  ranges, the first ``n % m`` one partition more.
* ``roundrobin`` -- Kafka's RoundRobinAssignor: all partitions sorted, dealt to the
  members in turn (skipping members not subscribed to the topic).
* ``cooperative-sticky`` -- balanced (counts differ by at most one among members that
  could take a partition) while moving as few partitions as possible: members keep
  what they own, new and orphaned partitions go to the least loaded, then the most
  loaded give up partitions to the least loaded until balanced. The coordinator
  revokes a moving partition from its old owner before handing it to the new one, so
  partitions that don't move are consumed throughout a rebalance.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Set
from typing import Final

from foundation.errors import BadRequestError

__all__ = ["ASSIGNORS", "TopicPartition", "assign", "assignor_names"]

TopicPartition = tuple[str, int]
Members = Mapping[str, Set[str]]  # member id -> subscribed topics
Partitions = Mapping[str, int]  # topic -> partition count
Assignment = dict[str, set[TopicPartition]]
Assignor = Callable[[Members, Partitions, Mapping[str, Set[TopicPartition]]], Assignment]


def _subscribers(members: Members, topic: str) -> list[str]:
    return sorted(m for m, topics in members.items() if topic in topics)


def _topics(members: Members, partitions: Partitions) -> list[str]:
    return sorted({t for topics in members.values() for t in topics if t in partitions})


def range_assign(
    members: Members, partitions: Partitions, current: Mapping[str, Set[TopicPartition]]
) -> Assignment:
    out: Assignment = {m: set() for m in members}
    for topic in _topics(members, partitions):
        subs = _subscribers(members, topic)
        n, m = partitions[topic], len(subs)
        per, extra = divmod(n, m)
        start = 0
        for i, member in enumerate(subs):
            count = per + (1 if i < extra else 0)
            out[member].update((topic, p) for p in range(start, start + count))
            start += count
    return out


def roundrobin_assign(
    members: Members, partitions: Partitions, current: Mapping[str, Set[TopicPartition]]
) -> Assignment:
    out: Assignment = {m: set() for m in members}
    order = sorted(members)
    if not order:
        return out
    turn = 0
    for topic in _topics(members, partitions):
        for p in range(partitions[topic]):
            # The next member in turn that subscribes to this topic (one always does).
            while topic not in members[order[turn % len(order)]]:
                turn += 1
            out[order[turn % len(order)]].add((topic, p))
            turn += 1
    return out


def sticky_assign(
    members: Members, partitions: Partitions, current: Mapping[str, Set[TopicPartition]]
) -> Assignment:
    out: Assignment = {m: set() for m in members}
    eligible: dict[str, set[str]] = {}
    wanted: list[TopicPartition] = []
    for topic in _topics(members, partitions):
        eligible[topic] = set(_subscribers(members, topic))
        wanted.extend((topic, p) for p in range(partitions[topic]))
    wanted_set = set(wanted)
    owned: set[TopicPartition] = set()
    # 1. keep what is still valid (first claim wins if two members claim one).
    for member in sorted(members):
        for tp in sorted(current.get(member, ())):
            if tp in wanted_set and member in eligible[tp[0]] and tp not in owned:
                out[member].add(tp)
                owned.add(tp)
    # 2. new and orphaned partitions to the least loaded eligible member.
    for tp in wanted:
        if tp not in owned:
            member = min(eligible[tp[0]], key=lambda m: (len(out[m]), m))
            out[member].add(tp)
            owned.add(tp)
    # 3. balance: the most loaded give up partitions to the least loaded eligible ones.
    moved = True
    while moved:
        moved = False
        for giver in sorted(out, key=lambda m: (-len(out[m]), m)):
            for tp in sorted(out[giver], reverse=True):
                takers = [m for m in eligible[tp[0]] if len(out[m]) + 1 < len(out[giver])]
                if takers:
                    taker = min(takers, key=lambda m: (len(out[m]), m))
                    out[giver].discard(tp)
                    out[taker].add(tp)
                    moved = True
                    break
            if moved:
                break
    return out


ASSIGNORS: Final[dict[str, Assignor]] = {
    "range": range_assign,
    "roundrobin": roundrobin_assign,
    "cooperative-sticky": sticky_assign,
}


def assignor_names() -> list[str]:
    return sorted(ASSIGNORS)


def assign(
    name: str,
    members: Members,
    partitions: Partitions,
    current: Mapping[str, Set[TopicPartition]] | None = None,
) -> Assignment:
    """Run the assignor called ``name`` (BadRequestError if there is none)."""
    fn = ASSIGNORS.get(name)
    if fn is None:
        raise BadRequestError(f"unknown assignor {name!r}; known: {', '.join(assignor_names())}")
    return fn(members, partitions, current or {})
