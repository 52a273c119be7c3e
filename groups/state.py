"""A consumer group's state and its rules, as the coordinator applies them (pure).

No I/O and no clock of its own: every call gets ``now_ms``. The coordinator
(:mod:`groups.coordinator`) wraps this object, makes each change durable in the group's
log before it answers, and replays the log into a fresh one after a failover.

Membership::

    join(member_id?, instance_id?, topics, assignor, session_timeout_ms, owned)
        -> (member_id, generation, partitions to consume now)
    heartbeat(member_id, generation, owned)  -> partitions to consume now
    commit(member_id, generation, {tp: offset})
    leave(member_id)

* Every membership change (a member joins, leaves or misses its session timeout, or a
  subscribed topic gains partitions) bumps the **generation** and recomputes the
  *target* assignment with the group's assignor, from the current one (so the sticky
  assignor moves as little as it can).
* A heartbeat or commit that carries an older generation, or comes from a member the
  group no longer knows, is refused with ``STALE_GENERATION``: a live member re-joins
  with its member id (which bumps nothing) and learns the new generation and
  assignment; a member whose session expired gets a new member id. A member paused past
  its session timeout and replaced can therefore never commit over its successor.
* **Incremental cooperative handoff**: a partition moving from A to B is handed to B
  only once A no longer reports owning it (A's next heartbeat, after it stopped
  consuming it and committed), or A left or expired. Partitions that don't move are
  consumed throughout. (Kafka's KIP-429 and KIP-848 ideas: revoke before assign.)
* **Static membership** (``instance_id``): a member that re-joins with the instance id
  of a current member takes its place (the old member id is fenced) and keeps its
  assignment, with no generation change; leaving does not remove a static member, only
  its session timeout does (Kafka's KIP-345).
* Commits: only for a partition the member holds (assigned, or owned while it is being
  revoked), at most the partition's end offset.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

from foundation.errors import (
    BadRequestError,
    GroupNotEmptyError,
    NotAssignedError,
    OutOfRangeError,
    StaleGenerationError,
)
from foundation.invariants import invariant
from groups.assignors import ASSIGNORS, TopicPartition, assign, assignor_names

__all__ = [
    "DEFAULT_ASSIGNOR",
    "SESSION_TIMEOUT_MS_MAX",
    "SESSION_TIMEOUT_MS_MIN",
    "GroupState",
    "JoinResult",
    "Member",
]

DEFAULT_ASSIGNOR: Final = "cooperative-sticky"
# Kafka's broker bounds (group.min/max.session.timeout.ms): shorter sessions expire on a
# GC pause, longer ones keep a dead member's partitions idle for too long.
SESSION_TIMEOUT_MS_MIN: Final = 1_000
SESSION_TIMEOUT_MS_MAX: Final = 300_000
# Members per group: each costs a heartbeat stream and a share of every rebalance.
MEMBERS_MAX: Final = 1_000
TOPICS_PER_MEMBER_MAX: Final = 100

EndOffsets = Callable[[TopicPartition], int]


@dataclasses.dataclass(slots=True)
class Member:
    member_id: str
    instance_id: str | None
    topics: frozenset[str]
    session_timeout_ms: int
    deadline_ms: int
    # The target: what this member owns once every handoff has completed.
    assigned: set[TopicPartition] = dataclasses.field(default_factory=set)
    # What it last reported consuming (join or heartbeat).
    owned: set[TopicPartition] = dataclasses.field(default_factory=set)

    def to_record(self) -> dict[str, Any]:
        return {
            "id": self.member_id,
            "instance": self.instance_id,
            "topics": sorted(self.topics),
            "session_ms": self.session_timeout_ms,
            "assigned": sorted(self.assigned),
        }


@dataclasses.dataclass(frozen=True, slots=True)
class JoinResult:
    member_id: str
    generation: int
    partitions: frozenset[TopicPartition]  # to consume now
    rebalanced: bool  # the join changed the membership (generation bumped)


class GroupState:
    """One group: members, generation, target assignment, committed offsets."""

    def __init__(self, group: str, partitions: Mapping[str, int] | None = None) -> None:
        self.group = group
        self.generation = 0
        self.assignor: str | None = None
        self.members: dict[str, Member] = {}
        self.offsets: dict[TopicPartition, int] = {}
        # Partition counts of the subscribed topics, as the coordinator last saw them.
        self.partitions: dict[str, int] = dict(partitions or {})

    # -- queries -------------------------------------------------------------------

    @property
    def topics(self) -> frozenset[str]:
        return frozenset(t for m in self.members.values() for t in m.topics)

    def partitions_now(self, member: Member) -> frozenset[TopicPartition]:
        """What ``member`` may consume now: its target, less what another member still
        owns (that one is being asked to give it up first)."""
        held_elsewhere = {
            tp for other in self.members.values() if other is not member for tp in other.owned
        }
        return frozenset(member.assigned - held_elsewhere)

    def holder(self, tp: TopicPartition) -> Member | None:
        """Who consumes ``tp`` now, if anyone."""
        for m in self.members.values():
            if tp in m.owned:
                return m
        for m in self.members.values():
            if tp in self.partitions_now(m):
                return m
        return None

    def by_instance(self, instance_id: str) -> Member | None:
        for m in self.members.values():
            if m.instance_id == instance_id:
                return m
        return None

    # -- membership ----------------------------------------------------------------

    def join(
        self,
        now_ms: int,
        *,
        member_id: str | None,
        instance_id: str | None,
        topics: Iterable[str],
        assignor: str,
        session_timeout_ms: int,
        owned: Iterable[TopicPartition] = (),
    ) -> JoinResult:
        topic_set = frozenset(topics)
        self._check_join(assignor, session_timeout_ms, topic_set)
        owned_set = set(owned)
        deadline = now_ms + session_timeout_ms
        member = self.members.get(member_id) if member_id else None
        rebalanced = False
        if member is None and instance_id is not None:
            static = self.by_instance(instance_id)
            if static is not None:
                # A restarted static member takes its predecessor's place and partitions.
                del self.members[static.member_id]
                member = dataclasses.replace(static, member_id=_new_member_id(instance_id))
                self.members[member.member_id] = member
        if member is None:
            if len(self.members) >= MEMBERS_MAX:
                raise BadRequestError(f"group {self.group} has {MEMBERS_MAX} members already")
            member = Member(
                _new_member_id(instance_id), instance_id, topic_set, session_timeout_ms, deadline
            )
            self.members[member.member_id] = member
            rebalanced = True
        member.deadline_ms = deadline
        member.session_timeout_ms = session_timeout_ms
        member.owned = owned_set & (member.assigned | member.owned)
        if member.topics != topic_set:
            member.topics = topic_set
            rebalanced = True
        self.assignor = assignor
        if rebalanced:
            self._rebalance()
        return JoinResult(member.member_id, self.generation, self._hand_over(member), rebalanced)

    def heartbeat(
        self, now_ms: int, member_id: str, generation: int, owned: Iterable[TopicPartition]
    ) -> frozenset[TopicPartition]:
        member = self._current(member_id, generation)
        member.deadline_ms = now_ms + member.session_timeout_ms
        # A member can only give partitions up between heartbeats, never take new ones
        # without being told: what it reports beyond what it held is ignored.
        member.owned = set(owned) & (member.owned | self.partitions_now(member))
        return self._hand_over(member)

    def leave(self, member_id: str) -> bool:
        """A member leaves (closing its consumer). A static member stays until its
        session times out, so a restart gets its partitions back without a rebalance.
        Returns whether the membership changed."""
        member = self.members.get(member_id)
        if member is None:
            return False
        if member.instance_id is not None:
            member.owned = set()  # it consumes nothing now; its target stays its own
            return False
        del self.members[member_id]
        self._rebalance()
        return True

    def expire(self, now_ms: int) -> list[str]:
        """Drop members whose session timed out; returns their ids."""
        gone = [m.member_id for m in self.members.values() if m.deadline_ms < now_ms]
        for member_id in gone:
            del self.members[member_id]
        if gone:
            self._rebalance()
        return gone

    def set_partitions(self, counts: Mapping[str, int]) -> bool:
        """New partition counts of subscribed topics (a topic grew): rebalance when
        anything changed. Returns whether it did."""
        changed = {t: n for t, n in counts.items() if self.partitions.get(t) != n}
        if not changed:
            return False
        for topic, n in changed.items():
            invariant(n >= self.partitions.get(topic, 0), "topic %s shrank to %d", topic, n)
        self.partitions.update(changed)
        if self.members:
            self._rebalance()
        return True

    def next_deadline_ms(self) -> int | None:
        return min((m.deadline_ms for m in self.members.values()), default=None)

    # -- offsets -------------------------------------------------------------------

    def check_commit(
        self,
        member_id: str,
        generation: int,
        offsets: Mapping[TopicPartition, int],
        end_offset: EndOffsets,
    ) -> None:
        """Raise unless ``member_id`` may commit ``offsets`` now (nothing is changed)."""
        member = self._current(member_id, generation)
        held = member.owned | self.partitions_now(member)
        for tp, offset in offsets.items():
            if tp not in held:
                raise NotAssignedError(
                    f"partition {tp[1]} of {tp[0]} is not assigned to member {member_id} "
                    f"of group {self.group} (generation {self.generation})"
                )
            _check_offset(tp, offset, end_offset)

    def apply_commit(self, offsets: Mapping[TopicPartition, int]) -> None:
        self.offsets.update(offsets)

    def reset_offsets(self, offsets: Mapping[TopicPartition, int], end_offset: EndOffsets) -> None:
        """An operator's reset (``bookline group reset-offsets``): refused while the group
        has members, as Kafka does, since they would overwrite it at once."""
        self.require_empty("reset its offsets")
        for tp, offset in offsets.items():
            _check_offset(tp, offset, end_offset)
        self.offsets.update(offsets)

    def require_empty(self, what: str) -> None:
        if self.members:
            raise GroupNotEmptyError(
                f"group {self.group} has {len(self.members)} live member(s); "
                f"stop its consumers to {what}"
            )

    # -- snapshots (the coordinator's log) ------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """Membership, generation and assignment (not the offsets: those are logged as
        commits). Heartbeats and deadlines are not persisted; a new coordinator gives
        every member a fresh session."""
        return {
            "generation": self.generation,
            "assignor": self.assignor,
            "partitions": dict(self.partitions),
            "members": [m.to_record() for m in self.members.values()],
        }

    def restore(self, snap: Mapping[str, Any], now_ms: int) -> None:
        self.generation = int(snap["generation"])
        self.assignor = snap.get("assignor")
        self.partitions = {str(t): int(n) for t, n in snap.get("partitions", {}).items()}
        self.members = {}
        for rec in snap["members"]:
            assigned = {(str(t), int(p)) for t, p in rec["assigned"]}
            member = Member(
                member_id=str(rec["id"]),
                instance_id=rec.get("instance"),
                topics=frozenset(rec["topics"]),
                session_timeout_ms=int(rec["session_ms"]),
                deadline_ms=now_ms + int(rec["session_ms"]),
                assigned=assigned,
                # Each member was consuming its target when the old coordinator died, as
                # far as anyone knows; its next heartbeat says what it really owns.
                owned=set(assigned),
            )
            self.members[member.member_id] = member

    # -- internals -----------------------------------------------------------------

    def _check_join(self, assignor: str, session_timeout_ms: int, topics: frozenset[str]) -> None:
        if assignor not in ASSIGNORS:
            raise BadRequestError(
                f"unknown assignor {assignor!r}; known: {', '.join(assignor_names())}"
            )
        if self.members and self.assignor is not None and assignor != self.assignor:
            raise BadRequestError(
                f"group {self.group} uses the {self.assignor!r} assignor, not {assignor!r}"
            )
        if not SESSION_TIMEOUT_MS_MIN <= session_timeout_ms <= SESSION_TIMEOUT_MS_MAX:
            raise BadRequestError(
                f"session timeout {session_timeout_ms} ms is outside "
                f"[{SESSION_TIMEOUT_MS_MIN}, {SESSION_TIMEOUT_MS_MAX}]"
            )
        if not topics or len(topics) > TOPICS_PER_MEMBER_MAX:
            raise BadRequestError(f"subscribe to 1..{TOPICS_PER_MEMBER_MAX} topics")
        unknown = sorted(t for t in topics if t not in self.partitions)
        if unknown:
            raise BadRequestError(f"unknown topic(s) {', '.join(unknown)}")

    def _current(self, member_id: str, generation: int) -> Member:
        member = self.members.get(member_id)
        if member is None:
            raise StaleGenerationError(
                f"member {member_id} is not in group {self.group} (its session expired, "
                "or it was replaced); join again"
            )
        if generation != self.generation:
            raise StaleGenerationError(
                f"generation {generation} of group {self.group} is stale (now "
                f"{self.generation}); join again with member id {member_id}"
            )
        return member

    def _hand_over(self, member: Member) -> frozenset[TopicPartition]:
        """What ``member`` may consume now, counted as owned by it from this answer on:
        it starts consuming them on receipt, so until it reports otherwise no other
        member may be handed them (a member that joins before this one's next heartbeat
        must not get them too)."""
        now = self.partitions_now(member)
        member.owned |= now
        return now

    def _rebalance(self) -> None:
        self.generation += 1
        if not self.members:
            return
        subs = {m.member_id: set(m.topics) for m in self.members.values()}
        current = {m.member_id: set(m.assigned) for m in self.members.values()}
        counts = {t: n for t, n in self.partitions.items() if t in self.topics}
        target = assign(self.assignor or DEFAULT_ASSIGNOR, subs, counts, current)
        for member_id, tps in target.items():
            self.members[member_id].assigned = set(tps)


def _check_offset(tp: TopicPartition, offset: int, end_offset: EndOffsets) -> None:
    if offset < 0:
        raise BadRequestError(f"offset {offset} of {tp[0]}/{tp[1]} is negative")
    end = end_offset(tp)
    if offset > end:
        raise OutOfRangeError(
            f"offset {offset} of {tp[0]}/{tp[1]} is beyond the partition's end offset {end}"
        )


def _new_member_id(instance_id: str | None) -> str:
    prefix = instance_id or "member"
    return f"{prefix}-{uuid.uuid4().hex[:12]}"
