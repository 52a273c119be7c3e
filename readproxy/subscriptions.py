"""Core subscriptions over HTTP: a named reader's durable position in a stream.

* ``GET /v1/streams/{name}/subscriptions`` -- ``{"subscribers": [...]}``;
* ``GET /v1/streams/{name}/subscriptions/{sub}`` -- ``{"subscriber", "dlsn"}`` (null
  when it never committed);
* ``POST /v1/streams/{name}/subscriptions/{sub}`` ``{"dlsn": "s:e:s"}`` -- advance it;
  answers ``{"advanced": bool, "dlsn": the stored position}`` (a DLSN at or before the
  stored one changes nothing: positions only move forward);
* ``DELETE /v1/streams/{name}/subscriptions/{sub}`` -- forget it.

The same calls as ``Namespace.commit/committed/list_subscribers/delete_subscriber``
(docs/core-api.md): positions live in ZooKeeper, so any read proxy serves them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from aiohttp import web

from foundation.errors import BadRequestError, NotFoundError
from foundation.names import validate_name
from httpapi import wire
from httpapi.positions import format_dlsn, parse_dlsn
from httpapi.server import read_body, respond
from streams.dlsn import DLSN

if TYPE_CHECKING:
    from streams.namespace import Namespace

__all__ = ["add_routes"]


def add_routes(app: web.Application, namespace: Callable[[], Namespace]) -> None:
    base = f"{wire.API_PREFIX}/streams/{{name}}/subscriptions"

    async def listing(request: web.Request) -> web.Response:
        ns = namespace()
        name = await _stream(ns, request)
        return respond(request, {"subscribers": await ns.list_subscribers(name)})

    async def read(request: web.Request) -> web.Response:
        ns = namespace()
        name = await _stream(ns, request)
        sub = validate_name(request.match_info["sub"], "subscriber")
        return respond(request, {"subscriber": sub, "dlsn": _text(await ns.committed(name, sub))})

    async def commit(request: web.Request) -> web.Response:
        ns = namespace()
        name = await _stream(ns, request)
        sub = validate_name(request.match_info["sub"], "subscriber")
        raw = (await read_body(request)).get("dlsn")
        if not isinstance(raw, str):
            raise BadRequestError('a commit needs {"dlsn": "segment:entry:slot"}')
        advanced = await ns.commit(name, sub, DLSN(*parse_dlsn(raw)))
        stored = await ns.committed(name, sub)
        return respond(request, {"advanced": advanced, "dlsn": _text(stored)})

    async def delete(request: web.Request) -> web.Response:
        ns = namespace()
        name = await _stream(ns, request)
        await ns.delete_subscriber(name, validate_name(request.match_info["sub"], "subscriber"))
        return respond(request, {})

    app.router.add_get(base, listing)
    app.router.add_get(f"{base}/{{sub}}", read)
    app.router.add_post(f"{base}/{{sub}}", commit)
    app.router.add_delete(f"{base}/{{sub}}", delete)


async def _stream(ns: Namespace, request: web.Request) -> str:
    name = validate_name(request.match_info["name"], "stream name")
    if not await ns.exists(name):
        raise NotFoundError(f"stream {name} does not exist")
    return name


def _text(dlsn: DLSN | None) -> str | None:
    return None if dlsn is None else format_dlsn(dlsn)
