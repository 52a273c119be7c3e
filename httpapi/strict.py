"""The proxies' HTTP strictness: every error in the one body, and connection limits.

aiohttp answers some errors itself, before any middleware runs: a request line or
header it cannot parse, headers over its limits, a bad ``Content-Length``. Its answer
is plain text. :class:`StrictAppRunner` serves an application with a request handler
whose :meth:`~_StrictRequestHandler.handle_error` answers those with the documented
``{code, name, message}`` body instead, and which closes a connection beyond
``connections_max`` as soon as it is accepted. Idle connections (nothing sent, or a
request's headers that never finish) are closed by aiohttp's keep-alive timer, which
starts when the connection is accepted; the runner sets it from ``idle_timeout_s``.

With auth on, a connection is a *stranger* until one of its requests presents a valid
token (the auth middleware calls :func:`mark_authenticated`). Strangers have a budget
of their own (``unauthenticated_connections_max``) and a short life
(``unauthenticated_timeout_s``): when they are over their budget, or every connection
slot is taken, the oldest stranger is closed to make room for the new connection, and a
stranger still without a valid token at its deadline is closed. So silent or slow
clients without credentials cannot hold the slots authenticated clients need: a new
client gets in by evicting the oldest stranger and keeps its connection once its first
request authenticates.

Answers to errors inside a request (unknown route, wrong method, bodies) are the error
middleware's (:mod:`httpapi.server`); :func:`http_error` maps aiohttp's own
``HTTPException`` there.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Mapping
from typing import Any, Final

from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from prometheus_client import Counter

from foundation.errors import (
    BadRequestError,
    BooklineError,
    MethodNotAllowedError,
    NotFoundError,
    TooLargeError,
    UnknownError,
    UnsupportedMediaTypeError,
)
from httpapi import wire

log = logging.getLogger(__name__)

__all__ = [
    "CONNECTIONS_CLOSED",
    "CONNECTION_LIMITS",
    "StrictAppRunner",
    "check_fields",
    "check_media_type",
    "count_closed",
    "http_error",
    "mark_authenticated",
    "parser_error_body",
    "scrub_message",
]

# A parser's message may quote what the client sent: cut it short in the answer.
MESSAGE_CHARS_MAX: Final = 200
# A flood of refused connections logs one line this often, with the count.
REFUSAL_LOG_INTERVAL_S: Final = 10.0
# Why a proxy closed a connection (the reason label of its connections_closed counter):
# one connection too many, a body that did not arrive within body_timeout_s, a stranger
# (no valid token yet) evicted to make room, a stranger at its deadline.
CONNECTION_LIMITS: Final = (
    "connections_max",
    "body_timeout",
    "unauthenticated_evicted",
    "unauthenticated_timeout",
)
# Where proxy_app keeps the proxy's connections_closed counter.
CONNECTIONS_CLOSED: Final = web.AppKey("connections_closed", Counter)


# The fields of a write body (httpapi.writes.parse_write), "_b64" forms included; each
# of its records is checked there.
WRITE_FIELDS: Final = frozenset(
    {"producer", "seq", "epoch", "crc", "payloads", "keys", "records"}
    | {"payload", "payload_b64", "key", "key_b64", "headers", "txid"}
)
# What each route that reads a body accepts at its top level. Routes not named here
# check their fields where they parse them (topics, groups: their ``_only``).
BODY_FIELDS: Final[Mapping[tuple[str, str], frozenset[str]]] = {
    ("POST", f"{wire.API_PREFIX}/streams"): frozenset({"name"}),
    ("POST", f"{wire.API_PREFIX}/streams/{{name}}/records"): WRITE_FIELDS,
    ("POST", f"{wire.API_PREFIX}/streams/{{name}}/truncate"): frozenset({"dlsn"}),
    ("POST", f"{wire.API_PREFIX}/streams/{{name}}/subscriptions/{{sub}}"): frozenset({"dlsn"}),
    ("POST", f"{wire.API_PREFIX}/topics/{{topic}}/partitions/{{partition}}/records"): WRITE_FIELDS,
}
# Media types a request body may have (none at all reads as JSON).
BODY_MEDIA_TYPES: Final = frozenset({wire.JSON, *wire.MSGPACK_ALIASES})


def check_media_type(content_type: str | None) -> None:
    """UNSUPPORTED_MEDIA_TYPE (415) unless a body's type is one we read."""
    if content_type is None:
        return
    media = content_type.split(";", 1)[0].strip().lower()
    if media not in BODY_MEDIA_TYPES:
        shown = media[:MESSAGE_CHARS_MAX] or "(empty)"
        raise UnsupportedMediaTypeError(
            f"content type {shown!r} is not read here; send {wire.JSON} or {wire.MSGPACK}"
        )


