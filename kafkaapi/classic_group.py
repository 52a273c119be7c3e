"""Kafka's classic group protocol, one group, as a pure state machine (no I/O, no
clock of its own: every call takes ``now_ms``): :class:`ClassicGroup`.

States as Kafka names them: Empty -> PreparingRebalance (the join barrier) ->
CompletingRebalance (the leader assigns) -> Stable; Dead once deleted. Members are
the clients' own: the coordinator elects a leader, hands it every member's protocol
metadata, and relays the assignment bytes the leader sends in SyncGroup to each member
verbatim (the clients' assignors: range, round-robin, sticky, cooperative-sticky, or
any custom one).

Requests that wait (a JoinGroup until the barrier completes, a follower's SyncGroup
until the leader's) are named by a *ticket* the caller picks; every answer, immediate
or later, is put in :attr:`ClassicGroup.outbox` as ``(ticket, answer)``, which the
driver (:mod:`kafkaapi.classic_host`) drains after each call and each :meth:`tick`.

Kafka's rules kept: JoinGroup v4+ without a member id gets MEMBER_ID_REQUIRED and a
pending id; the first join of an Empty group waits ``initial_delay_ms`` (Kafka's
``group.initial.rebalance.delay.ms``) so members starting together land in one
generation; the barrier ends once every member rejoined, or at the rebalance timeout
(members not rejoined are dropped, static ones kept); the protocol is the one every
member supports with the most first-choice votes; a static member (``group.instance.
id``) rejoining with a new member id while Stable replaces the old id without a
rebalance unless the protocol chosen changes (the old id is FENCED_INSTANCE_ID; a
restarted leader is told to skip assigning, before JoinGroup v9 the previous leader's
id), and while the leader assigns it starts a rebalance; sessions expire members not
waiting in a JoinGroup or SyncGroup; a SyncGroup phase not completed
within the rebalance timeout drops the members that did not sync.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field, replace
from typing import Final

from groups.state import MEMBERS_MAX, SESSION_TIMEOUT_MS_MAX, SESSION_TIMEOUT_MS_MIN

__all__ = [
    "COMPLETING",
    "DEAD",
    "EMPTY",
    "PREPARING",
    "STABLE",
    "ClassicConfig",
    "ClassicGroup",
    "JoinAnswer",
    "JoinArgs",
    "Refused",
    "SyncAnswer",
    "SyncArgs",
]

EMPTY: Final = "Empty"
PREPARING: Final = "PreparingRebalance"
COMPLETING: Final = "CompletingRebalance"
STABLE: Final = "Stable"
DEAD: Final = "Dead"
NONE: Final = "NONE"  # Kafka's error name for success


@dataclass(frozen=True, slots=True)
class ClassicConfig:
    # The first join of an Empty group waits this long for the others (Kafka's
    # group.initial.rebalance.delay.ms, 3 s by default), bounded by the rebalance timeout.
    initial_delay_ms: int = 3_000
    # Kafka's group.min/max.session.timeout.ms: Bookline's group bounds.
    session_timeout_ms_min: int = SESSION_TIMEOUT_MS_MIN
    session_timeout_ms_max: int = SESSION_TIMEOUT_MS_MAX
    # Members and pending member ids per group (Kafka's group.max.size): each costs a
    # share of every rebalance and the leader's member list.
    members_max: int = MEMBERS_MAX


@dataclass(frozen=True, slots=True)
class JoinArgs:
    member_id: str  # "" for a new member
    instance_id: str | None
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocol_type: str
    protocols: tuple[tuple[str, bytes], ...]  # (name, metadata), by preference
    require_known_id: bool  # JoinGroup v4+ of a dynamic member: MEMBER_ID_REQUIRED first
    client_id: str = ""
    client_host: str = ""
    # JoinGroup v9+: a leader can be told to skip assigning (Kafka's skip_assignment).
    supports_skip_assignment: bool = False


@dataclass(frozen=True, slots=True)
class SyncArgs:
    member_id: str
    instance_id: str | None
    generation: int
    protocol_type: str | None  # v5+ names them; None: not checked
    protocol_name: str | None
    assignments: dict[str, bytes]  # the leader's, by member id (others send none)


@dataclass(frozen=True, slots=True)
class JoinAnswer:
    error: str
    member_id: str
    generation: int = -1
    protocol_type: str | None = None
    protocol_name: str | None = None
    leader: str = ""
    skip_assignment: bool = False
    # The leader's answer: (member id, instance id, metadata of the chosen protocol).
    members: tuple[tuple[str, str | None, bytes], ...] = ()


@dataclass(frozen=True, slots=True)
class SyncAnswer:
    error: str
    assignment: bytes = b""
    protocol_type: str | None = None
    protocol_name: str | None = None


@dataclass(frozen=True, slots=True)
class Refused:
    """A waiting JoinGroup or SyncGroup ended by an error."""

    error: str
    member_id: str


Answer = JoinAnswer | SyncAnswer | Refused


@dataclass(slots=True)
class Member:
    member_id: str
    instance_id: str | None
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    protocols: tuple[tuple[str, bytes], ...]
    assignment: bytes = b""
    join_ticket: int | None = None  # waiting in JoinGroup
    sync_ticket: int | None = None  # waiting in SyncGroup
    deadline_ms: int = 0  # its session ends (unless it waits in a JoinGroup/SyncGroup)

    def metadata(self, protocol: str | None) -> bytes:
        return next((m for n, m in self.protocols if n == protocol), b"")


@dataclass(slots=True)
class ClassicGroup:
    """One classic group's state; answers land in :attr:`outbox` (module docstring)."""

    group: str
    config: ClassicConfig = field(default_factory=ClassicConfig)
    state: str = EMPTY
    generation: int = 0
    protocol_type: str | None = None
    protocol: str | None = None
    leader: str | None = None
    members: dict[str, Member] = field(default_factory=dict)
    instances: dict[str, str] = field(default_factory=dict)  # instance id -> member id
    pending: dict[str, int] = field(default_factory=dict)  # MEMBER_ID_REQUIRED ids -> deadline
    join_deadline_ms: int | None = None
    sync_deadline_ms: int | None = None
    initial_until_ms: int | None = None  # the initial delay may extend up to then
    outbox: list[tuple[int, Answer]] = field(default_factory=list)

    # -- JoinGroup ---------------------------------------------------------------------

    def join(self, now_ms: int, ticket: int, args: JoinArgs) -> None:
        error = self._refuse_join(args)
        if error is not None:
            self._answer_join(ticket, error, args.member_id)
        elif args.member_id == "" and args.instance_id is not None:
            self._join_static(now_ms, ticket, args)
        elif args.member_id == "":
            if len(self.members) + len(self.pending) >= self.config.members_max:
                self._answer_join(ticket, "GROUP_MAX_SIZE_REACHED", "")
            elif args.require_known_id:
                member_id = _new_id(args.client_id)
                self.pending[member_id] = now_ms + args.session_timeout_ms
                self._answer_join(ticket, "MEMBER_ID_REQUIRED", member_id)
            else:
                self._add(now_ms, ticket, _new_id(args.client_id), args)
        elif args.member_id in self.pending:
            del self.pending[args.member_id]
            self._add(now_ms, ticket, args.member_id, args)
        else:
            error = self._check_member(args.member_id, args.instance_id)
            if error is not None:
                self._answer_join(ticket, error, args.member_id)
            else:
                self._join_known(now_ms, ticket, self.members[args.member_id], args)

    def _refuse_join(self, args: JoinArgs) -> str | None:
        if self.state == DEAD:
            return "COORDINATOR_NOT_AVAILABLE"
        if not args.protocol_type or not args.protocols:
            return "INCONSISTENT_GROUP_PROTOCOL"
        low, high = self.config.session_timeout_ms_min, self.config.session_timeout_ms_max
        if not low <= args.session_timeout_ms <= high:
            return "INVALID_SESSION_TIMEOUT"
        if self.members and (
            args.protocol_type != self.protocol_type
            or not self._candidates() & {name for name, _ in args.protocols}
        ):
            return "INCONSISTENT_GROUP_PROTOCOL"
        return None

    def _join_static(self, now_ms: int, ticket: int, args: JoinArgs) -> None:
        """A static member joining without a member id: new, or its instance restarted."""
        assert args.instance_id is not None
        old_id = self.instances.get(args.instance_id)
        if old_id is None:
            if len(self.members) + len(self.pending) >= self.config.members_max:
                self._answer_join(ticket, "GROUP_MAX_SIZE_REACHED", "")
            else:
                self._add(now_ms, ticket, _new_id(args.client_id), args)
            return
        old = self.members[old_id]
        for waiting in (old.join_ticket, old.sync_ticket):
            if waiting is not None:  # the old incarnation is fenced
                self._answer(waiting, "FENCED_INSTANCE_ID", old_id)
        member = replace(old, member_id=_new_id(args.client_id), join_ticket=None, sync_ticket=None)
        # In the old one's place: the order breaks protocol vote ties (_select_protocol).
        in_place = [member if m is old else m for m in self.members.values()]
        self.members = {m.member_id: m for m in in_place}
        self.instances[args.instance_id] = member.member_id
        previous_leader = self.leader
        if self.leader == old_id:
            self.leader = member.member_id
        if self.state == STABLE:
            member.protocols = args.protocols
            if self._select_protocol() == self.protocol:
                self._rejoin_static(now_ms, ticket, member, args, previous_leader)
                return
        # Kafka rebalances: the protocol chosen changes, or (CompletingRebalance) the
        # leader may be assigning to the old id; in PreparingRebalance it just waits.
        self._await_join(member, ticket, args)
        if self.state == PREPARING:
            self._maybe_complete_join(now_ms)
        else:
            self._prepare_rebalance(now_ms)

    def _rejoin_static(
        self, now_ms: int, ticket: int, member: Member, args: JoinArgs, previous_leader: str | None
    ) -> None:
        """Kafka's static rejoin while Stable: the same generation, no rebalance; its
        SyncGroup answers the assignment it had. A restarted leader must not assign (the
        group would ignore it, and a client that assigned watches its fresh metadata and
        rejoins when it arrives: a rebalance of all): from JoinGroup v9 it is told to
        skip assigning; before, it is told the previous leader's id, so it syncs as a
        follower (it still leads the next rebalance)."""
        member.deadline_ms = now_ms + args.session_timeout_ms
        member.session_timeout_ms = args.session_timeout_ms
        member.rebalance_timeout_ms = args.rebalance_timeout_ms
        answer = self._generation_answer(member, skip=True)
        if not args.supports_skip_assignment:
            answer = replace(
                answer, leader=previous_leader or "", skip_assignment=False, members=()
            )
        self.outbox.append((ticket, answer))

    def _join_known(self, now_ms: int, ticket: int, member: Member, args: JoinArgs) -> None:
        unchanged = args.protocols == member.protocols
        if self.state in (COMPLETING, STABLE) and unchanged and member.member_id != self.leader:
            # A follower that lost its JoinGroup answer, or rejoins for nothing: the
            # current generation, and it syncs (Kafka's answer).
            member.deadline_ms = now_ms + member.session_timeout_ms
            self.outbox.append((ticket, self._generation_answer(member, skip=False)))
            return
        if self.state == COMPLETING and unchanged:
            self.outbox.append((ticket, self._generation_answer(member, skip=False)))
            return
        self._await_join(member, ticket, args)
        if self.state == PREPARING:
            self._maybe_complete_join(now_ms)
        else:
            self._prepare_rebalance(now_ms)

    def _add(self, now_ms: int, ticket: int, member_id: str, args: JoinArgs) -> None:
        member = Member(
            member_id, args.instance_id, args.client_id, args.client_host,
            args.session_timeout_ms, args.rebalance_timeout_ms, args.protocols,
        )  # fmt: skip
        self.members[member_id] = member
        if args.instance_id is not None:
            self.instances[args.instance_id] = member_id
        if self.leader is None:
            self.leader = member_id
        self.protocol_type = args.protocol_type
        self._await_join(member, ticket, args)
        if self.state != PREPARING:
            self._prepare_rebalance(now_ms)
        elif self.initial_until_ms is not None:
            # Kafka's initial delay: each newcomer waits a while longer for the rest.
            self.join_deadline_ms = min(
                now_ms + self.config.initial_delay_ms, self.initial_until_ms
            )
        else:
            self._maybe_complete_join(now_ms)

    def _await_join(self, member: Member, ticket: int, args: JoinArgs) -> None:
        if member.join_ticket is not None:  # a second JoinGroup replaces the first
            self._answer(member.join_ticket, "REBALANCE_IN_PROGRESS", member.member_id)
        member.join_ticket = ticket
        member.protocols = args.protocols
        member.session_timeout_ms = args.session_timeout_ms
        member.rebalance_timeout_ms = args.rebalance_timeout_ms

    # -- SyncGroup, Heartbeat, LeaveGroup -----------------------------------------------

    def sync(self, now_ms: int, ticket: int, args: SyncArgs) -> None:
        member_id = args.member_id
        error = self._check_member(member_id, args.instance_id)
        kind, name = args.protocol_type, args.protocol_name
        if error is None and args.generation != self.generation:
            error = "ILLEGAL_GENERATION"
        if error is None and (
            (kind is not None and kind != self.protocol_type)
            or (name is not None and name != self.protocol)
        ):
            error = "INCONSISTENT_GROUP_PROTOCOL"
        if error is None and self.state == PREPARING:
            error = "REBALANCE_IN_PROGRESS"
        if error is not None:
            self.outbox.append((ticket, SyncAnswer(error)))
            return
        member = self.members[member_id]
        member.deadline_ms = now_ms + member.session_timeout_ms
        if member.sync_ticket is not None:
            self._answer(member.sync_ticket, "REBALANCE_IN_PROGRESS", member_id)
        member.sync_ticket = ticket
        if self.state == COMPLETING and member_id == self.leader:
            for m in self.members.values():  # relayed verbatim; none named: nothing
                m.assignment = args.assignments.get(m.member_id, b"")
            self.state, self.sync_deadline_ms = STABLE, None
        if self.state == STABLE:
            for m in self.members.values():
                if m.sync_ticket is not None:
                    answer = SyncAnswer(NONE, m.assignment, self.protocol_type, self.protocol)
                    self.outbox.append((m.sync_ticket, answer))
                    m.sync_ticket = None
                    m.deadline_ms = now_ms + m.session_timeout_ms

    def heartbeat(
        self, now_ms: int, member_id: str, instance_id: str | None, generation: int
    ) -> str:
        error = self._check_member(member_id, instance_id)
        if error is not None:
            return error
        if self.state != PREPARING and generation != self.generation:
            return "ILLEGAL_GENERATION"
        member = self.members[member_id]
        member.deadline_ms = now_ms + member.session_timeout_ms
        return "REBALANCE_IN_PROGRESS" if self.state == PREPARING else NONE

    def leave(self, now_ms: int, member_id: str, instance_id: str | None) -> str:
        """One member of a LeaveGroup (by instance id from v3: Kafka's rules)."""
        if instance_id is not None:
            owner = self.instances.get(instance_id)
            if owner is None:
                return "UNKNOWN_MEMBER_ID"
            if member_id and member_id != owner:
                return "FENCED_INSTANCE_ID"
            member_id = owner
        if self.pending.pop(member_id, None) is not None:
            return NONE
        member = self.members.get(member_id)
        if member is None:
            return "UNKNOWN_MEMBER_ID"
        self._remove(now_ms, member, "UNKNOWN_MEMBER_ID")
        return NONE

    def check_commit(self, member_id: str, instance_id: str | None, generation: int) -> str:
        """Whether an OffsetCommit from ``member_id`` at ``generation`` is taken (Kafka:
        refused while the leader assigns; during PreparingRebalance the members commit
        what they give up, at the generation they had)."""
        error = self._check_member(member_id, instance_id)
        if error is not None:
            return error
        if self.state == COMPLETING:
            return "REBALANCE_IN_PROGRESS"
        if generation != self.generation:
            return "ILLEGAL_GENERATION"
        return NONE

    def delete(self) -> None:
        """The group was deleted (it had no members): Dead, answering nothing more."""
        self.state = DEAD

    def abandon(self, error: str) -> None:
        """This coordinator stops serving the group: every waiting request gets ``error``
        (NOT_COORDINATOR: the clients find the new coordinator and join there)."""
        for m in self.members.values():
            for waiting in (m.join_ticket, m.sync_ticket):
                if waiting is not None:
                    self._answer(waiting, error, m.member_id)
            m.join_ticket = m.sync_ticket = None
        self.state = DEAD

    # -- time ----------------------------------------------------------------------------

    def tick(self, now_ms: int) -> None:
        """Expire pending ids and sessions, and end a barrier or a sync phase due."""
        for member_id, due in list(self.pending.items()):
            if due <= now_ms:
                del self.pending[member_id]
        for m in list(self.members.values()):
            waiting = m.join_ticket is not None or m.sync_ticket is not None
            if not waiting and m.deadline_ms <= now_ms and m.member_id in self.members:
                self._remove(now_ms, m, "UNKNOWN_MEMBER_ID")
        if self.state == PREPARING:
            self._maybe_complete_join(now_ms)
        if self.state == COMPLETING and self._due(self.sync_deadline_ms, now_ms):
            # The leader's assignment never came: drop who did not sync, and again.
            for m in list(self.members.values()):
                if m.sync_ticket is None and m.member_id in self.members:
                    self._remove(now_ms, m, "REBALANCE_IN_PROGRESS", rebalance=False)
            self._prepare_rebalance(now_ms)

    def next_deadline_ms(self) -> int | None:
        dues = list(self.pending.values())
        dues += [
            m.deadline_ms
            for m in self.members.values()
            if m.join_ticket is None and m.sync_ticket is None
        ]
        if self.state == PREPARING and self.join_deadline_ms is not None:
            dues.append(self.join_deadline_ms)
        if self.state == COMPLETING and self.sync_deadline_ms is not None:
            dues.append(self.sync_deadline_ms)
        return min(dues, default=None)

    # -- internals -----------------------------------------------------------------------

    def _check_member(self, member_id: str, instance_id: str | None) -> str | None:
        if self.state == DEAD:
            return "COORDINATOR_NOT_AVAILABLE"
        owner = None if instance_id is None else self.instances.get(instance_id)
        if owner is not None and owner != member_id:
            return "FENCED_INSTANCE_ID"
        if member_id not in self.members:
            return "UNKNOWN_MEMBER_ID"
        return None

    def _prepare_rebalance(self, now_ms: int) -> None:
        if self.state == COMPLETING:  # waiting followers join again
            for m in self.members.values():
                if m.sync_ticket is not None:
                    self._answer(m.sync_ticket, "REBALANCE_IN_PROGRESS", m.member_id)
                    m.sync_ticket = None
        timeout = max((m.rebalance_timeout_ms for m in self.members.values()), default=0)
        if self.state == EMPTY:
            self.initial_until_ms = now_ms + timeout
            self.join_deadline_ms = now_ms + min(self.config.initial_delay_ms, timeout)
        else:
            self.initial_until_ms = None
            self.join_deadline_ms = now_ms + timeout
        self.state, self.sync_deadline_ms = PREPARING, None
        self._maybe_complete_join(now_ms)

    def _maybe_complete_join(self, now_ms: int) -> None:
        if self._due(self.join_deadline_ms, now_ms) or (
            self.initial_until_ms is None
            and not self.pending
            and all(m.join_ticket is not None for m in self.members.values())
        ):
            self._complete_join(now_ms)

    def _complete_join(self, now_ms: int) -> None:
        joined = [m for m in self.members.values() if m.join_ticket is not None]
        for m in list(self.members.values()):
            # Kafka keeps a static member that did not rejoin (its session decides),
            # unless nobody rejoined at all.
            if m.join_ticket is None and (m.instance_id is None or not joined):
                self._drop(m)
        if self.leader not in self.members or self.members[self.leader].join_ticket is None:
            self.leader = joined[0].member_id if joined else None
        self.generation += 1
        self.join_deadline_ms = self.initial_until_ms = None
        if not self.members:
            self.state, self.protocol, self.protocol_type = EMPTY, None, None
            return
        self.protocol = self._select_protocol()
        self.state = COMPLETING
        self.sync_deadline_ms = now_ms + max(m.rebalance_timeout_ms for m in self.members.values())
        for m in self.members.values():
            m.assignment = b""
            if m.join_ticket is not None:
                m.deadline_ms = now_ms + m.session_timeout_ms
                self.outbox.append((m.join_ticket, self._generation_answer(m, skip=False)))
                m.join_ticket = None

    def _generation_answer(self, member: Member, *, skip: bool) -> JoinAnswer:
        leader = member.member_id == self.leader
        members = tuple(
            (m.member_id, m.instance_id, m.metadata(self.protocol)) for m in self.members.values()
        )
        return JoinAnswer(NONE, member.member_id, self.generation, self.protocol_type,
                          self.protocol, self.leader or "", skip and leader,
                          members if leader else ())  # fmt: skip

    def _remove(self, now_ms: int, member: Member, error: str, *, rebalance: bool = True) -> None:
        for waiting in (member.join_ticket, member.sync_ticket):
            if waiting is not None:
                self._answer(waiting, error, member.member_id)
        self._drop(member)
        if not rebalance:
            return
        if self.state in (STABLE, COMPLETING):
            self._prepare_rebalance(now_ms)
        elif self.state == PREPARING:
            self._maybe_complete_join(now_ms)

    def _drop(self, member: Member) -> None:
        del self.members[member.member_id]
        if (
            member.instance_id is not None
            and self.instances.get(member.instance_id) == member.member_id
        ):
            del self.instances[member.instance_id]
        if self.leader == member.member_id:
            self.leader = None

    def _candidates(self) -> set[str]:
        sets = [{name for name, _ in m.protocols} for m in self.members.values()]
        return set.intersection(*sets) if sets else set()

    def _select_protocol(self) -> str:
        """The protocol every member supports with the most first-choice votes (ties:
        the first member's preference), as Kafka selects it."""
        candidates = self._candidates()
        votes: dict[str, int] = {}
        for m in self.members.values():
            choice = next(name for name, _ in m.protocols if name in candidates)
            votes[choice] = votes.get(choice, 0) + 1
        return max(votes, key=lambda name: votes[name])

    def _answer(self, ticket: int, error: str, member_id: str) -> None:
        """A waiting JoinGroup or SyncGroup refused (the driver knows which it was)."""
        self.outbox.append((ticket, Refused(error, member_id)))

    def _answer_join(self, ticket: int, error: str, member_id: str) -> None:
        self.outbox.append((ticket, JoinAnswer(error, member_id)))

    @staticmethod
    def _due(deadline_ms: int | None, now_ms: int) -> bool:
        return deadline_ms is not None and deadline_ms <= now_ms


def _new_id(client_id: str) -> str:
    """Kafka's member id shape: the client id, a dash, a UUID."""
    return f"{client_id}-{uuid.uuid4()}"
