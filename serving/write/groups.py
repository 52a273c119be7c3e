"""The consumer group coordinators this process hosts (:class:`GroupHosting`), for
every front end.

The coordinator of group ``g`` is the owner of its log stream ``g~group``
(``docs/topics-design.md``): a request for ``g`` acquires that stream like any stream
(:class:`~serving.write.ownership.Ownership`: owner record + writer lock in this
process's ZooKeeper session), raises OWNER_MOVED when another process owns it, and
takes it over once the owner's session has expired. On acquisition the log is
replayed into a :class:`~groups.coordinator.GroupCoordinator`. The writer lock fences a
coordinator whose process lost its session: it can no longer append, so it can no
longer answer a change; while the session is suspended it answers nothing
(SESSION_SUSPENDED), so a partitioned process does not keep members believing they
hold partitions.

No HTTP: the operations take the parsed requests of :mod:`groups.wire` and return
results; a front end checks permissions first and encodes the answers
(``writeproxy/groups.py``: ``/v1/groups``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from foundation.errors import (
    BooklineError,
    GroupNotEmptyError,
    NotFoundError,
    OwnerMovedError,
    OwnershipLostError,
    SessionSuspendedError,
    UnavailableError,
)
from foundation.names import group_stream, parse_internal
from groups import wire
from groups.coordinator import CoordinatorConfig, GroupCoordinator, GroupStats, check_join
from groups.coordinator_store import CoreTopics, ensure_group_log
from groups.partition_offsets import PartitionOffsets, reset_plan
from metadata.zk import SessionState

if TYPE_CHECKING:
    from groups.assignors import TopicPartition
    from groups.state import JoinResult
    from serving.write.owned import OwnedStream
    from serving.write.ownership import Ownership
    from streams.namespace import Namespace

log = logging.getLogger(__name__)

__all__ = ["GroupHost", "GroupHosting"]


class GroupHost(Protocol):
    """What the coordinators need of the process hosting them."""

    url: str  # this process's identity in owner records

    @property
    def ns(self) -> Namespace: ...  # UNAVAILABLE while starting or stopping

    @property
    def ownership(self) -> Ownership: ...


@dataclass(slots=True)
class _Hosted:
    coord: GroupCoordinator
    owned: OwnedStream


class GroupHosting:
    """The coordinators this process hosts, by group."""

    def __init__(self, host: GroupHost, config: CoordinatorConfig | None = None) -> None:
        self.host = host
        self.config = config or CoordinatorConfig()
        self.hosted: dict[str, _Hosted] = {}
        self._loading: dict[str, asyncio.Future[GroupCoordinator]] = {}
        self._deleting: set[str] = set()
        self._drops: set[asyncio.Task[None]] = set()
        self._topics: CoreTopics | None = None
        # Whether members of another protocol use a group here (the Kafka listener's
        # classic groups): a Bookline member may not join it, nor may it be reset or
        # deleted meanwhile (GROUP_NOT_EMPTY).
        self.foreign_members: Callable[[str], bool] = lambda group: False
        # How those members describe the group (state, generation, assignor, members),
        # None while none use it: :meth:`describe` shows them instead of its own.
        self.foreign_view: Callable[[str], dict[str, Any] | None] = lambda group: None

    def stats(self) -> list[GroupStats]:
        """The groups this process coordinates now (for the metrics)."""
        try:
            return [h.coord.stats() for g, h in self.hosted.items() if self._current(g, h)]
        except UnavailableError:  # starting or stopping: no groups
            return []

    # -- operations --------------------------------------------------------------------

    async def join(self, group: str, req: wire.JoinRequest) -> JoinResult:
        """Join (or rejoin) ``group``, creating it on its first join."""
        self._require_no_foreign(group, "take a Bookline member")
        return await (await self.coordinator(group, create=req)).join(req)

    async def heartbeat(
        self, group: str, req: wire.HeartbeatRequest
    ) -> tuple[int, frozenset[TopicPartition]]:
        """The member's generation and assignment now."""
        return await (await self.coordinator(group)).heartbeat(req)

    async def commit(self, group: str, req: wire.CommitRequest) -> None:
        await (await self.coordinator(group)).commit(req)

    async def leave(self, group: str, member_id: str) -> None:
        await (await self.coordinator(group)).leave(member_id)

    async def describe(self, group: str) -> dict[str, Any]:
        """Members, offsets and lag (:meth:`GroupCoordinator.describe`); while another
        protocol's members use the group, its members and their partitions."""
        described = await (await self.coordinator(group)).describe()
        foreign = self.foreign_view(group)
        if foreign is None:
            return described
        holders = {tuple(tp): m["member_id"] for m in foreign["members"] for tp in m["consuming"]}
        for p in described["partitions"]:
            p["member_id"] = holders.get((p["topic"], p["partition"]), p["member_id"])
        return described | foreign

    async def set_offsets(self, group: str, offsets: Mapping[TopicPartition, int]) -> None:
        """Commit ``offsets`` from outside the membership, creating the group (Kafka's
        standalone commits; GROUP_NOT_EMPTY while members live)."""
        await (await self.coordinator(group, create=True)).set_offsets(offsets)

    async def offsets(self, group: str) -> dict[TopicPartition, int]:
        """The group's committed offsets."""
        return (await self.coordinator(group)).committed()

    async def reset_offsets(self, group: str, req: wire.ResetRequest) -> wire.ResetPlan:
        """Reset the group's offsets (GROUP_NOT_EMPTY while members live); a dry run
        only plans."""
        # Kafka lets an operator set a new group's offsets before its consumers start
        # (naming the topics: a new group knows none); its dry run creates nothing.
        create = req.topics is not None and not req.dry_run
        self._require_no_foreign(group, "reset its offsets")
        try:
            coord = await self.coordinator(group, create=create)
        except NotFoundError:
            if not (req.dry_run and req.topics):
                raise
            view = PartitionOffsets(self._topic_view(self.host.ns), lambda: 0)
            return await reset_plan(view, req.topics, req)
        return await coord.reset(req)

    async def delete(self, group: str) -> None:
        """Delete the group and its log (GROUP_NOT_EMPTY while members live)."""
        coord = await self.coordinator(group)
        self._require_no_foreign(group, "delete it")
        self._deleting.add(group)
        try:
            await coord.delete()  # GROUP_NOT_EMPTY and the like: nothing changed
            await self._discard(group)
            name = group_stream(group)
            await self.host.ownership.drop(name)
            await self.host.ns.delete_stream(name)
        finally:
            self._deleting.discard(group)
        log.info("group %s deleted", group)

    def hosted_phases(self) -> dict[str, str]:
        """The phase (empty, stable, rebalancing) of each group coordinated here now."""
        try:
            return {g: h.coord.phase() for g, h in self.hosted.items() if self._current(g, h)}
        except UnavailableError:  # starting or stopping: none
            return {}

    async def owner_of(self, group: str) -> str | None:
        """Address of the process owning the group's log (ours included), or None."""
        return await self.host.ownership.owner_of(group_stream(group))

    async def list_groups(self) -> list[str]:
        """The namespace's groups, sorted (whoever coordinates them)."""
        groups = []
        for name in await self.host.ns.list_streams():
            parsed = parse_internal(name)
            if parsed is not None and parsed[0] == "group":
                groups.append(parsed[1])
        return sorted(groups)

    async def close(self) -> None:
        """Stop every hosted coordinator (the process is stopping)."""
        for group in list(self.hosted):
            try:
                await self._discard(group)
            except BooklineError as exc:
                log.warning("group %s: closing its coordinator: %s", group, exc)

    def _require_no_foreign(self, group: str, what: str) -> None:
        if self.foreign_members(group):
            raise GroupNotEmptyError(
                f"group {group} has Kafka classic-protocol members; it cannot {what} now"
            )

    # -- hosting -----------------------------------------------------------------------

    async def coordinator(
        self, group: str, *, create: wire.JoinRequest | bool = False
    ) -> GroupCoordinator:
        """The group's coordinator here, loading it when this process may own its log;
        OWNER_MOVED when another process does, NOT_FOUND for an unknown group unless
        ``create`` (a join request is checked before its group's log is created)."""
        if group in self._deleting:
            raise OwnershipLostError(f"group {group} is being deleted; retry")
        hosted = self.hosted.get(group)
        if hosted is not None:
            if self._current(group, hosted):
                return hosted.coord
            await self._discard(group)
        pending = self._loading.get(group)
        if pending is not None:
            try:
                return await asyncio.shield(pending)
            except NotFoundError:
                # That load did not create the group (a describe, say); a join does.
                if create is False:
                    raise
                return await self.coordinator(group, create=create)
        fut: asyncio.Future[GroupCoordinator] = asyncio.get_running_loop().create_future()
        self._loading[group] = fut
        try:
            coord = await self._load(group, create)
        except BaseException as exc:
            fut.set_exception(exc)
            fut.exception()  # retrieved: concurrent waiters re-raise it themselves
            raise
        else:
            fut.set_result(coord)
            return coord
        finally:
            del self._loading[group]

    def _current(self, group: str, hosted: _Hosted) -> bool:
        owned = self.host.ownership.owned.get(group_stream(group))
        return owned is hosted.owned and owned.failed is None and hosted.coord.usable

    async def _load(self, group: str, create: wire.JoinRequest | bool) -> GroupCoordinator:
        ownership, ns = self.host.ownership, self.host.ns
        name = group_stream(group)
        owned = ownership.owned.get(name)
        if owned is not None and (owned.failed is not None or owned.writer.failed is not None):
            await ownership.drop(name)  # a failed writer: acquire again (recovers the log)
            owned = None
        if owned is None:
            owner = await ownership.owner_of(name)
            if owner is not None and owner != self.host.url:
                raise OwnerMovedError(f"group {group} is coordinated by {owner}", owner=owner)
            if not await ns.exists(name):
                if create is False:
                    raise NotFoundError(f"group {group} does not exist")
                if isinstance(create, wire.JoinRequest):
                    await check_join(create, self._topic_view(ns))
                await ensure_group_log(ns, group)
            owned = await ownership.get(name)
        md = ns.context.md
        stream = owned

        def health() -> None:
            if stream.failed is not None or stream.writer.failed is not None:
                raise OwnershipLostError(f"group {group}: its log stream was dropped; retry")
            if md.zk.state is not SessionState.CONNECTED:
                raise SessionSuspendedError(f"group {group}: ZooKeeper session not connected")

        try:
            coord = await GroupCoordinator.load(
                ns,
                group,
                owned.writer,
                self._topic_view(ns),
                config=self.config,
                health=health,
                on_fail=lambda exc: self._drop_soon(group),
            )
        except BaseException:
            # Never hold a group's log without serving it: the next request retries.
            await ownership.drop(name)
            raise
        coord.start()
        self.hosted[group] = _Hosted(coord, owned)
        log.info("coordinating group %s (generation %d)", group, coord.state.generation)
        return coord

    def _topic_view(self, ns: Namespace) -> CoreTopics:
        if self._topics is None:
            self._topics = CoreTopics(ns)
        return self._topics

    async def _discard(self, group: str) -> None:
        hosted = self.hosted.pop(group, None)
        if hosted is not None:
            await hosted.coord.close()

    def _drop_soon(self, group: str) -> None:
        """A coordinator's log write failed: stop hosting it and drop the stream, so
        the next request replays the log from scratch (here or on the next owner)."""

        async def drop() -> None:
            hosted = self.hosted.get(group)
            await self._discard(group)
            name = group_stream(group)
            try:
                ownership = self.host.ownership
            except UnavailableError:
                return  # stopping: the front end releases every stream itself
            if hosted is not None and ownership.owned.get(name) is hosted.owned:
                await ownership.drop(name)

        task = asyncio.get_running_loop().create_task(drop())
        self._drops.add(task)
        task.add_done_callback(self._drops.discard)
