"""The write proxy's consumer group routes over the coordinators it hosts
(:class:`~serving.write.groups.GroupHosting`: the owner of stream ``g~group``
coordinates group ``g``; ``307 OWNER_MOVED`` names the owner otherwise).

Routes (bodies in :mod:`groups.wire`; errors ``{code, name, message}``)::

    POST   /v1/groups/{g}/join | heartbeat | commit | leave
    GET    /v1/groups/{g}                  describe (members, offsets, lag)
    GET    /v1/groups/{g}/offsets          committed offsets
    POST   /v1/groups/{g}/reset-offsets    GROUP_NOT_EMPTY while members live; dry_run: plan only
    DELETE /v1/groups/{g}                  GROUP_NOT_EMPTY while members live
    GET    /v1/groups                      the namespace's groups (any write proxy)

A route parses its body, checks permissions and encodes the answer; the hosting does
the rest.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from aiohttp import web

from foundation.names import validate_name
from groups import wire
from httpapi.auth import require
from httpapi.server import read_body, respond
from httpapi.wire import API_PREFIX
from serving.write.groups import GroupHost, GroupHosting

if TYPE_CHECKING:
    from groups.coordinator import CoordinatorConfig, GroupStats
    from writeproxy.metrics import WriteProxyMetrics

__all__ = ["GroupRouteHost", "GroupRoutes", "register_group_routes"]


class GroupRouteHost(GroupHost, Protocol):
    """What the routes need of their write proxy: the hosting's needs, and metrics."""

    metrics: WriteProxyMetrics


class GroupRoutes:
    """The ``/v1/groups`` routes over this proxy's :class:`GroupHosting`."""

    def __init__(self, host: GroupRouteHost, config: CoordinatorConfig | None = None) -> None:
        self.host = host
        self.hosting = GroupHosting(host, config)

    def register(self, app: web.Application) -> None:
        p = f"{API_PREFIX}/groups"
        app.router.add_get(p, self.list_groups)
        app.router.add_get(f"{p}/{{group}}", self.describe)
        app.router.add_delete(f"{p}/{{group}}", self.delete)
        app.router.add_get(f"{p}/{{group}}/offsets", self.offsets)
        app.router.add_post(f"{p}/{{group}}/join", self.join)
        app.router.add_post(f"{p}/{{group}}/heartbeat", self.heartbeat)
        app.router.add_post(f"{p}/{{group}}/commit", self.commit)
        app.router.add_post(f"{p}/{{group}}/leave", self.leave)
        app.router.add_post(f"{p}/{{group}}/reset-offsets", self.reset_offsets)
        app.on_shutdown.append(self._on_shutdown)
        self.host.metrics.bind_groups(self.hosting.stats)

    def stats(self) -> list[GroupStats]:
        """The groups this proxy coordinates now (for the status page)."""
        return self.hosting.stats()

    async def join(self, request: web.Request) -> web.Response:
        group = _group(request)
        req = wire.parse_join(await read_body(request))
        for topic in req.topics:
            require(request, "consume", "topic", topic)
        result = await self.hosting.join(group, req)
        return respond(
            request,
            {
                "member_id": result.member_id,
                "generation": result.generation,
                "assignment": wire.tps_to_wire(result.partitions),
                "heartbeat_interval_ms": wire.heartbeat_interval_ms(req.session_timeout_ms),
            },
        )

    async def heartbeat(self, request: web.Request) -> web.Response:
        group = _group(request)
        req = wire.parse_heartbeat(await read_body(request))
        generation, parts = await self.hosting.heartbeat(group, req)
        return respond(request, {"generation": generation, "assignment": wire.tps_to_wire(parts)})

    async def commit(self, request: web.Request) -> web.Response:
        group = _group(request)
        req = wire.parse_commit(await read_body(request))
        for topic in sorted({tp[0] for tp in req.offsets}):
            require(request, "consume", "topic", topic)
        await self.hosting.commit(group, req)
        return respond(request, {})

    async def leave(self, request: web.Request) -> web.Response:
        group = _group(request)
        member_id = wire.parse_leave(await read_body(request))
        await self.hosting.leave(group, member_id)
        return respond(request, {})

    async def describe(self, request: web.Request) -> web.Response:
        answer = await self.hosting.describe(_group(request))
        answer["coordinator"] = self.host.url
        return respond(request, answer)

    async def offsets(self, request: web.Request) -> web.Response:
        offsets = await self.hosting.offsets(_group(request))
        return respond(request, {"offsets": wire.offsets_to_wire(offsets)})

    async def reset_offsets(self, request: web.Request) -> web.Response:
        group = _group(request)
        req = wire.parse_reset(await read_body(request))
        for topic in req.topics or ():
            require(request, "consume", "topic", topic)
        return respond(request, (await self.hosting.reset_offsets(group, req)).to_wire())

    async def delete(self, request: web.Request) -> web.Response:
        group = _group(request)
        await self.hosting.delete(group)
        return respond(request, {"deleted": group})

    async def list_groups(self, request: web.Request) -> web.Response:
        return respond(request, {"groups": await self.hosting.list_groups()})

    async def _on_shutdown(self, app: web.Application) -> None:
        await self.hosting.close()


def register_group_routes(app: web.Application, host: GroupRouteHost) -> GroupRoutes:
    """The one line the write proxy's app needs."""
    routes = GroupRoutes(host)
    routes.register(app)
    return routes


def _group(request: web.Request) -> str:
    return validate_name(request.match_info["group"], "group")
