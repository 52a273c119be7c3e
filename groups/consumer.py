"""Consumer groups' consumers: :class:`GroupConsumer` (asyncio) and
:class:`SyncGroupConsumer` (blocking), with Kafka's API and delivery rules.

::

    async with GroupConsumer.from_cluster_file("cluster.json", "billing", ["orders"]) as c:
        while True:
            for rec in await c.poll(timeout_s=1.0):
                handle(rec)             # at-least-once: auto-commit commits what the
                                        # previous poll returned, at the next poll

Records come from the bookies through the core library (``via="core"``: a
:class:`~streams.reader.LogReader` per partition, speculative reads, read-ahead) or
through a read proxy (``via="proxy"``, the thin client); :mod:`groups.fetchers`. The
group protocol (join, heartbeats, cooperative hand-offs, static membership) is
:mod:`groups.membership`; this module keeps per partition its state, fetch and
position (:mod:`groups.held`); settings are :mod:`groups.consumer_config`.

A partition is *assigning* (given by the coordinator; ``on_assign`` and its start
position come at the next ``poll``), *active* (fetched, its records returned by
``poll``) or *revoking* (taken away: fetching stopped at once and its unreturned
records dropped; at the next ``poll`` ``on_revoke`` runs, then -- with auto-commit --
its position is committed, then it is released and the coordinator hands it on).
Because the callbacks run inside ``poll``, the application has finished the records of
the previous poll when its partitions are revoked; a revocation the application does
not ``poll`` for within ``max_poll_interval_ms`` is finished in the background,
committing only what the poll before the last one returned.

Positions: ``position(tp)`` is the offset of the next record ``poll`` returns for
``tp``. Auto-commit commits, every ``auto_commit_interval_ms`` at the start of a
``poll``, the positions as of that call -- records returned by earlier polls, which
the application has processed by then (at-least-once). ``commit()`` commits the current
positions; ``commit(offsets)`` exactly those (the next offset to consume). A new
partition starts at its committed offset, else at ``auto_offset_reset`` (``earliest`` |
``latest`` | ``none``); an offset past the end or truncated away is reset the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from foundation.errors import (
    BooklineError,
    ClosedError,
    ConfigError,
    NotAssignedError,
    NotFoundError,
    OutOfRangeError,
    StaleGenerationError,
)
from groups.assignors import TopicPartition
from groups.consumer_config import VIAS, ConsumerConfig
from groups.coordinator_client import CoordinatorClient
from groups.fetchers import (
    ConsumerRecord,
    CoreFetchers,
    Fetchers,
    PartitionFetch,
    PartitionSource,
    ProxyFetchers,
)
from groups.held import HeldPartition, PartState, stop, stop_soon
from groups.membership import Membership

if TYPE_CHECKING:
    from streams.config import NamespaceConfig
    from streams.namespace import Namespace
    from thinclient.client import ClientConfig, ProxyClient

log = logging.getLogger(__name__)

__all__ = [
    "ConsumerConfig",
    "ConsumerRecord",
    "GroupConsumer",
    "Listener",
    "TopicPartition",
]

# on_assign / on_revoke / on_lost: called with the partitions (sorted); may be async.
Listener = Callable[[list[TopicPartition]], Awaitable[None] | None]


class GroupConsumer:
    """A member of consumer group ``group`` reading ``topics`` (see the module)."""

    def __init__(
        self,
        group: str,
        topics: Sequence[str] = (),
        *,
        client: ProxyClient,
        namespace: Namespace | None = None,
        config: ConsumerConfig | None = None,
        on_assign: Listener | None = None,
        on_revoke: Listener | None = None,
        on_lost: Listener | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """``client`` reaches the coordinator (and, without ``namespace``, the read
        proxies); with ``namespace`` partitions are read from the bookies."""
        self.config = config or ConsumerConfig()
        self.group = group
        self._topics = tuple(sorted(set(topics)))
        self._client = client
        self._fetchers: Fetchers = (
            CoreFetchers(namespace) if namespace is not None else ProxyFetchers(client.transport)
        )
        self._coordinator = CoordinatorClient.of(client)
        self._membership: Membership | None = None
        self.on_assign = on_assign
        self.on_revoke = on_revoke
        self.on_lost = on_lost
        self._clock = clock
        self._parts: dict[TopicPartition, HeldPartition] = {}
        self._fenced: set[TopicPartition] = set()  # lost to fencing: commits of them refused
        self._lost: set[TopicPartition] = set()  # waiting for on_lost
        self._committable: dict[TopicPartition, int] = {}
        self._committed: dict[TopicPartition, int] = {}  # what this consumer last committed
        self._wake = asyncio.Event()
        self._rr = 0
        self._next_auto_commit = 0.0
        self._polled_at = clock()
        self._owned: list[Callable[[], Awaitable[None]]] = []  # closed with the consumer
        self._closed = False
        self._commit_tasks: set[asyncio.Task[None]] = set()

    @classmethod
    async def from_cluster_file(
        cls,
        path: str | Path,
        group: str,
        topics: Sequence[str],
        *,
        via: str = "proxy",
        config: ConsumerConfig | None = None,
        client_config: ClientConfig | None = None,
        namespace_config: NamespaceConfig | None = None,
        **kwargs: Any,
    ) -> GroupConsumer:
        """A started consumer of the cluster a ``cluster.json`` describes; it owns its
        thin client (and, ``via="core"``, its namespace) and closes them."""
        from streams.namespace import Namespace
        from thinclient.client import ProxyClient

        if via not in VIAS:
            raise ConfigError(f"via must be one of {', '.join(VIAS)}, not {via!r}")
        client = await ProxyClient.from_cluster_file(path, config=client_config).start()
        ns: Namespace | None = None
        try:
            if via == "core":
                ns = await Namespace.from_cluster_file(path, config=namespace_config)
            consumer = cls(group, topics, client=client, namespace=ns, config=config, **kwargs)
        except BaseException:
            if ns is not None:
                await ns.close()
            await client.close()
            raise
        consumer._owned.append(client.close)
        if ns is not None:
            consumer._owned.append(ns.close)
        try:
            return await consumer.start()
        except BaseException:
            await consumer.close()
            raise

    # -- lifecycle -----------------------------------------------------------------------

    async def start(self) -> GroupConsumer:
        """Join the group (when subscribed to topics)."""
        if self._membership is None and self._topics:
            self._membership = Membership(
                self._coordinator,
                self.config.membership(self.group, self._topics),
                self,
                clock=self._clock,
            )
            await self._membership.join()
        return self

    async def subscribe(self, topics: Sequence[str]) -> None:
        """Consume ``topics`` (instead of the topics given before): joins the group, or
        joins again with the new topics (a rebalance)."""
        self._topics = tuple(sorted(set(topics)))
        if self._membership is None:
            await self.start()
        else:
            await self._membership.set_topics(self._topics)

    async def __aenter__(self) -> GroupConsumer:
        return await self.start()

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Revoke everything (``on_revoke``), commit the positions (auto-commit), leave
        the group, close what the consumer owns."""
        if self._closed:
            return
        self._closed = True
        membership = self._membership
        try:
            if membership is not None:
                held = sorted(tp for tp, p in self._parts.items() if p.state is PartState.ACTIVE)
                if held and self.on_revoke is not None:
                    await _call(self.on_revoke, held)
                if self.config.enable_auto_commit:
                    await self._commit_quietly(self._positions(self._parts))
                await asyncio.gather(*self._commit_tasks, return_exceptions=True)
                await membership.close(leave=True)
        finally:
            for part in self._parts.values():
                await stop(part)
            self._parts.clear()
            for close in reversed(self._owned):
                await close()

    def _check_open(self) -> Membership:
        if self._closed:
            raise ClosedError(f"consumer of group {self.group} was closed")
        if self._membership is None:
            raise ClosedError(f"consumer of group {self.group} is not subscribed or started")
        return self._membership

    # -- what the application sees -------------------------------------------------------

    @property
    def member_id(self) -> str | None:
        return None if self._membership is None else self._membership.member_id

    @property
    def generation(self) -> int:
        return -1 if self._membership is None else self._membership.generation

    def assignment(self) -> frozenset[TopicPartition]:
        """The partitions being consumed (``on_assign`` done, not revoked)."""
        return frozenset(tp for tp, p in self._parts.items() if p.state is PartState.ACTIVE)

    def position(self, tp: TopicPartition) -> int | None:
        """The offset of the next record ``poll`` returns for ``tp`` (None until the
        partition's start is known; a pending seek is not applied yet)."""
        return self._held(tp).position

    async def committed(self, tp: TopicPartition) -> int | None:
        """The group's committed offset of ``tp`` (any partition; asks the coordinator)."""
        return (await self._coordinator.offsets(self.group)).get(tp)

    def paused(self) -> frozenset[TopicPartition]:
        return frozenset(tp for tp, p in self._parts.items() if p.paused)

    def pause(self, tps: Iterable[TopicPartition]) -> None:
        """``poll`` returns nothing of these until resumed (fetching stops once their
        buffer is full; positions and assignment are kept)."""
        for tp in tps:
            self._held(tp).paused = True

    def resume(self, tps: Iterable[TopicPartition]) -> None:
        for tp in tps:
            self._held(tp).paused = False
        self._wake.set()

    def seek(self, tp: TopicPartition, offset: int) -> None:
        """The next ``poll`` returns ``tp`` from ``offset`` (records buffered beyond
        are dropped). Allowed in ``on_assign`` to choose a new partition's start."""
        if offset < 0:
            raise OutOfRangeError(f"offset {offset} of {tp[0]}/{tp[1]} is negative")
        self._seek(tp, offset)

    def seek_to_beginning(self, tps: Iterable[TopicPartition] | None = None) -> None:
        for tp in self._targets(tps):
            self._seek(tp, "earliest")

    def seek_to_end(self, tps: Iterable[TopicPartition] | None = None) -> None:
        for tp in self._targets(tps):
            self._seek(tp, "latest")

    def seek_to_timestamp(
        self, timestamp_ms: int, tps: Iterable[TopicPartition] | None = None
    ) -> None:
        """Each partition from its first record written at or after ``timestamp_ms``
        (its end when there is none yet)."""
        for tp in self._targets(tps):
            self._seek(tp, f"time:{int(timestamp_ms)}")

    def _targets(self, tps: Iterable[TopicPartition] | None) -> list[TopicPartition]:
        if tps is None:
            return [tp for tp, p in self._parts.items() if p.state is not PartState.REVOKING]
        return list(tps)

    def _seek(self, tp: TopicPartition, target: int | str) -> None:
        part = self._held(tp)
        if part.state is PartState.REVOKING:
            raise NotAssignedError(f"partition {tp[1]} of {tp[0]} is being revoked")
        part.seek_to = target
        self._wake.set()

    def _held(self, tp: TopicPartition) -> HeldPartition:
        part = self._parts.get(tp)
        if part is None:
            raise NotAssignedError(
                f"partition {tp[1]} of {tp[0]} is not assigned to this consumer of {self.group}"
            )
        return part

    # -- poll ----------------------------------------------------------------------------

    async def poll(
        self, max_records: int | None = None, timeout_s: float = 0.0
    ) -> list[ConsumerRecord]:
        """Records of the active, unpaused partitions, waiting up to ``timeout_s`` for
        some. Rebalance callbacks run here, before records are returned."""
        return await self._poll(max_records, timeout_s, self._reconcile)

    async def _poll(
        self,
        max_records: int | None,
        timeout_s: float,
        reconcile: Callable[[], Awaitable[None]] | None,
    ) -> list[ConsumerRecord]:
        """``reconcile=None`` (the blocking facade) returns at once while a rebalance
        step is pending, for the caller to run it in its own thread."""
        self._check_open()
        self._polled_at = self._clock()
        self._committable = self._positions(self._parts)
        self._auto_commit()
        limit = max_records or self.config.max_poll_records
        deadline = self._clock() + timeout_s
        while True:
            self._wake.clear()
            if self._changes_pending():
                if reconcile is None:
                    return []
                await reconcile()
            await self._apply_seeks()
            await self._recover_fetches()
            out = self._take(limit)
            if out:
                return out
            remaining = deadline - self._clock()
            if remaining <= 0:
                return out
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), remaining)

    def _take(self, limit: int) -> list[ConsumerRecord]:
        parts = list(self._parts.values())
        out: list[ConsumerRecord] = []
        n = len(parts)
        for i in range(n):
            part = parts[(self._rr + i) % n]
            fetch = part.fetch
            if (
                part.state is not PartState.ACTIVE
                or part.paused
                or part.seek_to is not None
                or fetch is None
                or not fetch.buffered
            ):
                continue
            recs = fetch.take(limit - len(out))
            part.position = recs[-1][2] + 1
            out.extend(recs)
            if len(out) >= limit:
                self._rr = (self._rr + i + 1) % n
                break
        else:
            self._rr = (self._rr + 1) % max(1, n)
        return out

    # -- commits -------------------------------------------------------------------------

    async def commit(self, offsets: Mapping[TopicPartition, int] | None = None) -> None:
        """Commit ``offsets`` (the next offset to consume per partition), or the current
        positions of every partition held; durable in the group's log on return.
        STALE_GENERATION: this member was fenced and lost those partitions;
        NOT_ASSIGNED: a partition it does not hold."""
        membership = self._check_open()
        chosen = self._positions(self._parts) if offsets is None else self._checked(offsets)
        await membership.commit(chosen, deadline_ms=self.config.commit_timeout_ms)
        self._committed.update(chosen)

    def commit_async(
        self,
        offsets: Mapping[TopicPartition, int] | None = None,
        callback: Callable[[Mapping[TopicPartition, int], BaseException | None], None]
        | None = None,
    ) -> asyncio.Task[None]:
        """Commit in the background (commits are applied in the order made);
        ``callback(offsets, error)`` when done; errors are also logged."""
        self._check_open()
        chosen = self._positions(self._parts) if offsets is None else self._checked(offsets)

        async def run() -> None:
            error: BaseException | None = None
            try:
                await self.commit(chosen)
            except BooklineError as exc:
                log.warning("group %s: commit of %d offsets failed: %s", self.group,
                            len(chosen), exc)  # fmt: skip
                error = exc
            if callback is not None:
                callback(chosen, error)

        task = asyncio.get_running_loop().create_task(run())
        self._commit_tasks.add(task)
        task.add_done_callback(self._commit_tasks.discard)
        return task

    def _checked(self, offsets: Mapping[TopicPartition, int]) -> dict[TopicPartition, int]:
        for tp in offsets:
            if tp in self._fenced:
                raise StaleGenerationError(
                    f"partition {tp[1]} of {tp[0]} was lost when member "
                    f"{self.member_id} of group {self.group} was fenced; not committed"
                )
            self._held(tp)
        return dict(offsets)

    def _positions(self, tps: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        out = {}
        for tp in tps:
            part = self._parts.get(tp)
            if (
                part is not None
                and part.state is not PartState.ASSIGNING
                and part.position is not None
            ):
                out[tp] = part.position
        return out

    def _auto_commit(self) -> None:
        if not self.config.enable_auto_commit:
            return
        now = self._clock()
        if now < self._next_auto_commit:
            return
        self._next_auto_commit = now + self.config.auto_commit_interval_ms / 1000
        changed = {tp: o for tp, o in self._committable.items() if self._committed.get(tp) != o}
        if changed:
            self.commit_async(changed)

    async def _commit_quietly(self, offsets: Mapping[TopicPartition, int]) -> None:
        changed = {tp: o for tp, o in offsets.items() if self._committed.get(tp) != o}
        if not changed or self._membership is None:
            return
        try:
            await self._membership.commit(changed, deadline_ms=self.config.commit_timeout_ms)
            self._committed.update(changed)
        except BooklineError as exc:
            log.warning("group %s: commit of %s failed: %s", self.group, sorted(changed), exc)

    # -- the membership's side (Reconciler) ----------------------------------------------

    def held(self) -> frozenset[TopicPartition]:
        return frozenset(self._parts)

    def assignment_changed(self, assignment: frozenset[TopicPartition]) -> None:
        now = self._clock()
        for tp, part in self._parts.items():
            if tp not in assignment and part.state is not PartState.REVOKING:
                log.info("group %s: %s/%d revoked", self.group, *tp)
                part.state = PartState.REVOKING
                part.revoking_since = now
                stop_soon(part)
        for tp in assignment:
            current = self._parts.get(tp)
            if current is None:
                self._parts[tp] = HeldPartition(self._fetchers.source(tp))
                self._fenced.discard(tp)
            elif current.state is PartState.REVOKING:
                current.state = PartState.ASSIGNING  # given back before it was released
        if self._changes_pending():
            self._wake.set()

    def partitions_lost(self, lost: frozenset[TopicPartition]) -> None:
        for tp in lost:
            part = self._parts.pop(tp, None)
            if part is not None:
                stop_soon(part, close_source=True)
        self._fenced |= lost
        self._lost |= lost
        self._wake.set()

    async def between_heartbeats(self) -> None:
        """Finish revocations the application did not poll for in time, committing
        what the poll before the last returned (the last poll's records may still be
        in the application's hands)."""
        limit = self.config.max_poll_interval_ms / 1000
        now = self._clock()
        overdue = [
            tp
            for tp, p in self._parts.items()
            if p.state is PartState.REVOKING
            and now - max(p.revoking_since, self._polled_at) > limit
        ]
        if overdue:
            log.warning(
                "group %s: no poll for %.0f s; releasing %s without on_revoke",
                self.group, now - self._polled_at, overdue,
            )  # fmt: skip
            if self.config.enable_auto_commit:
                await self._commit_quietly(
                    {tp: self._committable[tp] for tp in overdue if tp in self._committable}
                )
            await self._release(overdue)

    # -- reconciliation (inside poll) ----------------------------------------------------

    def _changes_pending(self) -> bool:
        return bool(self._lost) or any(
            p.state is not PartState.ACTIVE for p in self._parts.values()
        )

    async def _reconcile(self) -> None:
        revoking = self._revoking()
        if revoking:
            if self.on_revoke is not None:
                await _call(self.on_revoke, revoking)
            await self._finish_revoke(revoking)
        lost = self._take_lost()
        if lost and self.on_lost is not None:
            await _call(self.on_lost, lost)
        assigning = self._assigning()
        if assigning:
            committed = await self._prepare_assign(assigning)
            if self.on_assign is not None:
                await _call(self.on_assign, assigning)
            await self._finish_assign(assigning, committed)

    def _revoking(self) -> list[TopicPartition]:
        return sorted(tp for tp, p in self._parts.items() if p.state is PartState.REVOKING)

    def _assigning(self) -> list[TopicPartition]:
        return sorted(tp for tp, p in self._parts.items() if p.state is PartState.ASSIGNING)

    def _take_lost(self) -> list[TopicPartition]:
        lost, self._lost = sorted(self._lost), set()
        return lost

    async def _finish_revoke(self, tps: list[TopicPartition]) -> None:
        """Commit (auto-commit) and release the partitions still being revoked."""
        still = [
            tp for tp in tps if tp in self._parts and self._parts[tp].state is PartState.REVOKING
        ]
        if self.config.enable_auto_commit:
            await self._commit_quietly(self._positions(still))
        await self._release(still)

    async def _release(self, tps: list[TopicPartition]) -> None:
        released = []
        for tp in tps:
            part = self._parts.get(tp)
            if part is not None and part.state is PartState.REVOKING:
                del self._parts[tp]
                self._committable.pop(tp, None)
                await stop(part)
                released.append(tp)
        if released and self._membership is not None:
            log.info("group %s: released %s", self.group, released)
            self._membership.kick()

    async def _prepare_assign(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        """The group's committed offsets (asked before ``on_assign``, which may seek)."""
        offsets = await self._coordinator.offsets(self.group)
        return {tp: offsets[tp] for tp in tps if tp in offsets}

    async def _finish_assign(
        self, tps: list[TopicPartition], committed: Mapping[TopicPartition, int]
    ) -> None:
        for tp in tps:
            part = self._parts.get(tp)
            if part is None or part.state is not PartState.ASSIGNING:
                continue
            if part.seek_to is None and part.position is None:
                part.seek_to = committed[tp] if tp in committed else self._reset_target(tp)
            elif part.seek_to is None:
                part.seek_to = part.position  # given back while being revoked
            part.state = PartState.ACTIVE
            self._committed.setdefault(tp, committed.get(tp, -1))
        await self._apply_seeks()

    def _reset_target(self, tp: TopicPartition) -> str:
        policy = self.config.auto_offset_reset
        if policy == "none":
            raise OutOfRangeError(
                f"no valid offset for {tp[0]}/{tp[1]} in group {self.group} and "
                "auto_offset_reset is none"
            )
        return policy

    async def _apply_seeks(self) -> None:
        for tp, part in list(self._parts.items()):
            target = part.seek_to
            if target is None or part.state is not PartState.ACTIVE:
                continue
            offset = (
                target if isinstance(target, int) else await self._fetchers.offset_at(tp, target)
            )
            if part.seek_to is not target or self._parts.get(tp) is not part:
                continue  # sought again, or gone, meanwhile
            part.seek_to = None
            await stop(part, close_source=False)
            part.position = offset
            part.fetch = self._new_fetch(tp, part.source, offset)

    def _new_fetch(
        self, tp: TopicPartition, source: PartitionSource, offset: int
    ) -> PartitionFetch:
        cfg = self.config
        return PartitionFetch(
            tp,
            source,
            offset,
            fetch_records_max=cfg.fetch_records_max,
            buffered_records_max=cfg.buffered_records_max,
            fetch_wait_s=cfg.fetch_wait_ms / 1000,
            wake=self._wake.set,
        )

    async def _recover_fetches(self) -> None:
        """Partitions whose fetch stopped: OUT_OF_RANGE resets (auto_offset_reset) once
        the records before it were returned; anything else is raised."""
        for tp, part in list(self._parts.items()):
            fetch = part.fetch
            if fetch is None or fetch.error is None or fetch.buffered:
                continue
            error = fetch.error
            if isinstance(error, OutOfRangeError):
                log.warning("group %s: %s; resetting to %s", self.group, error,
                            self.config.auto_offset_reset)  # fmt: skip
                part.seek_to = self._reset_target(tp)
                await self._apply_seeks()
            elif isinstance(error, NotFoundError):
                raise NotFoundError(f"{tp[0]}/{tp[1]}: {error}") from error
            else:
                raise error


async def _call(listener: Listener, tps: list[TopicPartition]) -> None:
    result = listener(tps)
    if inspect.isawaitable(result):
        await result
