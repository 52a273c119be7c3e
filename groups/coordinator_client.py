"""The thin client's side of the group coordinator protocol (:class:`CoordinatorClient`).

One call per coordinator route (``docs/topics-design.md``, bodies in :mod:`groups.wire`).
Requests for group ``g`` are routed like requests for the stream ``g~group`` (the
coordinator is that stream's owner): to the owner the client learned, else to the write
proxy rendezvous hashing picks; ``307 OWNER_MOVED`` is followed at once and connection
failures, timeouts and 503s are retried with backoff (:class:`thinclient.transport.
Transport`) -- so a coordinator failover costs a member retries, not errors.

``STALE_GENERATION`` is never retried here: it means "join again", which is the
membership's decision (:mod:`groups.membership`). Likewise NOT_ASSIGNED, OUT_OF_RANGE,
GROUP_NOT_EMPTY and BAD_REQUEST come back as the errors they are.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from foundation.errors import BadRequestError, BooklineError, StaleGenerationError
from foundation.names import group_stream, validate_name
from groups import wire
from groups.assignors import TopicPartition
from groups.state import DEFAULT_ASSIGNOR
from httpapi import wire as http_wire

if TYPE_CHECKING:
    from thinclient.client import ProxyClient
    from thinclient.transport import Transport

__all__ = ["CoordinatorClient", "HeartbeatAnswer", "JoinAnswer", "group_path"]


def group_path(group: str, suffix: str = "") -> str:
    return f"{http_wire.API_PREFIX}/groups/{quote(validate_name(group, 'group'), safe='')}{suffix}"


@dataclass(frozen=True, slots=True)
class JoinAnswer:
    member_id: str
    generation: int
    assignment: frozenset[TopicPartition]  # the partitions to consume now
    heartbeat_interval_ms: int


@dataclass(frozen=True, slots=True)
class HeartbeatAnswer:
    generation: int
    assignment: frozenset[TopicPartition]  # the partitions to consume now


class CoordinatorClient:
    """``CoordinatorClient(transport)`` or ``CoordinatorClient.of(proxy_client)``.

    Every call may raise the Bookline error the coordinator answered; retriable ones
    (coordinator moving, proxy down) are retried until ``retry_deadline_ms`` (the
    client's ``retry_deadline_ms`` when None) -- a member heartbeating passes a deadline
    within its session timeout."""

    def __init__(self, transport: Transport) -> None:
        self._transport = transport

    @classmethod
    def of(cls, client: ProxyClient) -> CoordinatorClient:
        """Share a started :class:`ProxyClient`'s connections, proxies and owners."""
        return cls(client.transport)

    # -- membership ----------------------------------------------------------------------

    async def join(
        self,
        group: str,
        topics: Sequence[str],
        *,
        member_id: str | None = None,
        instance_id: str | None = None,
        assignor: str = DEFAULT_ASSIGNOR,
        session_timeout_ms: int = wire.DEFAULT_SESSION_TIMEOUT_MS,
        owned: Iterable[TopicPartition] = (),
        retry_deadline_ms: int | None = None,
    ) -> JoinAnswer:
        """Join (or re-join with ``member_id`` after STALE_GENERATION, keeping the id)."""
        req = wire.JoinRequest(
            topics=tuple(topics),
            member_id=member_id,
            instance_id=instance_id,
            assignor=assignor,
            session_timeout_ms=session_timeout_ms,
            owned=frozenset(owned),
        )
        obj = await self._call("POST", group, "/join", req.to_wire(), retry_deadline_ms)
        return JoinAnswer(
            member_id=_str(obj, "member_id"),
            generation=_int(obj, "generation"),
            assignment=wire.tps_from_wire(obj.get("assignment"), "assignment"),
            heartbeat_interval_ms=_int(obj, "heartbeat_interval_ms"),
        )

    async def heartbeat(
        self,
        group: str,
        member_id: str,
        generation: int,
        owned: Iterable[TopicPartition],
        *,
        retry_deadline_ms: int | None = None,
    ) -> HeartbeatAnswer:
        """Report what the member consumes now (``owned``: partitions it gave up are no
        longer in it); learn what to consume. STALE_GENERATION -> join again."""
        req = wire.HeartbeatRequest(member_id, generation, frozenset(owned))
        obj = await self._call("POST", group, "/heartbeat", req.to_wire(), retry_deadline_ms)
        return HeartbeatAnswer(
            generation=_int(obj, "generation"),
            assignment=wire.tps_from_wire(obj.get("assignment"), "assignment"),
        )

    async def commit(
        self,
        group: str,
        member_id: str,
        generation: int,
        offsets: Mapping[TopicPartition, int],
        *,
        retry_deadline_ms: int | None = None,
    ) -> None:
        """Commit the offsets (the next offset to consume, per partition); returns once
        durable in the group's log. A retry after an unknown outcome commits the same
        offsets again, which is harmless."""
        req = wire.CommitRequest(member_id, generation, dict(offsets))
        await self._call("POST", group, "/commit", req.to_wire(), retry_deadline_ms)

    async def leave(
        self, group: str, member_id: str, *, retry_deadline_ms: int | None = None
    ) -> None:
        await self._call("POST", group, "/leave", {"member_id": member_id}, retry_deadline_ms)

    # -- inspection and administration ---------------------------------------------------

    async def describe(self, group: str) -> dict[str, Any]:
        """Members, generation, assignor, and per partition the committed offset, the
        end offset and the lag (the ``GET /v1/groups/{g}`` answer as is)."""
        return await self._call("GET", group, "", None, None)

    async def offsets(self, group: str) -> dict[TopicPartition, int]:
        """The committed offsets (not generation-checked: any member or tool may ask)."""
        obj = await self._call("GET", group, "/offsets", None, None)
        return wire.offsets_from_wire(obj.get("offsets"), "offsets")

    async def reset_offsets(
        self,
        group: str,
        to: str,
        value: int | None = None,
        topics: Sequence[str] | None = None,
    ) -> dict[TopicPartition, int]:
        """Reset committed offsets to ``earliest``, ``latest``, ``offset`` (``value``) or
        ``datetime`` (``value`` = ms since the epoch); GROUP_NOT_EMPTY while the group
        has live members. Returns the new offsets."""
        return (await self.plan_reset(group, to, value, topics, dry_run=False)).offsets

    async def plan_reset(
        self,
        group: str,
        to: str,
        value: int | None = None,
        topics: Sequence[str] | None = None,
        *,
        dry_run: bool,
    ) -> wire.ResetPlan:
        """The reset's plan: where each partition goes and which were clamped to their
        end; applied unless ``dry_run`` (Kafka's tool shows the plan by default)."""
        if to not in wire.RESET_TARGETS:
            raise BadRequestError(f"reset to one of {', '.join(wire.RESET_TARGETS)}, not {to!r}")
        req = wire.ResetRequest(to, value, None if topics is None else tuple(topics), dry_run)
        obj = await self._call("POST", group, "/reset-offsets", req.to_wire(), None)
        return wire.reset_plan_from_wire(obj)

    async def delete(self, group: str) -> None:
        """Delete the group and its offsets; GROUP_NOT_EMPTY while members live."""
        await self._call("DELETE", group, "", None, None)
        self._transport.directory.forget_owner(group_stream(group))

    async def list_groups(self) -> list[str]:
        obj = await self._transport.call("GET", f"{http_wire.API_PREFIX}/groups", None)
        groups = obj.get("groups", [])
        return [str(g) for g in groups] if isinstance(groups, list) else []

    # -- plumbing ------------------------------------------------------------------------

    async def _call(
        self,
        method: str,
        group: str,
        suffix: str,
        body: dict[str, Any] | None,
        retry_deadline_ms: int | None,
    ) -> dict[str, Any]:
        raw = None if body is None else http_wire.encode_body(body, http_wire.MSGPACK)
        return await self._transport.call(
            method,
            group_path(group, suffix),
            raw,
            stream=group_stream(group),
            give_up=_give_up(retry_deadline_ms),
            avoid_on_timeout=True,  # a hung coordinator's group moves to another proxy
        )


def _give_up(retry_deadline_ms: int | None) -> Callable[[BooklineError], bool]:
    deadline = None if retry_deadline_ms is None else time.monotonic() + retry_deadline_ms / 1000

    def give_up(error: BooklineError) -> bool:
        if isinstance(error, StaleGenerationError):
            return True  # join again: the caller's move, not a transport retry
        return deadline is not None and time.monotonic() >= deadline

    return give_up


def _int(obj: Mapping[str, Any], key: str) -> int:
    value = obj.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequestError(f"coordinator answer without an integer {key!r}: {obj!r}")
    return value


def _str(obj: Mapping[str, Any], key: str) -> str:
    value = obj.get(key)
    if not isinstance(value, str):
        raise BadRequestError(f"coordinator answer without a string {key!r}: {obj!r}")
    return value
