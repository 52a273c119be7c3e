"""One WebSocket tail (``GET /v1/streams/{name}/tail``) on a prepared WebSocket.

The tail starts where ``from`` says; a start that is not a sequence id (a txid, a time,
a DLSN behind the ring, earliest) is found with a first private page. Then it follows
the stream's shared feed, frame by frame (at most ``ws_frame_records_max`` records), and
catches up with a private reader whenever it is behind the feed's ring (a slow client,
a feed restarted after eviction). Frames are ``{"records": [...], "next": "seq:N"}``:
binary msgpack, or text JSON with ``format=json``. A Bookline error ends the tail with
a last text frame ``{"error": {code, name, message}}`` and close code 1011.

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
from readproxy.feeds import Feed
from readproxy.frames import CachedRecord, json_frame, msgpack_frame, pack_record
from readproxy.pages import Pages
from streams.dlsn import PositionKind, StartPosition

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
    expires_at: float | None = None,
    clock: Callable[[], float] = time.time,
) -> None:
    """Follow ``name`` from ``pos`` until the client or the proxy ends it, or until
    ``expires_at`` (unix seconds: the token's expiry; None: never); closes ``ws``."""
    watcher = asyncio.get_running_loop().create_task(_drain_client(ws))
    deadline = asyncio.timeout(None if expires_at is None else max(0.0, expires_at - clock()))
    try:
        try:
            async with deadline:
                await _Tail(ws, pages, name, as_json).follow(pos)
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

    async def follow(self, pos: StartPosition) -> None:
        pages, name = self.pages, self.name
        cfg = pages.config
        frame_max = cfg.ws_frame_records_max
        seq = await self._first_seq(pos)
        feed: Feed = await pages.feeds.open(name, seq)
        feed.subscribers += 1
        pages.metrics.subscribers.inc()
        try:
            while not self.ws.closed:
                if pages.feeds.get(name) is not feed:
                    feed.subscribers -= 1
                    feed = await pages.feeds.open(name, seq)
                    feed.subscribers += 1
                if seq < feed.first_seq:  # behind the ring: catch up privately
                    recs = await pages.pool.read(
                        name, StartPosition.sequence(seq), frame_max, WS_WAIT_SLICE_S
                    )
                    if recs:
                        seq = recs[-1].sequence_id + 1
                        await self._send([pack_record(r) for r in recs], seq, "private")
                    continue
                items = feed.slice(seq, frame_max, cfg.read_bytes_max)
                if items:
                    seq += len(items)
                    await self._send(items, seq, "feed")
                else:
                    await feed.wait_beyond(seq, WS_WAIT_SLICE_S)
        finally:
            feed.subscribers -= 1
            pages.metrics.subscribers.dec()

    async def _first_seq(self, pos: StartPosition) -> int:
        """The sequence id the tail follows from; a start that is not one is found with
        a first private page (sent), or from the stream's info when it has nothing there."""
        pages, name = self.pages, self.name
        cfg = pages.config
        seq = await pages.resolve_seq(name, pos)
        if seq is not None:
            return seq
        recs = await pages.pool.read(name, pos, cfg.ws_frame_records_max, 0.0)
        if recs:
            seq = recs[-1].sequence_id + 1
            await self._send([pack_record(r) for r in recs], seq, "private")
            return seq
        info = await pages.ns.stream_info(name)
        if pos.kind is not PositionKind.EARLIEST or info.first_sequence_id is None:
            return int(info.next_sequence_id)
        return int(info.first_sequence_id)

    async def _send(self, items: list[CachedRecord], next_seq: int, path: str) -> None:
        if self.as_json:
            await self.ws.send_str(json_frame(items, f"seq:{next_seq}"))
        else:
            await self.ws.send_bytes(msgpack_frame(items, f"seq:{next_seq}"))
        self.pages.metrics.count_served(path, self.name, len(items))


async def _drain_client(ws: web.WebSocketResponse) -> None:
    """Read (and ignore) what the client sends, so pings and close frames are handled."""
    async for msg in ws:
        if msg.type is WSMsgType.ERROR:
            log.info("websocket client error: %s", ws.exception())
            break
