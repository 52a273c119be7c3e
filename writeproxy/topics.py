"""The write proxy's topic routes (bodies and answers: :mod:`httpapi.topics`).

Admin (create, list, describe, grow, delete) runs on the core library's
:class:`~groups.topics.TopicAdmin` with the proxy's namespace. A write to partition
``p`` of topic ``t`` is a write to the stream ``t~p``, served exactly like a stream
write (ownership per partition stream, redirects to its owner, idempotent producer
sequences, offsets in the answer). Before a partition stream is acquired, the topic is
checked: NOT_FOUND without the topic, UNKNOWN_PARTITION for ``p >=`` its partition
count -- nothing is written, and no stream is created for it.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Protocol

from aiohttp import web

from foundation.errors import UnknownPartitionError
from foundation.names import partition_stream, validate_name
from groups.topics import TopicAdmin
from httpapi import topics as topic_wire
from httpapi import wire
from httpapi.auth import require
from httpapi.server import read_body, respond
from metadata.topics import TopicRecord

if TYPE_CHECKING:
    from serving.write.ownership import Ownership
    from streams.namespace import Namespace

log = logging.getLogger(__name__)

__all__ = ["register_topic_routes"]


class TopicHost(Protocol):
    """What the routes need of the write proxy."""

    @property
    def ns(self) -> Namespace: ...

    @property
    def ownership(self) -> Ownership: ...

    async def write_stream(self, request: web.Request, name: str) -> web.Response: ...


def register_topic_routes(app: web.Application, proxy: TopicHost) -> None:
    routes = _TopicRoutes(proxy)
    p = f"{wire.API_PREFIX}/topics"
    app.router.add_get(p, routes.list_topics)
    app.router.add_post(p, routes.create)
    app.router.add_get(f"{p}/{{topic}}", routes.describe)
    app.router.add_patch(f"{p}/{{topic}}", routes.alter)
    app.router.add_delete(f"{p}/{{topic}}", routes.delete)
    app.router.add_get(f"{p}/{{topic}}/partitions", routes.partitions)
    app.router.add_post(f"{p}/{{topic}}/partitions/{{partition}}/records", routes.write)


def _view(record: TopicRecord) -> dict[str, object]:
    options = dataclasses.asdict(record.options)
    return topic_wire.topic_view(record.topic, record.partitions, options, record.ctime_ms)


def _topic(request: web.Request) -> str:
    return validate_name(request.match_info["topic"], "topic")


class _TopicRoutes:
    def __init__(self, proxy: TopicHost) -> None:
        self._proxy = proxy

    def _admin(self) -> TopicAdmin:
        return TopicAdmin(self._proxy.ns)  # 503 UNAVAILABLE while starting or stopping

    async def list_topics(self, request: web.Request) -> web.Response:
        return respond(request, {"topics": await self._admin().list_topics()})

    async def create(self, request: web.Request) -> web.Response:
        req = topic_wire.parse_create(await read_body(request))
        require(request, "admin", "topic", req.name)
        record = await self._admin().create_topic(req.name, req.partitions, req.options)
        return respond(request, _view(record), status=201)

    async def describe(self, request: web.Request) -> web.Response:
        return respond(request, _view(await self._admin().get_topic(_topic(request))))

    async def partitions(self, request: web.Request) -> web.Response:
        info = await self._admin().describe_topic(_topic(request))
        ownership = self._proxy.ownership
        parts = []
        for p in info.partitions:
            view = dataclasses.asdict(p)
            view["owner"] = await ownership.owner_of(p.stream)
            parts.append(view)
        return respond(request, {"name": info.name, "partitions": parts})

    async def alter(self, request: web.Request) -> web.Response:
        name = _topic(request)
        partitions = topic_wire.parse_alter(await read_body(request))
        return respond(request, _view(await self._admin().alter_partitions(name, partitions)))

    async def delete(self, request: web.Request) -> web.Response:
        """The record first (writers of it then get NOT_FOUND), then its partition
        streams. Partitions this proxy owns are released first; a partition another
        proxy owns loses its writer lock with the stream, and that proxy drops it."""
        name = _topic(request)
        admin = self._admin()
        ownership = self._proxy.ownership
        record = await admin.get_topic(name)
        for stream in record.partition_names():
            await ownership.drop(stream)
        await admin.delete_topic(name)
        return respond(request, {"deleted": name})

    async def write(self, request: web.Request) -> web.Response:
        name = _topic(request)
        p = topic_wire.parse_partition(request.match_info["partition"])
        stream = partition_stream(name, p)
        if stream not in self._proxy.ownership.owned:
            # About to acquire it: the partition must exist (never auto-created).
            count = await self._admin().partitions(name)  # NOT_FOUND without the topic
            if p >= count:
                raise UnknownPartitionError(
                    f"topic {name} has {count} partitions; there is no partition {p}"
                )
        return await self._proxy.write_stream(request, stream)