def check_fields(method: str, route: str, body: Mapping[str, Any]) -> None:
    """BAD_REQUEST naming the fields ``route`` does not know: a misspelt field would
    otherwise be dropped without a word."""
    known = BODY_FIELDS.get((method, route))
    if known is None:
        return
    unknown = sorted(str(k)[:MESSAGE_CHARS_MAX] for k in body if k not in known)
    if unknown:
        raise BadRequestError(f"unknown field(s): {', '.join(unknown)}")


# An absolute path inside a message (a znode or a file), not part of a URL: what an
# error deep down may say, and what clients have no business seeing.
_PATH_IN_MESSAGE: Final = re.compile(r"(?<![\w:/.~])/[^\s'\"(),;]+")


def scrub_message(message: str) -> str:
    """``message`` without znode or file paths (each becomes ``<path>``); the server
    logs the original where it logs the error."""
    return _PATH_IN_MESSAGE.sub(_hidden, message)


def _hidden(match: re.Match[str]) -> str:
    path = match.group(0)
    kept = path.rstrip(".:")  # a sentence's punctuation after the path stays
    return "<path>" + path[len(kept) :]


def count_closed(app: web.Application, reason: str) -> None:
    """Count a connection closed by a limit, when the proxy gave a counter."""
    counter = app.get(CONNECTIONS_CLOSED)
    if counter is not None:
        counter.labels(reason).inc()


def http_error(exc: web.HTTPException) -> BooklineError:
    """The Bookline error an aiohttp ``HTTPException`` (>= 400) stands for."""
    if exc.status == 404:
        return NotFoundError("no such endpoint")
    if exc.status == 405:
        allowed = ", ".join(sorted(getattr(exc, "allowed_methods", ()) or ()))
        method = getattr(exc, "method", "this method")
        return MethodNotAllowedError(f"{method} is not allowed here; allowed: {allowed}")
    if exc.status == 413:
        return TooLargeError("request body too large")
    if exc.status == 415:
        return UnsupportedMediaTypeError("unsupported content type")
    if 400 <= exc.status < 500:
        return BadRequestError(f"HTTP {exc.status}: {exc.reason}")
    return UnknownError(f"HTTP {exc.status}: {exc.reason}")


def parser_error_body(status: int, exc: BaseException | None) -> tuple[BooklineError, bytes]:
    """The error and the JSON body answering a request aiohttp could not parse (or a
    handler failure aiohttp caught itself: 500/504 without details)."""
    error: BooklineError
    if status == 413:
        error = TooLargeError("request too large")
    elif 400 <= status < 500:
        text = getattr(exc, "message", None) or str(exc or "") or "malformed request"
        text = " ".join(str(text).split())[:MESSAGE_CHARS_MAX]
        error = BadRequestError(f"malformed HTTP request: {text}")
    else:
        error = UnknownError(f"HTTP {status}: the request could not be answered")
    return error, wire.encode_error(error, wire.JSON)


def mark_authenticated(request: web.BaseRequest) -> None:
    """The connection of ``request`` presented a valid token: no longer a stranger."""
    handler = request.protocol
    if isinstance(handler, _StrictRequestHandler):
        handler.vouch()


