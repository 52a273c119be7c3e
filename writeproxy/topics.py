"""The write proxy's topic routes (bodies and answers: :mod:`httpapi.topics`).

Admin (create, list, describe, grow, delete) runs on
:class:`~serving.write.topics.TopicHosting` (the core library's
:class:`~groups.topics.TopicAdmin` with the proxy's namespace and streams). A write to
partition ``p`` of topic ``t`` is a write to the stream ``t~p``, served exactly like a
stream write (ownership per partition stream, redirects to its owner, idempotent
producer sequences, offsets in the answer), once the hosting has checked the partition
exists. A route parses, checks permissions and encodes.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Protocol

from aiohttp import web

from foundation.names import validate_name
from httpapi import topics as topic_wire
from httpapi import wire
from httpapi.auth import require
from httpapi.server import read_body, respond
from metadata.topic_configs import effective
from metadata.topics import TopicRecord
from serving.write.topics import TopicHost, TopicHosting

if TYPE_CHECKING:
    from groups.topics import TopicAdmin

__all__ = ["TopicRouteHost", "register_topic_routes"]


class TopicRouteHost(TopicHost, Protocol):
    """What the routes need of the write proxy: the hosting's needs, and stream writes."""

    async def write_stream(self, request: web.Request, name: str) -> web.Response: ...


def register_topic_routes(app: web.Application, proxy: TopicRouteHost) -> None:
    routes = _TopicRoutes(proxy)
    p = f"{wire.API_PREFIX}/topics"
    app.router.add_get(p, routes.list_topics)
    app.router.add_post(p, routes.create)
    app.router.add_get(f"{p}/{{topic}}", routes.describe)
    app.router.add_patch(f"{p}/{{topic}}", routes.alter)
    app.router.add_patch(f"{p}/{{topic}}/configs", routes.alter_configs)
    app.router.add_delete(f"{p}/{{topic}}", routes.delete)
    app.router.add_get(f"{p}/{{topic}}/partitions", routes.partitions)
    app.router.add_post(f"{p}/{{topic}}/partitions/{{partition}}/records", routes.write)


def _view(admin: TopicAdmin, record: TopicRecord) -> dict[str, object]:
    """The topic answer: its record and every config's effective value and source."""
    return topic_wire.record_view(record, effective(record.configs, admin.defaults()))


def _topic(request: web.Request) -> str:
    return validate_name(request.match_info["topic"], "topic")


class _TopicRoutes:
    def __init__(self, proxy: TopicRouteHost) -> None:
        self._proxy = proxy
        self._topics = TopicHosting(proxy)

    def _admin(self) -> TopicAdmin:
        return self._topics.admin()  # 503 UNAVAILABLE while starting or stopping

    async def list_topics(self, request: web.Request) -> web.Response:
        return respond(request, {"topics": await self._admin().list_topics()})

    async def create(self, request: web.Request) -> web.Response:
        req = topic_wire.parse_create(await read_body(request))
        require(request, "admin", "topic", req.name)
        admin = self._admin()
        record = await admin.create_topic(
            req.name, req.partitions, req.options, configs=req.configs
        )
        return respond(request, _view(admin, record), status=201)

    async def describe(self, request: web.Request) -> web.Response:
        admin = self._admin()
        return respond(request, _view(admin, await admin.get_topic(_topic(request))))

    async def partitions(self, request: web.Request) -> web.Response:
        name = _topic(request)
        parts = []
        for p in await self._topics.partitions(name):
            view = dataclasses.asdict(p.info)
            view["owner"] = p.owner
            parts.append(view)
        return respond(request, {"name": name, "partitions": parts})

    async def alter(self, request: web.Request) -> web.Response:
        name = _topic(request)
        partitions = topic_wire.parse_alter(await read_body(request))
        admin = self._admin()
        return respond(request, _view(admin, await admin.alter_partitions(name, partitions)))

    async def alter_configs(self, request: web.Request) -> web.Response:
        name = _topic(request)
        configs, deletes = topic_wire.parse_alter_configs(await read_body(request))
        admin = self._admin()
        record = await admin.alter_configs(name, configs, deletes)
        return respond(request, _view(admin, record))

    async def delete(self, request: web.Request) -> web.Response:
        name = _topic(request)
        await self._topics.delete(name)
        return respond(request, {"deleted": name})

    async def write(self, request: web.Request) -> web.Response:
        name = _topic(request)
        p = topic_wire.parse_partition(request.match_info["partition"])
        stream = await self._topics.partition_for_write(name, p)
        return await self._proxy.write_stream(request, stream)
