"""aiohttp plumbing shared by the write and read proxies.

* :func:`error_middleware` turns every failure into the one error body
  ``{code, name, message}`` (plus ``owner`` for OWNER_MOVED, which also gets a
  ``Location`` header) with the code's status (:mod:`httpapi.status`); unexpected exceptions are
  logged with their stack and answered 500, never swallowed;
* :func:`respond` encodes an answer in the media type the client accepts;
* :func:`read_body` decodes a request body (msgpack or JSON);
* ``/openapi.json`` and ``/metrics`` handlers;
* :func:`proxy_app` (the middlewares and routes every proxy has), :func:`start_site`
  (listen, learn the URL, log every answer: :class:`AccessLog`) and
  :func:`cancel_task` (stop a background loop).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Final

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger
from aiohttp.typedefs import Middleware
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest

from foundation import tls
from foundation.errors import (
    BadRequestError,
    BooklineError,
    OwnerMovedError,
    TooLargeError,
    UnknownError,
)
from httpapi import auth, strict, wire
from httpapi.monitoring import PublicMetrics
from httpapi.status import http_status

if TYPE_CHECKING:
    from httpapi.proxy_config import ProxyConfig

log = logging.getLogger(__name__)
# The access log: one line per answer (AccessLog).
ACCESS_LOG: Final = logging.getLogger("bookline.access")

__all__ = [
    "ACCESS_LOG",
    "AccessLog",
    "cancel_task",
    "count_middleware",
    "error_middleware",
    "metrics_handler",
    "openapi_handler",
    "proxy_app",
    "read_body",
    "respond",
    "start_site",
]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

# aiohttp's own default bound on a request body.
_CLIENT_BODY_BYTES_MAX_DEFAULT: Final = 1024 * 1024
# Answers bigger than this are a bug in a handler (reads are bounded by their limit).
_ANSWER_BYTES_SOFT_MAX: Final = 64 * 1024 * 1024
# How long a request's body may take to arrive: the app's setting (start_site puts
# the proxy's body_timeout_s there), else this.
BODY_TIMEOUT_S: Final = web.AppKey("body_timeout_s", float)
BODY_TIMEOUT_S_DEFAULT: Final = 30.0
# On stop, requests in flight get this long to be answered before their handlers are
# cancelled (aiohttp's default is 60 s; process managers SIGKILL after ~10 s). The write
# proxy answers its in-flight writes at once when it stops.
SHUTDOWN_ANSWER_S: Final = 2.0


def respond(request: web.Request, obj: dict[str, Any], status: int = 200) -> web.Response:
    media = wire.negotiate(request.headers.get("Accept"))
    body = wire.encode_body(obj, media)
    if len(body) > _ANSWER_BYTES_SOFT_MAX:
        log.warning("answer of %d bytes to %s", len(body), request.path)
    return web.Response(body=body, status=status, content_type=media)


def error_response(request: web.Request, exc: BooklineError) -> web.Response:
    exc.message = strict.scrub_message(exc.message)  # no znode or file paths to clients
    media = wire.negotiate(request.headers.get("Accept"))
    status = http_status(exc)
    resp = web.Response(body=wire.encode_error(exc, media), status=status, content_type=media)
    if isinstance(exc, OwnerMovedError) and exc.owner:
        resp.headers["Location"] = exc.owner.rstrip("/") + request.path_qs
    if status == 429:
        resp.headers["Retry-After"] = "1"
    if status == 401:  # RFC 6750: say which scheme would do (httpapi.auth)
        resp.headers["WWW-Authenticate"] = 'Bearer realm="bookline"'
    return resp


async def read_body(request: web.Request) -> dict[str, Any]:
    """The request's body as an object: 415 for a media type we do not read, 400 for
    fields the route does not know (:mod:`httpapi.strict`)."""
    content_type = request.headers.get("Content-Type")
    timeout_s = request.app.get(BODY_TIMEOUT_S, BODY_TIMEOUT_S_DEFAULT)
    try:
        async with asyncio.timeout(timeout_s):
            raw = await request.read()
    except web.HTTPRequestEntityTooLarge as exc:
        raise TooLargeError(
            f"request body over the limit of {request.app._client_max_size} bytes"
        ) from exc
    except TimeoutError as exc:  # a body trickled in holds its admission: cut it short
        strict.count_closed(request.app, "body_timeout")
        raise BadRequestError(f"request body not received within {timeout_s:g} s") from exc
    if raw:
        strict.check_media_type(content_type)
    body = wire.decode_body(raw, content_type)
    route = request.match_info.route.resource
    if route is not None:
        strict.check_fields(request.method, route.canonical, body)
    return body


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    try:
        return await handler(request)
    except BooklineError as exc:
        if http_status(exc) >= 500:
            log.warning("%s %s -> %s", request.method, request.path, exc)
        return error_response(request, exc)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise  # a real redirect or success raised by aiohttp itself
        resp = error_response(request, strict.http_error(exc))
        if "Allow" in exc.headers:  # 405: the methods the path serves
            resp.headers["Allow"] = exc.headers["Allow"]
        return resp
    except Exception as exc:
        log.exception("%s %s failed unexpectedly", request.method, request.path)
        return error_response(request, UnknownError(f"internal error: {type(exc).__name__}"))


def metrics_handler(registry: CollectorRegistry) -> Handler:
    """``/metrics``; families labelled by tenants' names only for a token that may see
    them (:func:`httpapi.auth.sees_detail`; all of them with auth off)."""
    public = PublicMetrics(registry)

    async def handler(request: web.Request) -> web.Response:
        shown = registry if auth.sees_detail(request) else public
        resp = web.Response(body=generate_latest(shown))
        resp.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return resp

    return handler


def openapi_handler() -> Handler:
    from httpapi.openapi import build_document

    body = json.dumps(build_document(), indent=2).encode()

    async def handler(request: web.Request) -> web.Response:
        return web.Response(body=body, content_type="application/json")

    return handler


def count_middleware(
    requests: Counter, on_status: Callable[[int], None] | None = None
) -> Middleware:
    """Counts every answer in ``requests`` by route and status (outside the error
    middleware, so errors count with their status); ``on_status`` sees each status."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        resp = await handler(request)
        route = request.match_info.route.resource
        endpoint = route.canonical if route is not None else "unmatched"
        requests.labels(endpoint, str(resp.status)).inc()
        if on_status is not None:
            on_status(resp.status)
        return resp

    return middleware


