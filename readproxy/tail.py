"""One WebSocket tail (``GET /v1/streams/{name}/tail``) on a prepared WebSocket.

The tail starts where ``from`` says and follows the stream's shared feed, one frame per
batch of the read core (:mod:`serving.read.follow`: at most ``ws_frame_records_max``
records; catch-up with a private reader behind the feed's ring). Frames are
``{"records": [...], "next": "seq:N"}``: binary msgpack, or text JSON with
``format=json``. A Bookline error ends the tail with a last text frame
``{"error": {code, name, message}}`` and close code 1011.

A tail opened with a token that expires ends when it does (auth holds for the whole
life of the WebSocket, as it does per request on a keep-alive connection): a last frame
``{"error": {"code": 48, "name": "UNAUTHENTICATED", ...}}`` and close code
:data:`WS_CLOSE_UNAUTHENTICATED` (4401, reason ``UNAUTHENTICATED``); the client opens a
new tail with a fresh token from its ``next`` position.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from aiohttp import WSMsgType, web

from foundation.errors import BooklineError, UnauthenticatedError
from serving.read.follow import Batch, follow
from serving.read.frames import json_frame, msgpack_frame
from serving.read.pages import Pages
from streams.dlsn import StartPosition

log = logging.getLogger(__name__)

__all__ = ["WS_CLOSE_UNAUTHENTICATED", "WS_WAIT_SLICE_S", "serve_tail"]

# A WebSocket tail re-checks its client and feed at least this often while waiting.
WS_WAIT_SLICE_S: Final = 1.0
# The close code of a tail whose token expired: 4000-4999 are the application's
# (RFC 6455 7.4.2); 4401 reads as HTTP's 401.
WS_CLOSE_UNAUTHENTICATED: Final = 4401


async def serve_tail(
    ws: web.WebSocketResponse,
    pages: Pages,
    name: str,
    pos: StartPosition,
    as_json: bool,
    *,
    frame_records_max: int,
    expires_at: float | None = None,
    clock: Callable[[], float] = time.time,
) -> None:
    """Follow ``name`` from ``pos`` (frames of at most ``frame_records_max`` records)
    until the client or the proxy ends it, or until ``expires_at`` (unix seconds: the
    token's expiry; None: never); closes ``ws``."""
    watcher = asyncio.get_running_loop().create_task(_drain_client(ws))
    deadline = asyncio.timeout(None if expires_at is None else max(0.0, expires_at - clock()))
    try:
        try:
            async with deadline:
                await _Tail(ws, pages, name, as_json, frame_records_max).follow(pos)
        except TimeoutError as exc:
            if not deadline.expired():
                raise
            raise UnauthenticatedError("the token expired: the tail ends with it") from exc
    except BooklineError as exc:
        if not ws.closed:
            code = WS_CLOSE_UNAUTHENTICATED if isinstance(exc, UnauthenticatedError) else 1011
            await ws.send_str(json.dumps({"error": exc.to_dict()}))
            await ws.close(code=code, message=exc.name.encode())
    except ConnectionResetError:
        pass  # the client went away mid-send: nothing to tell it
    finally:
        watcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watcher
        if not ws.closed:
            await ws.close()


@dataclass(slots=True)
class _Tail:
    ws: web.WebSocketResponse
    pages: Pages
    name: str
    as_json: bool
    frame_records_max: int

    async def follow(self, pos: StartPosition) -> None:
        """Send the core's batches (:func:`serving.read.follow.follow`) as frames while
        the client is there."""
        batches = follow(self.pages, self.name, pos, self.frame_records_max, WS_WAIT_SLICE_S)
        async with contextlib.aclosing(batches):
            while not self.ws.closed:
                batch = await anext(batches)
                if batch.items:
                    await self._send(batch)

    async def _send(self, batch: Batch) -> None:
        nxt = f"seq:{batch.next_seq}"
        if self.as_json:
            await self.ws.send_str(json_frame(batch.items, nxt))
        else:
            await self.ws.send_bytes(msgpack_frame(batch.items, nxt))
        self.pages.metrics.count_served(batch.path, self.name, len(batch.items))


async def _drain_client(ws: web.WebSocketResponse) -> None:
    """Read (and ignore) what the client sends, so pings and close frames are handled."""
    async for msg in ws:
        if msg.type is WSMsgType.ERROR:
            log.info("websocket client error: %s", ws.exception())
            break
