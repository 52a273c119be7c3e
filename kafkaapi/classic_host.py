"""The classic groups a write proxy coordinates (:class:`ClassicGroups`): the thin
asyncio driver around :class:`~kafkaapi.classic_group.ClassicGroup`.

A classic group lives where the group's Bookline coordinator lives (the owner of its
log stream ``g~group``, which FindCoordinator names): every request first asks the
write core's :class:`~serving.write.groups.GroupHosting` for the group's coordinator
(NOT_COORDINATOR when another proxy owns the stream). The classic state itself
(members, generation, the leader's assignment) is held in memory beside it, as Kafka
holds it in its coordinator's cache, but it is not logged: when the coordinator
changes (the proxy died, or its stream was taken over), the new one starts Empty, the
members' heartbeats get UNKNOWN_MEMBER_ID and they join again (a static member with
its instance id, as a new member). Committed offsets are the Bookline group's, in its
log, and survive. A state held for a coordinator object that is no longer the hosted
one is abandoned: its waiting requests get NOT_COORDINATOR.

Each waiting JoinGroup or SyncGroup is an :class:`asyncio.Future` under the ticket it
gave the state machine; a timer task per group wakes at the state's next deadline
(sessions, the join barrier, the sync phase) and ticks it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Final

from kafkaapi.classic_group import (
    EMPTY,
    ClassicConfig,
    ClassicGroup,
    JoinAnswer,
    JoinArgs,
    Refused,
    SyncAnswer,
    SyncArgs,
)
from kafkaapi.consumer_protocol import decode_assignment, decode_subscription

if TYPE_CHECKING:
    from groups.coordinator import GroupCoordinator

__all__ = ["ClassicGroups", "Driver"]

log = logging.getLogger(__name__)

# The timer wakes at least this often (a deadline moved earlier wakes it at once).
_TICK_MAX_MS: Final = 1_000


def _monotonic_ms() -> int:
    return int(asyncio.get_running_loop().time() * 1000)


class Driver:
    """One classic group on this proxy: its state, waiting requests and timer."""

    def __init__(
        self,
        group: str,
        coord: GroupCoordinator,
        config: ClassicConfig,
        clock_ms: Callable[[], int],
        on_idle: Callable[[Driver], None],
    ) -> None:
        self.coord = coord
        self._on_idle = on_idle
        self.state = ClassicGroup(group, config)
        self._clock = clock_ms
        self._tickets = itertools.count(1)
        self._waits: dict[int, tuple[bool, asyncio.Future[JoinAnswer | SyncAnswer]]] = {}
        self._wake = asyncio.Event()
        self._logged = (0, EMPTY)  # the last (generation, state) logged
        self._timer = asyncio.get_running_loop().create_task(
            self._ticks(), name=f"classic-group-{group}"
        )

    @property
    def live(self) -> bool:
        """Whether the group has members or ids handed out (a Kafka group is in use)."""
        return bool(self.state.members or self.state.pending)

    async def join(self, args: JoinArgs) -> JoinAnswer:
        answer = await self._wait(True, lambda now, ticket: self.state.join(now, ticket, args))
        assert isinstance(answer, JoinAnswer)
        return answer

    async def sync(self, args: SyncArgs) -> SyncAnswer:
        answer = await self._wait(False, lambda now, ticket: self.state.sync(now, ticket, args))
        assert isinstance(answer, SyncAnswer)
        return answer

    def heartbeat(self, member_id: str, instance_id: str | None, generation: int) -> str:
        return self._now(lambda now: self.state.heartbeat(now, member_id, instance_id, generation))

    def leave(self, member_id: str, instance_id: str | None) -> str:
        return self._now(lambda now: self.state.leave(now, member_id, instance_id))

    def check_commit(self, member_id: str, instance_id: str | None, generation: int) -> str:
        return self.state.check_commit(member_id, instance_id, generation)

    async def close(self, error: str) -> None:
        """Stop serving: waiting requests get ``error``; the timer ends."""
        self.state.abandon(error)
        self._deliver()
        self._timer.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._timer

    # -- internals -----------------------------------------------------------------------

    async def _wait(
        self, is_join: bool, call: Callable[[int, int], None]
    ) -> JoinAnswer | SyncAnswer:
        ticket = next(self._tickets)
        fut: asyncio.Future[JoinAnswer | SyncAnswer] = asyncio.get_running_loop().create_future()
        self._waits[ticket] = (is_join, fut)
        try:
            call(self._clock(), ticket)
            self._deliver()
            return await fut
        finally:
            self._waits.pop(ticket, None)

    def _now(self, call: Callable[[int], str]) -> str:
        error = call(self._clock())
        self._deliver()
        return error

    def _deliver(self) -> None:
        """Hand the state's answers to the requests waiting for them."""
        s = self.state
        if (s.generation, s.state) != self._logged:
            self._logged = (s.generation, s.state)
            log.info(
                "classic group %s: %s, generation %d (%s), leader %s, %d members",
                *(s.group, s.state, s.generation, s.protocol, s.leader, len(s.members)),
            )
        outbox, self.state.outbox = self.state.outbox, []
        for ticket, answer in outbox:
            is_join, fut = self._waits.get(ticket, (False, None))
            if fut is None or fut.done():
                continue  # its connection went away meanwhile
            if isinstance(answer, Refused):
                fut.set_result(
                    JoinAnswer(answer.error, answer.member_id)
                    if is_join
                    else SyncAnswer(answer.error)
                )
            else:
                fut.set_result(answer)
        self._wake.set()  # a deadline may have moved earlier

    async def _ticks(self) -> None:
        while not self.idle:
            due = self.state.next_deadline_ms()
            wait_ms = _TICK_MAX_MS if due is None else min(_TICK_MAX_MS, due - self._clock())
            self._wake.clear()
            if wait_ms > 0:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), wait_ms / 1000)
            self.state.tick(self._clock())
            self._deliver()
        self._on_idle(self)  # Empty and unused: forgotten (memory bounded by groups in use)

    @property
    def idle(self) -> bool:
        return self.state.state == EMPTY and not self.live and not self._waits


