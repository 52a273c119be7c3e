"""The thin client's HTTP: one logical request routed, redirected and retried.

A request goes to the proxy :class:`~thinclient.routing.ProxyDirectory` picks. Its answer
is decoded (msgpack asked for); an error body becomes the Bookline error it names.
Connection failures, timeouts, 503 (UNAVAILABLE from a proxy that is starting or
stopping included: that proxy is avoided for a while), 429, NOT_ENOUGH_BOOKIES and
OWNER_MOVED are retried with exponential backoff and full jitter until
``retry_deadline_ms``; OWNER_MOVED redirects are followed at once (``redirects_max``
per attempt). A successful write-side answer teaches the directory the stream's owner.
"""

from __future__ import annotations

import io
import random
from collections.abc import Callable
from ssl import SSLContext
from typing import Any, Final

import aiohttp

from foundation import tls
from foundation.backoff import Backoff
from foundation.errors import (
    BooklineError,
    ClosedError,
    ConnectionLostError,
    NotEnoughBookiesError,
    OwnerMovedError,
    TimeoutError_,
    UnavailableError,
)
from httpapi import wire
from thinclient.config import ClientConfig
from thinclient.routing import ProxyDirectory

__all__ = ["Transport"]

# Request bodies above this are streamed from a BytesIO (aiohttp's large-body advice).
BODY_STREAM_BYTES_MIN: Final = 1 << 20


class Transport:
    """The HTTP session and the retry loop; counts ``retries`` and ``redirects``."""

    def __init__(
        self,
        config: ClientConfig,
        directory: ProxyDirectory,
        rng: random.Random,
        *,
        ssl: SSLContext | None = None,
        token: str | None = None,
    ) -> None:
        self.config = config
        # Sent as ``Authorization: Bearer`` on every request, redirects and WebSocket
        # upgrades included (docs/security.md); never logged.
        self._token = token
        # https proxies are verified with this context, else the process's [tls] one,
        # else the system's CAs (aiohttp's default).
        self._ssl: SSLContext | bool = ssl or tls.client_context() or True
        self.directory = directory
        self.rng = rng
        self._session: aiohttp.ClientSession | None = None
        self._closed = False
        self.retries = 0
        self.redirects = 0

    def open(self) -> None:
        if self._session is None:
            connector = aiohttp.TCPConnector(
                limit=0, limit_per_host=self.config.connections_per_proxy, ssl=self._ssl
            )
            headers = {"Authorization": f"Bearer {self._token}"} if self._token else None
            self._session = aiohttp.ClientSession(connector=connector, headers=headers)

    async def close(self) -> None:
        self._closed = True
        if self._session is not None:
            await self._session.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._closed:
            raise ClosedError("ProxyClient is not started or was closed")
        return self._session

    async def http(
        self, method: str, url: str, body: bytes | None, timeout_s: float | None = None
    ) -> tuple[int, dict[str, Any]]:
        """One HTTP exchange: the status and the decoded answer."""
        headers = {"Accept": wire.MSGPACK}
        if body is not None:
            headers["Content-Type"] = wire.MSGPACK
        timeout = aiohttp.ClientTimeout(
            total=timeout_s if timeout_s is not None else self.config.request_timeout_ms / 1000
        )
        # aiohttp warns that big bytes bodies block the loop; a BytesIO (fresh per
        # attempt: aiohttp closes it) is streamed instead.
        data: bytes | io.BytesIO | None = body
        if body is not None and len(body) > BODY_STREAM_BYTES_MIN:
            data = io.BytesIO(body)
        async with self.session.request(
            method, url, data=data, headers=headers, timeout=timeout, allow_redirects=False
        ) as resp:
            raw = await resp.read()
            return resp.status, wire.decode_body(raw, resp.headers.get("Content-Type"))

    async def call(
        self,
        method: str,
        path: str,
        body: bytes | None,
        *,
        stream: str | None = None,
        read: bool = False,
        timeout_s: float | None = None,
        give_up: Callable[[BooklineError], bool] | None = None,
        avoid_on_timeout: bool = False,
    ) -> dict[str, Any]:
        """One logical request: routed, redirected and retried until the deadline (or
        until ``give_up(error)`` says a retriable error is not worth retrying).
        ``avoid_on_timeout``: a timeout also avoids that proxy for ``proxy_down_ms``, as
        a refused connection does -- for small, quick requests (a group coordinator's)
        that time out only on a hung proxy, whose streams another proxy takes over."""
        cfg = self.config
        proxies = self.directory
        backoff = Backoff(cfg.retry_backoff(), rng=self.rng)
        redirects = 0
        target: str | None = None
        while True:
            if target is None:
                await proxies.discover()
                if read:
                    target = proxies.read_url()
                elif stream is not None:
                    target = proxies.route(stream)
                else:
                    target = proxies.route("")
            try:
                status, obj = await self.http(method, target + path, body, timeout_s)
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                error: BooklineError = (
                    TimeoutError_(f"{method} {target}{path} timed out")
                    if isinstance(exc, TimeoutError)
                    else ConnectionLostError(f"{method} {target}{path}: {exc}")
                )
                error.__cause__ = exc
                if avoid_on_timeout or not isinstance(exc, TimeoutError):
                    proxies.mark_down(target)
                    await proxies.discover(force=True)
                if stream is not None:
                    proxies.forget_owner(stream)
            else:
                if status < 300:
                    if stream is not None and not read:
                        proxies.learn_owner(stream, target)
                    return obj
                error = wire.decode_error(obj, status)
            if isinstance(error, OwnerMovedError) and stream is not None:
                owner = (error.owner or "").rstrip("/")
                if owner and not proxies.is_down(owner) and redirects < cfg.redirects_max:
                    redirects += 1
                    self.redirects += 1
                    proxies.learn_owner(stream, owner)
                    target = owner
                    continue
                proxies.forget_owner(stream)
            if isinstance(error, UnavailableError):
                # That proxy is starting or stopping: another one may serve meanwhile.
                proxies.mark_down(target)
                if stream is not None:
                    proxies.forget_owner(stream)
            if not (error.retriable or isinstance(error, NotEnoughBookiesError)):
                raise error
            if give_up is not None and give_up(error):
                raise error
            if backoff.expired():
                raise error
            self.retries += 1
            redirects = 0
            await backoff.sleep()
            target = None
