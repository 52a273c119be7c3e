"""The write proxy's test-only fault hook, an aiohttp middleware installed only when
configured (``fault_stall_writes > 0``): the write path knows nothing of it.

It stalls the answer of the first ``fault_stall_writes`` durable writes that wrote new
records (not only retries) to streams named ``fault_stall_stream_prefix``... by
``fault_stall_ms``, after they are durable, so a client times out and retries a write
that already happened (tests/test_proxy_integration.py, tests/test_proxy_epochs.py).
What a write wrote is read back from its answer (DLSNs minus ``duplicates``).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Final

from aiohttp import web
from aiohttp.typedefs import Middleware

from httpapi import wire, writes
from writeproxy.config import WriteProxyConfig

log = logging.getLogger(__name__)

__all__ = ["fault_middlewares"]

_WRITE_ROUTE: Final = f"{wire.API_PREFIX}/streams/{{name}}/records"


def fault_middlewares(
    config: WriteProxyConfig, *, sleep: Callable[[float], Awaitable[None]] = asyncio.sleep
) -> list[Middleware]:
    """The fault hooks ``config`` asks for (none by default); ``sleep`` is how a stall
    waits (tests pass their own)."""
    if config.fault_stall_writes <= 0:
        return []
    return [_stall_middleware(config, sleep)]


def _stall_middleware(
    config: WriteProxyConfig, sleep: Callable[[float], Awaitable[None]]
) -> Middleware:
    left = config.fault_stall_writes
    prefix = config.fault_stall_stream_prefix
    stall_s = config.fault_stall_ms / 1000

    @web.middleware
    async def stall(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        nonlocal left
        resp = await handler(request)
        if left > 0 and _is_write_to(request, prefix) and _wrote_records(resp):
            left -= 1
            log.warning(
                "fault hook: stalling a durable write's answer %d ms", config.fault_stall_ms
            )
            await sleep(stall_s)
        return resp

    return stall


def _is_write_to(request: web.Request, prefix: str) -> bool:
    resource = request.match_info.route.resource
    return (
        request.method == "POST"
        and resource is not None
        and resource.canonical == _WRITE_ROUTE
        and request.match_info.get("name", "").startswith(prefix)
    )


def _wrote_records(resp: web.StreamResponse) -> bool:
    """A write's answer that carries more DLSNs than ``duplicates``."""
    if resp.status != 200 or not isinstance(resp, web.Response):
        return False
    body = resp.body
    if not isinstance(body, bytes):
        return False
    answer = wire.decode_body(body, resp.content_type)
    duplicates = answer.get("duplicates", 0)
    return len(writes.answer_dlsns(answer)) > (duplicates if isinstance(duplicates, int) else 0)