class _StrictRequestHandler(RequestHandler):
    """aiohttp's connection handler with JSON error answers, a connection limit and
    the strangers' budget and deadline (module docstring)."""

    __slots__ = ("_stranger_deadline",)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._stranger_deadline: asyncio.TimerHandle | None = None
        manager = self._manager
        if not isinstance(manager, _StrictServer):
            return
        if manager.vetting:
            manager.strangers[self] = None
            self._stranger_deadline = self._loop.call_later(
                manager.stranger_timeout_s, self._stranger_expired
            )
        if not manager.make_room(self):
            manager.note_closed("connections_max", str(transport.get_extra_info("peername")))
            self.shut()

    def vouch(self) -> None:
        """A request of this connection presented a valid token."""
        if self._stranger_deadline is not None:
            self._stranger_deadline.cancel()
            self._stranger_deadline = None
        if isinstance(self._manager, _StrictServer):
            self._manager.strangers.pop(self, None)

    def shut(self) -> None:
        """Close this connection now (a limit's decision)."""
        self.vouch()  # off the strangers' list and timer
        if isinstance(self._manager, _StrictServer):
            self._manager.closing.add(self)
        transport = self.transport
        self.force_close()
        if transport is not None:
            transport.close()

    def _stranger_expired(self) -> None:
        self._stranger_deadline = None
        manager = self._manager
        if isinstance(manager, _StrictServer) and self in manager.strangers:
            manager.note_closed("unauthenticated_timeout", str(self.peername))
            self.shut()

    def connection_lost(self, exc: BaseException | None) -> None:
        manager = self._manager
        self.vouch()
        if isinstance(manager, _StrictServer):
            manager.closing.discard(self)
        super().connection_lost(exc)

    def handle_error(
        self,
        request: Any,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if status >= 500:
            log.error("error handling a request from %s", request.remote, exc_info=exc)
        else:
            log.info("malformed request from %s: %s", request.remote, exc)
        if request.writer.output_size > 0:  # some of an answer is out: nothing to add
            raise ConnectionError("cannot answer an error after an answer was started")
        _error, body = parser_error_body(status, exc)
        resp = web.Response(status=status, body=body, content_type=wire.JSON)
        resp.force_close()
        return resp


class _StrictServer(web.Server):
    """aiohttp's server, making :class:`_StrictRequestHandler` connections."""

    limit: int
    app: web.Application
    # Whether connections must show a valid token (auth on), and the strangers' budget.
    vetting: bool
    strangers_max: int
    stranger_timeout_s: float
    # Connections without a valid token yet, oldest first (a dict keeps the order).
    strangers: dict[_StrictRequestHandler, None]
    # Connections this server closed whose connection_lost has not come yet.
    closing: set[_StrictRequestHandler]
    _closed: dict[str, int]
    _last_log: dict[str, float]

    def __call__(self) -> RequestHandler:
        return _StrictRequestHandler(self, loop=self._loop, **self._kwargs)

    def make_room(self, new: _StrictRequestHandler) -> bool:
        """Close the oldest strangers while strangers are over their budget or every
        slot is taken; False when ``new`` itself must go (no stranger older than it)."""
        while (
            len(self.strangers) > self.strangers_max
            or len(self.connections) - len(self.closing) > self.limit
        ):
            oldest = next(iter(self.strangers), None)
            if oldest is None or oldest is new:
                return False
            self.note_closed("unauthenticated_evicted", str(oldest.peername))
            oldest.shut()
        return True

    def note_closed(self, reason: str, peer: str) -> None:
        """Count a connection a limit closes; log one line per reason every
        REFUSAL_LOG_INTERVAL_S with how many (a flood must not flood the log)."""
        count_closed(self.app, reason)
        self._closed[reason] = self._closed.get(reason, 0) + 1
        now = time.monotonic()
        if now - self._last_log.get(reason, -REFUSAL_LOG_INTERVAL_S) >= REFUSAL_LOG_INTERVAL_S:
            log.warning(
                "closing connection %s: %s (connections_max %d, %d closed so lately)",
                peer,
                reason,
                self.limit,
                self._closed[reason],
            )
            self._last_log[reason] = now
            self._closed[reason] = 0


class StrictAppRunner(web.AppRunner):
    """An ``AppRunner`` whose connections answer parser errors in the one error body and
    are at most ``connections_max`` at once; ``idle_timeout_s`` is aiohttp's keep-alive
    timeout (also the time a new connection gets to send its first request). With
    ``vetting`` (auth on) strangers are at most ``strangers_max`` and live at most
    ``stranger_timeout_s`` (module docstring)."""

    def __init__(
        self,
        app: web.Application,
        *,
        connections_max: int,
        idle_timeout_s: float,
        vetting: bool = False,
        strangers_max: int = 1,
        stranger_timeout_s: float = 10.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(app, keepalive_timeout=idle_timeout_s, **kwargs)
        self._connections_max = connections_max
        self._vetting = vetting
        self._strangers_max = max(1, strangers_max)
        self._stranger_timeout_s = stranger_timeout_s

    async def _make_server(self) -> web.Server:
        server = await super()._make_server()
        server.__class__ = _StrictServer
        strict = server
        assert isinstance(strict, _StrictServer)
        strict.limit = self._connections_max
        strict.app = self._app
        strict.vetting = self._vetting
        strict.strangers_max = self._strangers_max
        strict.stranger_timeout_s = self._stranger_timeout_s
        strict.strangers = {}
        strict.closing = set()
        strict._closed = {}
        strict._last_log = {}
        return strict
