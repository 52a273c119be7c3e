"""A consumer group's coordinator (:class:`GroupCoordinator`): the group's rules
(:class:`~groups.state.GroupState`) made durable in the group's log stream ``g~group``.

Whoever holds the stream's single writer is the coordinator; the write proxies host it
(``serving/write/groups.py``: owner record + writer lock, redirects, takeover), and tests
build one straight on a core :class:`~streams.writer.LogWriter`.

* **Load**: the log is read from its first readable record and replayed
  (:mod:`groups.log`); every member gets a fresh session.
* **Durable before the answer**: a change is applied to a copy of the state, the copy's
  record is handed to the writer, and the copy becomes the state in the same step (no
  await between, so log order is state order); the answer waits until that record is
  durable. A request that changes nothing (a heartbeat) waits for the last record
  handed over, so no answer ever shows a change the log might not keep. A failed
  append fails the coordinator for good: its host drops it, and the next request
  replays the log on a fresh one (what the log holds is the truth).
* **Timers**: members whose session ran out are expired at ``state.next_deadline_ms()``
  (a generation bump, logged); partition counts of subscribed topics are re-read every
  ``refresh_interval_ms`` (a grown topic rebalances), and with them the end offsets
  behind lag and the metrics (``idle_refresh_interval_ms`` for a group without members).
* **Commit checks**: a commit beyond a partition's cached end offset re-reads the end
  once before it is refused with OUT_OF_RANGE.
* **Compaction**: every ``compact_records`` records a ``full`` record (state and all
  offsets) is written and the log truncated before it, so replay stays short.

The clock is injected (``clock_ms``, monotonic milliseconds); background tasks start
with :meth:`GroupCoordinator.start` (tests may drive :meth:`expire_due` and
:meth:`refresh` themselves instead).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Final, Protocol, TypeVar

from foundation.errors import (
    BadRequestError,
    BooklineError,
    ConfigError,
    NotFoundError,
    OutcomeUnknownError,
    OwnershipLostError,
    SessionSuspendedError,
)
from foundation.names import group_stream
from groups import log as group_log
from groups.assignors import ASSIGNORS, TopicPartition, assignor_names
from groups.coordinator_store import read_group_log
from groups.partition_offsets import PartitionOffsets, TopicView, reset_plan
from groups.state import (
    SESSION_TIMEOUT_MS_MAX,
    SESSION_TIMEOUT_MS_MIN,
    GroupState,
    JoinResult,
)
from groups.wire import (
    OFFSET_MAX,
    CommitRequest,
    HeartbeatRequest,
    JoinRequest,
    ResetPlan,
    ResetRequest,
)
from streams.dlsn import DLSN
from streams.records import LogRecord

if TYPE_CHECKING:
    from streams.namespace import Namespace

log = logging.getLogger(__name__)

__all__ = [
    "CoordinatorConfig",
    "GroupCoordinator",
    "GroupLogWriter",
    "GroupStats",
    "TopicView",
    "check_join",
]

# Partitions a group keeps offsets for: a ``full`` record holds them all and must stay
# well under the 1 MiB record limit (~10 bytes per partition plus topic names).
GROUP_PARTITIONS_MAX: Final = 50_000

T = TypeVar("T")


@dataclasses.dataclass(frozen=True, slots=True)
class CoordinatorConfig:
    # A ``full`` record (state + every offset) every this many records, and the log is
    # truncated before it: replay after a failover reads at most about this many.
    compact_records: int = 1_000
    # End offsets behind commit checks and metrics are reused this long; a commit
    # beyond the cached end re-reads it first, describe always reads fresh ones.
    offsets_max_age_ms: int = 1_000
    # Partition counts (a grown topic rebalances) and lag are refreshed this often.
    refresh_interval_ms: int = 2_000
    # ... and this often for a group without members (its lag still matters: it grows
    # while the consumers are down), so a proxy hosting many idle groups reads little.
    idle_refresh_interval_ms: int = 15_000
    # The expiry timer wakes at least this often (a deadline moved earlier by a join
    # wakes it at once).
    expiry_check_max_ms: int = 1_000

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            if getattr(self, f.name) <= 0:
                raise ConfigError(f"coordinator: {f.name} must be > 0")


class GroupLogWriter(Protocol):
    """What the coordinator needs of the log's writer (a core LogWriter is one)."""

    def write_nowait(self, record: LogRecord) -> asyncio.Future[DLSN]: ...

    async def truncate(self, dlsn: DLSN) -> bool: ...


