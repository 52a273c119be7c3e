"""The member side of the consumer group protocol (:class:`Membership`).

One member of group ``g``: it joins through the coordinator (the write proxy owning
``g~group``, reached with :class:`~groups.coordinator_client.CoordinatorClient`),
heartbeats in the background at the interval the coordinator gives, and tells its
consumer (a :class:`Reconciler`) what it may consume now. The consumer does the
partition work -- stop fetching a revoked partition, commit, report it released; start
fetching a new one at its committed offset -- and :class:`Membership` reports what the
consumer holds in every heartbeat, which is how the coordinator learns a revoked
partition was let go and may be handed to its new owner (cooperative rebalancing:
partitions that do not move are consumed throughout).

* ``STALE_GENERATION`` on a heartbeat or a commit: the group moved on. The member joins
  again **with its member id** and what it holds, so it keeps the partitions it is
  still assigned (no stop, no new offsets). If the coordinator answers a *different*
  member id, the old one was expired (a paused process, a long partition): everything
  the member held is lost -- the consumer drops it without committing, and a commit
  of it raises ``STALE_GENERATION``.
* A commit refused with STALE_GENERATION is retried once after that re-join when the
  member id survived (its partitions are still its own, under the new generation).
* Hand-offs are quick: after any join or assignment change the member heartbeats every
  ``rebalance_heartbeat_ms`` for a while (a partition released elsewhere reaches it
  within that), and the consumer asks for a heartbeat at once when it releases one.
* Static membership: ``instance_id`` makes a restarted process take its predecessor's
  place and partitions with no rebalance (Kafka's ``group.instance.id``).
* ``close`` leaves the group (a static member's partitions stay reserved for its
  session timeout).

Commits are sent one at a time, in order: a later commit can never be overtaken by an
earlier one and move an offset back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final, Protocol

from foundation.errors import BooklineError, ConfigError, StaleGenerationError
from foundation.names import validate_name
from groups.assignors import ASSIGNORS, TopicPartition
from groups.coordinator_client import CoordinatorClient, JoinAnswer
from groups.state import DEFAULT_ASSIGNOR, SESSION_TIMEOUT_MS_MAX, SESSION_TIMEOUT_MS_MIN
from groups.wire import DEFAULT_SESSION_TIMEOUT_MS, heartbeat_interval_ms

log = logging.getLogger(__name__)

__all__ = ["Membership", "MembershipConfig", "Reconciler"]

# After a join or an assignment change, quick heartbeats go on for one regular
# interval plus this (the other members learn of the rebalance within one interval).
REBALANCE_WINDOW_EXTRA_S: Final = 1.0
# A failed heartbeat (coordinator moving, proxy down) is tried again this soon.
HEARTBEAT_RETRY_S: Final = 0.2
# leave() on close gives up after this long (the session timeout expires us anyway).
LEAVE_DEADLINE_MS: Final = 3_000


@dataclass(frozen=True, slots=True)
class MembershipConfig:
    group: str
    topics: tuple[str, ...]
    # Static membership (Kafka's group.instance.id); None: a dynamic member.
    instance_id: str | None = None
    assignor: str = DEFAULT_ASSIGNOR
    # Missing heartbeats this long gets the member expired and its partitions moved.
    session_timeout_ms: int = DEFAULT_SESSION_TIMEOUT_MS
    # Heartbeat at most this far apart; None: the coordinator's (a third of the session).
    heartbeat_interval_ms: int | None = None
    # Heartbeat interval while a rebalance is under way (hand-offs land this fast).
    rebalance_heartbeat_ms: int = 100

    def __post_init__(self) -> None:
        validate_name(self.group, "group")
        if not self.topics:
            raise ConfigError("a member subscribes to at least one topic")
        for topic in self.topics:
            validate_name(topic, "topic")
        if self.instance_id is not None:
            validate_name(self.instance_id, "group_instance_id")
        if self.assignor not in ASSIGNORS:
            raise ConfigError(f"unknown assignor {self.assignor!r}")
        if not SESSION_TIMEOUT_MS_MIN <= self.session_timeout_ms <= SESSION_TIMEOUT_MS_MAX:
            raise ConfigError(
                f"session_timeout_ms must be within {SESSION_TIMEOUT_MS_MIN}.."
                f"{SESSION_TIMEOUT_MS_MAX}"
            )
        hb = self.heartbeat_interval_ms
        if hb is not None and not 0 < hb < self.session_timeout_ms:
            raise ConfigError("heartbeat_interval_ms must be positive and below the session")
        if self.rebalance_heartbeat_ms <= 0:
            raise ConfigError("rebalance_heartbeat_ms must be positive")


class Reconciler(Protocol):
    """The consumer side, called by :class:`Membership` (all on one event loop)."""

    def held(self) -> frozenset[TopicPartition]:
        """Every partition the consumer holds: consuming, being revoked, being set up."""

    def assignment_changed(self, assignment: frozenset[TopicPartition]) -> None:
        """What the member may consume now: stop fetching what is held but not in it
        (then commit and release it), set up what is new."""

    def partitions_lost(self, lost: frozenset[TopicPartition]) -> None:
        """The member was fenced: drop ``lost`` at once, without committing."""

    async def between_heartbeats(self) -> None:
        """Called after every heartbeat (e.g. to finish a revocation the application
        has not polled for)."""


class Membership:
    """Join, heartbeat, re-join, commit and leave for one member (see the module)."""

    def __init__(
        self,
        coordinator: CoordinatorClient,
        config: MembershipConfig,
        reconciler: Reconciler,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self._cc = coordinator
        self._reconciler = reconciler
        self._clock = clock
        self.member_id: str | None = None
        self.generation = -1
        self.assignment: frozenset[TopicPartition] = frozenset()
        self.rebalances = 0  # joins that changed the member id or the generation
        self._interval_s = heartbeat_interval_ms(config.session_timeout_ms) / 1000
        self._fast_until = 0.0
        self._kicked = asyncio.Event()
        self._join_lock = asyncio.Lock()
        self._commit_lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._closed = False

    @property
    def group(self) -> str:
        return self.config.group

    # -- joining -------------------------------------------------------------------------

    async def join(self) -> None:
        """The first join (errors such as an unknown topic come back as they are); then
        heartbeats start in the background."""
        async with self._join_lock:
            await self._join()
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._heartbeats())

    async def set_topics(self, topics: tuple[str, ...]) -> None:
        """Subscribe to other topics: join again with them (a rebalance)."""
        self.config = MembershipConfig(
            self.group,
            topics,
            self.config.instance_id,
            self.config.assignor,
            self.config.session_timeout_ms,
            self.config.heartbeat_interval_ms,
            self.config.rebalance_heartbeat_ms,
        )
        async with self._join_lock:
            await self._join()

    async def _join(self) -> None:
        cfg = self.config
        old_id = self.member_id
        held = self._reconciler.held()
        answer: JoinAnswer = await self._cc.join(
            cfg.group,
            cfg.topics,
            member_id=old_id,
            instance_id=cfg.instance_id,
            assignor=cfg.assignor,
            session_timeout_ms=cfg.session_timeout_ms,
            owned=held,
            retry_deadline_ms=cfg.session_timeout_ms,
        )
        if old_id is not None and answer.member_id != old_id and held:
            log.warning(
                "group %s: member %s was expired or replaced (now %s); its %d partitions "
                "are lost", cfg.group, old_id, answer.member_id, len(held),
            )  # fmt: skip
            self._reconciler.partitions_lost(held)
        if answer.member_id != old_id or answer.generation != self.generation:
            self.rebalances += 1
        log.info(
            "group %s: member %s joined generation %d with %d partitions",
            cfg.group, answer.member_id, answer.generation, len(answer.assignment),
        )  # fmt: skip
        self.member_id = answer.member_id
        self.generation = answer.generation
        interval_ms = answer.heartbeat_interval_ms
        if cfg.heartbeat_interval_ms is not None:
            interval_ms = min(interval_ms, cfg.heartbeat_interval_ms)
        self._interval_s = max(1, interval_ms) / 1000
        self._hurry()
        self._apply(answer.assignment)

    async def rejoin(self, stale_generation: int) -> None:
        """Join again after ``stale_generation`` was refused (once, however many callers
        saw it)."""
        async with self._join_lock:
            if self.generation == stale_generation and not self._closed:
                await self._join()

    def _apply(self, assignment: frozenset[TopicPartition]) -> None:
        if assignment != self.assignment:
            self._hurry()
        self.assignment = assignment
        self._reconciler.assignment_changed(assignment)

    def _hurry(self) -> None:
        """Quick heartbeats for a while: hand-offs of this rebalance reach us fast."""
        self._fast_until = self._clock() + self._interval_s + REBALANCE_WINDOW_EXTRA_S

    # -- heartbeats ----------------------------------------------------------------------

    def kick(self) -> None:
        """Heartbeat now (the consumer released partitions: tell the coordinator)."""
        self._kicked.set()

    def _delay_s(self) -> float:
        if self._clock() < self._fast_until:
            return min(self._interval_s, self.config.rebalance_heartbeat_ms / 1000)
        return self._interval_s

    async def _heartbeats(self) -> None:
        while not self._closed:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._kicked.wait(), self._delay_s())
            self._kicked.clear()
            try:
                await self.heartbeat()
                await self._reconciler.between_heartbeats()
            except BooklineError as exc:
                log.warning("group %s: heartbeat of %s failed: %s", self.group, self.member_id, exc)
                await asyncio.sleep(HEARTBEAT_RETRY_S)
            except Exception:
                # A bug must not silently end the heartbeats (the member would be
                # expired while its application goes on polling): say it, go on.
                log.exception("group %s: heartbeat of %s crashed", self.group, self.member_id)
                await asyncio.sleep(HEARTBEAT_RETRY_S)

    async def heartbeat(self) -> None:
        """One heartbeat; STALE_GENERATION makes the member join again."""
        member_id, generation = self.member_id, self.generation
        if member_id is None:
            return
        try:
            answer = await self._cc.heartbeat(
                self.group,
                member_id,
                generation,
                self._reconciler.held(),
                retry_deadline_ms=self.config.session_timeout_ms,
            )
        except StaleGenerationError as exc:
            log.info("group %s: %s; joining again", self.group, exc.message)
            await self.rejoin(generation)
            return
        if self.member_id == member_id and self.generation == generation:
            self._apply(answer.assignment)

    # -- commits -------------------------------------------------------------------------

    async def commit(
        self, offsets: Mapping[TopicPartition, int], *, deadline_ms: int | None = None
    ) -> None:
        """Commit ``offsets`` (the next offset to consume, per partition) under the
        current generation; durable when this returns. STALE_GENERATION: join again,
        and commit again if this member kept its id and still holds the partitions;
        otherwise the error is raised (the partitions were lost)."""
        if not offsets:
            return
        async with self._commit_lock:
            member_id, generation = self.member_id, self.generation
            if member_id is None:
                raise StaleGenerationError(f"not a member of group {self.group} (yet)")
            try:
                await self._cc.commit(
                    self.group, member_id, generation, offsets, retry_deadline_ms=deadline_ms
                )
                return
            except StaleGenerationError:
                await self.rejoin(generation)
                if self.member_id != member_id:
                    raise
            held = self._reconciler.held()
            gone = sorted(tp for tp in offsets if tp not in held)
            if gone:
                raise StaleGenerationError(
                    f"group {self.group} moved on (generation {generation} -> "
                    f"{self.generation}); partitions {gone} are no longer this member's"
                )
            assert self.member_id is not None
            await self._cc.commit(
                self.group, self.member_id, self.generation, offsets, retry_deadline_ms=deadline_ms
            )

    # -- leaving ---------------------------------------------------------------------------

    async def close(self, *, leave: bool = True) -> None:
        """Stop heartbeating and (``leave``) leave the group: its partitions go to the
        other members at once instead of after the session timeout."""
        self._closed = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if leave and self.member_id is not None:
            try:
                await self._cc.leave(
                    self.group, self.member_id, retry_deadline_ms=LEAVE_DEADLINE_MS
                )
            except BooklineError as exc:
                log.warning("group %s: leave of %s failed: %s", self.group, self.member_id, exc)