class ClassicGroups:
    """The classic groups this proxy coordinates, by group name."""

    def __init__(
        self, config: ClassicConfig | None = None, clock_ms: Callable[[], int] = _monotonic_ms
    ) -> None:
        self.config = config or ClassicConfig()
        self._clock = clock_ms
        self._drivers: dict[str, Driver] = {}
        self._closing: set[asyncio.Task[None]] = set()

    def current(self, group: str, coord: GroupCoordinator) -> Driver:
        """The group's driver for its coordinator ``coord`` (the hosting's current one),
        replacing one held for a coordinator no longer hosted (module docstring)."""
        driver = self._drivers.get(group)
        if driver is not None and (driver.coord is not coord or driver.idle):
            self._retire(group, driver)
            driver = None
        if driver is None:
            driver = Driver(group, coord, self.config, self._clock, self._forget)
            self._drivers[group] = driver
        return driver

    def held(self, group: str, coord: GroupCoordinator | None = None) -> Driver | None:
        """The group's driver if it is held (for ``coord``, when given), else None."""
        driver = self._drivers.get(group)
        if driver is None or (coord is not None and driver.coord is not coord):
            return None
        return driver

    def live(self, group: str) -> bool:
        """Whether Kafka classic members use ``group`` here now (the write core asks this
        before letting a Bookline member join, or resetting or deleting the group)."""
        driver = self._drivers.get(group)
        return driver is not None and driver.coord.usable and driver.live

    def view(self, group: str) -> dict[str, Any] | None:
        """The group as ``bookline group describe`` shows it while classic members use
        it (their state, generation, assignor and members with the partitions their
        leader gave them), else None: the write core shows its own members then."""
        if not self.live(group):
            return None
        g = self._drivers[group].state
        members = []
        for m in g.members.values():
            assigned = decode_assignment(m.assignment) if m.assignment else []
            members.append(
                {
                    "member_id": m.member_id,
                    "instance_id": m.instance_id,
                    "client_id": m.client_id,
                    "client_host": m.client_host,
                    "topics": sorted(decode_subscription(m.metadata(g.protocol)) or []),
                    "session_timeout_ms": m.session_timeout_ms,
                    "assignment": sorted(assigned or []),
                    "consuming": sorted(assigned or []),
                    "owned": [],
                }
            )
        return {"state": g.state, "generation": g.generation, "assignor": g.protocol,
                "protocol": "kafka-classic", "members": members}  # fmt: skip

    def drop(self, group: str) -> None:
        """The group was deleted: forget it."""
        driver = self._drivers.pop(group, None)
        if driver is not None:
            driver.state.delete()
            self._retire(group, driver)

    async def close(self) -> None:
        for group, driver in list(self._drivers.items()):
            self._drivers.pop(group, None)
            await driver.close("NOT_COORDINATOR")

    def _forget(self, driver: Driver) -> None:
        if self._drivers.get(driver.state.group) is driver:
            del self._drivers[driver.state.group]

    def _retire(self, group: str, driver: Driver) -> None:
        self._drivers.pop(group, None)
        task = asyncio.get_running_loop().create_task(driver.close("NOT_COORDINATOR"))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)