def proxy_app(
    *,
    health: Handler,
    registry: CollectorRegistry,
    requests: Counter,
    on_status: Callable[[int], None] | None = None,
    client_max_size: int = _CLIENT_BODY_BYTES_MAX_DEFAULT,
    middlewares: Sequence[Middleware] = (),
    connections_closed: Counter | None = None,
) -> web.Application:
    """An application with what every proxy serves: request counting, the one error
    body, ``/health``, ``/metrics`` and ``/openapi.json``. The caller adds its API, and
    may add ``middlewares`` that run inside those two, next to the handlers;
    ``connections_closed`` (labels :data:`httpapi.strict.CONNECTION_LIMITS`) counts
    the connections its limits close."""
    app = web.Application(
        middlewares=[count_middleware(requests, on_status), error_middleware, *middlewares],
        client_max_size=client_max_size,
    )
    if connections_closed is not None:
        app[strict.CONNECTIONS_CLOSED] = connections_closed
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics_handler(registry))
    app.router.add_get("/openapi.json", openapi_handler())
    return app


class AccessLog(AbstractAccessLogger):
    """One line per answer on the logger ``bookline.access``: ``remote method path
    status duration_ms bytes`` (JSON log lines carry each as a field). Silence it with
    ``BOOKLINE_ACCESS_LOG=off`` (:mod:`foundation.logs`); with the logger off, aiohttp
    does not even call it."""

    def log(self, request: web.BaseRequest, response: web.StreamResponse, time: float) -> None:
        duration_ms = round(time * 1000, 3)
        sent = response.body_length
        self.logger.info(
            "%s %s %s %d %.1fms %dB",
            request.remote or "-",
            request.method,
            request.path,
            response.status,
            duration_ms,
            sent,
            extra={
                "remote": request.remote or "-",
                "method": request.method,
                "path": request.path,
                "status": response.status,
                "duration_ms": duration_ms,
                "bytes": sent,
            },
        )

    @property
    def enabled(self) -> bool:
        return self.logger.isEnabledFor(logging.INFO)


async def start_site(app: web.Application, config: ProxyConfig) -> tuple[web.AppRunner, str]:
    """Serve ``app`` on the configured host and port; returns the runner (clean it up to
    stop) and the URL clients use (with the port picked when ``port`` is 0). Every
    answer is logged by :class:`AccessLog`."""
    app[BODY_TIMEOUT_S] = config.body_timeout_s
    runner = strict.StrictAppRunner(
        app,
        connections_max=config.connections_max,
        idle_timeout_s=config.idle_timeout_s,
        vetting=config.auth_enabled,  # strangers' budget and deadline (httpapi.strict)
        strangers_max=config.unauthenticated_connections_max,
        stranger_timeout_s=config.unauthenticated_timeout_s,
        access_log=ACCESS_LOG,
        access_log_class=AccessLog,
        shutdown_timeout=SHUTDOWN_ANSWER_S,
    )
    await runner.setup()
    try:
        site = web.TCPSite(
            runner,
            config.host,
            config.port,
            reuse_address=True,
            ssl_context=tls.server_context(),  # https/wss when the process's [tls] says so
        )
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    if config.port == 0 and not config.advertise_url:
        port = int(runner.addresses[0][1])
        return runner, f"{tls.scheme()}://{config.host}:{port}"
    return runner, config.url


async def cancel_task(task: asyncio.Task[None] | None) -> None:
    """Cancel a background loop and wait until it has ended."""
    if task is None:
        return
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