@dataclasses.dataclass(frozen=True, slots=True)
class GroupStats:
    """What the metrics show of one group (from cached offsets; no I/O)."""

    group: str
    members: int
    generation: int
    rebalances: int  # generation bumps since this coordinator loaded the group
    lag: dict[TopicPartition, int]


def monotonic_ms() -> int:
    return int(time.monotonic() * 1000)


class GroupCoordinator:
    """One group's coordinator on its log's writer. Use from one event loop."""

    def __init__(
        self,
        group: str,
        writer: GroupLogWriter,
        topics: TopicView,
        *,
        config: CoordinatorConfig | None = None,
        clock_ms: Callable[[], int] = monotonic_ms,
        health: Callable[[], None] | None = None,
        on_fail: Callable[[BaseException], None] | None = None,
    ) -> None:
        self.group = group
        self.config = config or CoordinatorConfig()
        self.state = GroupState(group)
        self.exists = False  # a record of it is in the log, and the last is no delete
        self.failed: BaseException | None = None
        self.rebalances = 0
        self._writer = writer
        self._topics = topics
        self._clock = clock_ms
        self._health = health or (lambda: None)
        self._on_fail = on_fail or (lambda exc: None)
        self._last: asyncio.Future[DLSN] | None = None
        self._since_full = 0
        self._compacting: asyncio.Task[None] | None = None
        self.offsets = PartitionOffsets(topics, clock_ms)
        self._wake = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._closed = False
        self._unserved = False  # the health check failed since the last success
        self._warned_shrunk: set[str] = set()

    # -- loading and lifecycle -----------------------------------------------------------

    @classmethod
    async def load(
        cls,
        ns: Namespace,
        group: str,
        writer: GroupLogWriter,
        topics: TopicView,
        **kwargs: Any,
    ) -> GroupCoordinator:
        """A coordinator with the group's log replayed. The caller holds the log's
        writer (so nothing is appended behind the replay)."""
        coord = cls(group, writer, topics, **kwargs)
        replayed = await read_group_log(ns, group_stream(group), coord.state, coord._clock())
        coord.exists = replayed.records > 0 and not replayed.deleted
        coord._since_full = replayed.since_full
        log.info(
            "group %s: replayed %d records (generation %d, %d members, %d offsets)",
            group,
            replayed.records,
            coord.state.generation,
            len(coord.state.members),
            len(coord.state.offsets),
        )
        return coord

    def start(self) -> None:
        """Start the expiry and refresh timers (and a compaction that is due)."""
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._expiry_loop(), name=f"group-expiry-{self.group}"),
            loop.create_task(self._refresh_loop(), name=f"group-refresh-{self.group}"),
        ]
        self._maybe_compact()

    async def close(self) -> None:
        """Stop the timers (the host closes the writer)."""
        self._closed = True
        tasks = [*self._tasks, *([self._compacting] if self._compacting else [])]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, BooklineError):
                await task

    @property
    def usable(self) -> bool:
        return self._serving()

    def _serving(self) -> bool:
        return not self._closed and self.failed is None

    # -- membership ----------------------------------------------------------------------

    async def join(self, req: JoinRequest) -> JoinResult:
        self._check()
        counts = await check_join(req, self._topics)
        self._check()
        now = self._clock()

        def apply(s: GroupState) -> JoinResult:
            # New topics are recorded without a rebalance of their own (nobody
            # subscribes to them yet); grown ones rebalance, then the join does.
            fresh = {t: n for t, n in counts.items() if t not in s.partitions}
            s.partitions.update(fresh)
            s.set_partitions(self._grown(s, counts))
            return s.join(
                now,
                member_id=req.member_id,
                instance_id=req.instance_id,
                topics=req.topics,
                assignor=req.assignor,
                session_timeout_ms=req.session_timeout_ms,
                owned=req.owned,
            )

        result, fut = self._mutate(apply)
        self._wake.set()  # a new member's deadline may come first
        await self._durable(fut)
        return result

    async def heartbeat(self, req: HeartbeatRequest) -> tuple[int, frozenset[TopicPartition]]:
        """The generation and the partitions to consume now."""
        self._check()
        parts = self.state.heartbeat(self._clock(), req.member_id, req.generation, req.owned)
        generation = self.state.generation
        await self._durable(self._last)
        return generation, parts

    async def leave(self, member_id: str) -> None:
        self._check()
        _changed, fut = self._mutate(lambda s: s.leave(member_id))
        await self._durable(fut)

    async def expire_due(self) -> list[str]:
        """Expire members whose session ran out (the timer calls this)."""
        self._check()
        now = self._clock()
        due = self.state.next_deadline_ms()
        if due is None or due >= now:
            return []  # nothing to expire: no copy of the state
        gone, fut = self._mutate(lambda s: s.expire(now))
        if gone:
            log.info("group %s: sessions expired: %s", self.group, ", ".join(gone))
        await self._durable(fut)
        return gone

    # -- offsets -------------------------------------------------------------------------

    async def commit(self, req: CommitRequest) -> None:
        """Commit ``req.offsets``; returns once durable. Nothing changes on an error."""
        self._check()
        # Membership, generation and assignment first: no I/O for a refused commit.
        self.state.check_commit(req.member_id, req.generation, req.offsets, lambda tp: OFFSET_MAX)
        beyond = [tp for tp, o in req.offsets.items() if o > self.offsets.end(tp)]
        if beyond:
            await self.offsets.read(beyond, max_age_ms=0)
            self._check()
        self.state.check_commit(req.member_id, req.generation, req.offsets, self.offsets.end)
        self._check_tracked(req.offsets)
        fut = self._append(group_log.Commit(req.generation, req.member_id, dict(req.offsets)))
        self.state.apply_commit(req.offsets)
        await self._durable(fut)

    async def set_offsets(self, offsets: Mapping[TopicPartition, int]) -> None:
        """Offsets committed from outside the membership (Kafka's standalone consumers:
        ``assign()`` then commit); refused while the group has live members
        (GROUP_NOT_EMPTY), whose commits would race them, as Kafka refuses them."""
        self._check()
        self.state.require_empty("take commits from outside its membership")
        await self.offsets.read(list(offsets), max_age_ms=0)
        self._check()
        self.state.require_empty("take commits from outside its membership")
        self.state.reset_offsets(offsets, self.offsets.end)
        self._check_tracked(offsets)
        fut = self._append(group_log.Reset(dict(offsets)))
        self.exists = True
        await self._durable(fut)

    def committed(self) -> dict[TopicPartition, int]:
        self._check()
        self._require_exists()
        return dict(self.state.offsets)

    async def reset(self, req: ResetRequest) -> ResetPlan:
        """An operator's reset (only its plan when ``req.dry_run``); GROUP_NOT_EMPTY
        while the group has live members, as Kafka refuses even the dry run then."""
        self._check()
        self.state.require_empty("reset its offsets")
        topics = sorted(
            req.topics
            if req.topics is not None
            else {t for t, _p in self.state.offsets} | set(self.state.partitions)
        )
        if not topics:
            raise BadRequestError(f"group {self.group} knows no topics yet; name them (topics)")
        plan = await reset_plan(self.offsets, topics, req)
        if req.dry_run:
            return plan
        await self.offsets.read(plan.offsets, max_age_ms=0)
        self._check()
        self.state.require_empty("reset its offsets")  # a member may have joined meanwhile
        self.state.reset_offsets(plan.offsets, self.offsets.end)
        self._check_tracked(plan.offsets)
        fut = self._append(group_log.Reset(plan.offsets))
        self.exists = True
        await self._durable(fut)
        return plan

    async def delete(self) -> None:
        """Log the group's deletion (GROUP_NOT_EMPTY while members live); the host then
        deletes the log stream. The coordinator serves nothing afterwards."""
        self._check()
        self._require_exists()
        self.state.require_empty("delete it")
        fut = self._append(group_log.Deleted())
        group_log.replay(self.state, [group_log.Deleted()], self._clock())
        self.exists = False
        await self._durable(fut)
        self._closed = True

    # -- inspection ----------------------------------------------------------------------

    async def describe(self) -> dict[str, Any]:
        """Members, generation, assignor, and per partition the committed offset, the
        start and end offsets (read now) and the lag."""
        self._check()
        self._require_exists()
        tps = self._tracked()
        await self.offsets.read(tps, max_age_ms=0, wants_start=lambda tp: True)
        s = self.state
        partitions = []
        for tp in tps:
            holder = s.holder(tp)
            partitions.append(
                {
                    "topic": tp[0],
                    "partition": tp[1],
                    "member_id": None if holder is None else holder.member_id,
                    "committed": s.offsets.get(tp),
                    "start": self.offsets.start(tp),
                    "end": self.offsets.cached_end(tp),
                    "lag": self._lag(tp),
                }
            )
        members = [
            {
                "member_id": m.member_id,
                "instance_id": m.instance_id,
                "topics": sorted(m.topics),
                "session_timeout_ms": m.session_timeout_ms,
                "assignment": sorted(m.assigned),
                "consuming": sorted(s.partitions_now(m)),
                "owned": sorted(m.owned),
            }
            for m in s.members.values()
        ]
        return {
            "group": self.group,
            "state": self.phase(),
            "generation": s.generation,
            "assignor": s.assignor,
            "members": members,
            "partitions": partitions,
            "lag": sum(p["lag"] or 0 for p in partitions),
        }

    def stats(self) -> GroupStats:
        lag = {tp: v for tp in self._tracked() if (v := self._lag(tp)) is not None}
        return GroupStats(
            self.group, len(self.state.members), self.state.generation, self.rebalances, lag
        )

    async def refresh(self) -> None:
        """Re-read the subscribed topics' partition counts (a grown topic rebalances)
        and the offsets behind lag (the refresh timer calls this)."""
        self._check()
        topics = self.state.topics
        if topics:
            counts = await self._topics.partition_counts(topics)
            self._check()
            grown = self._grown(self.state, counts)
            if grown:
                _changed, fut = self._mutate(lambda s: s.set_partitions(grown))
                await self._durable(fut)
        # Start offsets only where lag needs them (nothing committed).
        await self.offsets.read(
            self._tracked(),
            self.config.offsets_max_age_ms,
            wants_start=lambda tp: tp not in self.state.offsets,
        )

    # -- internals: state changes and the log ------------------------------------------

    def _check(self) -> None:
        """Refuse to serve unless this coordinator may: not failed nor closed, and the
        host's health check passes (its stream still owned, its session connected). A
        lost stream fails it for good; after a spell of not serving (a suspended
        session), every member gets a fresh session, as after a failover: none could
        heartbeat meanwhile."""
        if self.failed is not None:
            raise OwnershipLostError(f"coordinator of group {self.group} failed; retry")
        if self._closed:
            raise OwnershipLostError(f"coordinator of group {self.group} closed; retry")
        try:
            self._health()
        except OwnershipLostError as exc:
            self._fail(exc)
            raise
        except BooklineError:
            self._unserved = True
            raise
        if self._unserved:
            self._unserved = False
            now = self._clock()
            for m in self.state.members.values():
                m.deadline_ms = max(m.deadline_ms, now + m.session_timeout_ms)
            log.info("group %s: serving again; members get fresh sessions", self.group)

    def _require_exists(self) -> None:
        if not self.exists:
            raise NotFoundError(f"group {self.group} does not exist")

    def _mutate(self, fn: Callable[[GroupState], T]) -> tuple[T, asyncio.Future[DLSN] | None]:
        """Run ``fn`` on a copy of the state; if it raises, nothing changed. If the
        copy's snapshot differs, its record is handed to the writer and the copy becomes
        the state (one step, no await). Returns fn's result and the record's future."""
        scratch = copy.deepcopy(self.state)
        result = fn(scratch)
        snap = scratch.snapshot()
        if snap == self.state.snapshot():
            self.state = scratch  # deadlines and owned partitions (not logged) moved
            return result, None
        fut = self._append(group_log.Snapshot(snap))
        self.rebalances += scratch.generation - self.state.generation
        self.state = scratch
        self.exists = True
        return result, fut

    def _append(self, record: group_log.GroupRecord) -> asyncio.Future[DLSN]:
        try:
            fut = self._writer.write_nowait(LogRecord(group_log.encode(record)))
        except BooklineError as exc:
            self._fail(exc)
            raise OwnershipLostError(
                f"group {self.group}: its log cannot be written ({exc.name}); retry"
            ) from exc
        self._last = fut
        self._since_full += 1
        self._maybe_compact()
        return fut

    async def _durable(self, fut: asyncio.Future[DLSN] | None) -> None:
        """Wait until ``fut`` (and every record before it) is durable."""
        if fut is None:
            fut = self._last
        if fut is None:
            return
        try:
            await asyncio.shield(fut)
        except BooklineError as exc:
            self._fail(exc)
            raise OutcomeUnknownError(
                f"group {self.group}: the log write failed ({exc.name}); retry"
            ) from exc

    def _fail(self, exc: BaseException) -> None:
        if self.failed is None:
            self.failed = exc
            log.warning("group %s: coordinator failed: %s", self.group, exc)
            self._on_fail(exc)

    def _maybe_compact(self) -> None:
        if self._since_full < self.config.compact_records or self._compacting is not None:
            return
        if self._closed or self.failed is not None or not self.exists:
            return
        self._compacting = asyncio.get_running_loop().create_task(self._compact())

    async def _compact(self) -> None:
        """A ``full`` record, then truncation before it."""
        try:
            record = group_log.Full(self.state.snapshot(), dict(self.state.offsets))
            fut = self._append(record)
            self._since_full = 0
            dlsn = await asyncio.shield(fut)
            await self._writer.truncate(dlsn)
            log.info("group %s: log compacted (truncated before %s)", self.group, dlsn)
        except BooklineError as exc:
            log.warning("group %s: compaction failed: %s", self.group, exc)
        finally:
            self._compacting = None

    def _check_tracked(self, offsets: Mapping[TopicPartition, int]) -> None:
        new = sum(1 for tp in offsets if tp not in self.state.offsets)
        if new and len(self.state.offsets) + new > GROUP_PARTITIONS_MAX:
            raise BadRequestError(
                f"group {self.group} would keep offsets of more than "
                f"{GROUP_PARTITIONS_MAX} partitions"
            )

    def _grown(self, s: GroupState, counts: Mapping[str, int]) -> dict[str, int]:
        out = {}
        for topic, n in counts.items():
            known = s.partitions.get(topic, 0)
            if n > known:
                out[topic] = n
            elif n < known and topic not in self._warned_shrunk:
                # Partitions never shrink; a topic deleted and created again smaller
                # keeps its old count here until the group is recreated.
                self._warned_shrunk.add(topic)
                log.warning(
                    "group %s: topic %s has %d partitions, fewer than the %d the group knows",
                    self.group,
                    topic,
                    n,
                    known,
                )
        return out

    def phase(self) -> str:
        """empty (no members), stable (every member consumes what it is assigned) or
        rebalancing."""
        s = self.state
        if not s.members:
            return "empty"
        settled = all(s.partitions_now(m) == m.assigned for m in s.members.values())
        return "stable" if settled else "rebalancing"

    # -- internals: offsets ----------------------------------------------------------

    def _tracked(self) -> list[TopicPartition]:
        """Partitions lag is reported for: every partition of a subscribed topic, and
        every partition with a committed offset."""
        s = self.state
        tps = {(t, p) for t in s.topics for p in range(s.partitions.get(t, 0))}
        tps.update(s.offsets)
        return sorted(tps)

    def _lag(self, tp: TopicPartition) -> int | None:
        return self.offsets.lag(tp, self.state.offsets.get(tp))

    # -- internals: timers --------------------------------------------------------------

    async def _expiry_loop(self) -> None:
        while self._serving():
            nxt = self.state.next_deadline_ms()
            wait_ms = self.config.expiry_check_max_ms
            if nxt is not None:
                wait_ms = max(0, min(wait_ms, nxt - self._clock() + 1))
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), wait_ms / 1000)
            if not self._serving():
                return
            try:
                await self.expire_due()
            except SessionSuspendedError:
                continue  # the host's session is back soon, or lost (then we fail)
            except BooklineError as exc:
                log.warning("group %s: expiring sessions: %s", self.group, exc)

    async def _refresh_loop(self) -> None:
        last = self._clock()
        while self._serving():
            await asyncio.sleep(self.config.refresh_interval_ms / 1000)
            if not self._serving():
                return
            if (
                not self.state.members
                and self._clock() - last < self.config.idle_refresh_interval_ms
            ):
                continue
            last = self._clock()
            try:
                await self.refresh()
            except SessionSuspendedError:
                continue
            except BooklineError as exc:
                log.warning("group %s: refreshing partitions and offsets: %s", self.group, exc)


async def check_join(req: JoinRequest, topics: TopicView) -> dict[str, int]:
    """What a join is refused for whatever the group's state: an unknown assignor, a
    session timeout out of bounds, topics that do not exist. Returns the topics'
    partition counts. (The host checks this before creating a new group's log.)"""
    if req.assignor not in ASSIGNORS:
        raise BadRequestError(
            f"unknown assignor {req.assignor!r}; known: {', '.join(assignor_names())}"
        )
    if not SESSION_TIMEOUT_MS_MIN <= req.session_timeout_ms <= SESSION_TIMEOUT_MS_MAX:
        raise BadRequestError(
            f"session timeout {req.session_timeout_ms} ms is outside "
            f"[{SESSION_TIMEOUT_MS_MIN}, {SESSION_TIMEOUT_MS_MAX}]"
        )
    counts = await topics.partition_counts(req.topics)
    unknown = sorted(t for t in req.topics if t not in counts)
    if unknown:
        raise BadRequestError(f"unknown topic(s) {', '.join(unknown)}")
    return counts
