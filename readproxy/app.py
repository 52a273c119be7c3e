"""The read proxy's HTTP service (see ``docs/openapi.json`` and ``docs/proxies.md``).

Routes:

* ``GET /v1/streams/{name}/records?from=POS&limit=N&wait_ms=MS`` -- a page of records
  from ``POS`` (earliest, latest, ``s:e:s``, ``seq:N``, ``txid:N``, ``time:MS``);
  ``wait_ms > 0`` makes it a long poll (answers as soon as one record is there) and
  serves it from the stream's shared feed;
* ``GET /v1/streams/{name}/tail?from=POS`` -- WebSocket; binary msgpack frames
  ``{"records": [...], "next": "seq:N"}`` (text JSON frames with ``format=json``);
* ``GET /v1/streams``, ``GET /v1/streams/{name}``, ``/health``, ``/metrics``,
  ``/openapi.json``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import TYPE_CHECKING

import msgpack
from aiohttp import WSMsgType, web

from foundation.errors import (
    BadRequestError,
    BooklineError,
    ClosedError,
    NotFoundError,
    TooManyRequestsError,
)
from foundation.names import validate_name
from httpapi import wire
from httpapi.server import cancel_task, proxy_app, respond, start_site
from httpapi.views import info_view, record_view
from metadata.proxies import ProxyInfo
from readproxy.config import ReadProxyConfig
from readproxy.feeds import CachedRecord, Feed, FeedRegistry, ReaderPool, pack_record
from readproxy.metrics import ReadProxyMetrics
from streams.dlsn import DLSN, StartPosition
from streams.records import ReadRecord

if TYPE_CHECKING:
    from metadata.client import MetadataClient
    from streams.namespace import Namespace

log = logging.getLogger(__name__)

READ_PROXY_PREFIX = "read@"  # registration id prefix: proxies/read@<id>
# How often idle private readers are closed.
REAP_INTERVAL_S = 2.0
# A WebSocket tail re-checks its client and feed at least this often while waiting.
WS_WAIT_SLICE_S = 1.0

_PACKER_KEYS = (msgpack.packb("records"), msgpack.packb("next"))


def _frame(items: list[CachedRecord], next_pos: str) -> bytes:
    """msgpack ``{"records": [...], "next": ...}`` from records packed once each."""
    head = msgpack.Packer().pack_array_header(len(items))
    return b"".join(
        (
            b"\x82",
            _PACKER_KEYS[0],
            head,
            *(i.packed for i in items),
            _PACKER_KEYS[1],
            msgpack.packb(next_pos),
        )
    )


def _to_start(pos: wire.Position) -> StartPosition:
    if pos.kind == "earliest":
        return StartPosition.earliest()
    if pos.kind == "latest":
        return StartPosition.latest()
    if pos.kind == "dlsn":
        assert pos.dlsn is not None
        return StartPosition.dlsn(DLSN(*pos.dlsn))
    assert pos.value is not None
    if pos.kind == "seq":
        return StartPosition.sequence(pos.value)
    if pos.kind == "txid":
        return StartPosition.txid(pos.value)
    return StartPosition.timestamp(pos.value)


class ReadProxy:
    def __init__(self, config: ReadProxyConfig) -> None:
        self.config = config
        self.metrics = ReadProxyMetrics()
        self.url = config.url
        self._ns: Namespace | None = None
        self._md: MetadataClient | None = None
        self._feeds: FeedRegistry | None = None
        self._pool: ReaderPool | None = None
        self._runner: web.AppRunner | None = None
        self._reap_task: asyncio.Task[None] | None = None
        self._websockets: set[web.WebSocketResponse] = set()

    # -- lifecycle -----------------------------------------------------------------

    async def start(self) -> None:
        from streams.config import NamespaceConfig
        from streams.namespace import Namespace

        cfg = self.config
        self._ns = await Namespace.open(
            zk=cfg.zk,
            root=cfg.root,
            namespace=cfg.namespace,
            config=NamespaceConfig(session_timeout_ms=cfg.session_timeout_ms),
        )
        self._feeds = FeedRegistry(self._ns, cfg, self.metrics)
        self._feeds.start()
        self._pool = ReaderPool(self._ns, cfg, self.metrics)
        self._runner, self.url = await start_site(self.build_app(), cfg)
        # One ZooKeeper session per proxy: the core's. The owner records then live and
        # die with the same session as the writer locks.
        self._md = self._ns.context.md
        await self._md.proxies.register(ProxyInfo(READ_PROXY_PREFIX + cfg.proxy_id, self.url, 0.0))
        self._reap_task = asyncio.get_running_loop().create_task(self._reap())

    async def _reap(self) -> None:
        while True:
            await asyncio.sleep(REAP_INTERVAL_S)
            await self.pool.reap()

    async def stop(self) -> None:
        await cancel_task(self._reap_task)
        for ws in list(self._websockets):
            await ws.close(code=1001, message=b"read proxy stopping")
        if self._runner is not None:
            await self._runner.cleanup()
        if self._feeds is not None:
            await self._feeds.close()
        if self._pool is not None:
            await self._pool.close()
        if self._md is not None:
            with contextlib.suppress(BooklineError):
                await self._md.proxies.unregister(READ_PROXY_PREFIX + self.config.proxy_id)
        if self._ns is not None:
            await self._ns.close()

    @property
    def ns(self) -> Namespace:
        if self._ns is None:
            raise ClosedError("read proxy not started")
        return self._ns

    @property
    def feeds(self) -> FeedRegistry:
        if self._feeds is None:
            raise ClosedError("read proxy not started")
        return self._feeds

    @property
    def pool(self) -> ReaderPool:
        if self._pool is None:
            raise ClosedError("read proxy not started")
        return self._pool

    def build_app(self) -> web.Application:
        app = proxy_app(
            health=self.health, registry=self.metrics.registry, requests=self.metrics.requests
        )
        p = wire.API_PREFIX
        app.router.add_get(f"{p}/streams", self.list_streams)
        app.router.add_get(f"{p}/streams/{{name}}", self.describe)
        app.router.add_get(f"{p}/streams/{{name}}/records", self.read)
        app.router.add_get(f"{p}/streams/{{name}}/tail", self.tail)
        return app

    # -- plain routes ----------------------------------------------------------------

    async def health(self, request: web.Request) -> web.Response:
        return respond(
            request,
            {
                "status": "ok",
                "proxy_id": self.config.proxy_id,
                "url": self.url,
                "feeds": len(self.feeds.feeds),
                "cache_bytes": self.feeds.cache_bytes,
                "websockets": len(self._websockets),
            },
        )

    async def list_streams(self, request: web.Request) -> web.Response:
        return respond(request, {"streams": sorted(await self.ns.list_streams())})

    async def describe(self, request: web.Request) -> web.Response:
        name = validate_name(request.match_info["name"], "stream name")
        return respond(request, info_view(await self.ns.stream_info(name)))

    # -- reads -----------------------------------------------------------------------

    def _query_int(self, request: web.Request, key: str, default: int, hi: int) -> int:
        raw = request.query.get(key)
        if raw is None:
            return default
        try:
            value = int(raw)
        except ValueError as exc:
            raise BadRequestError(f"query parameter {key} must be an integer") from exc
        if not 0 <= value <= hi:
            raise BadRequestError(f"query parameter {key} must be within 0..{hi}")
        return value

    async def _resolve_seq(self, name: str, pos: wire.Position) -> int | None:
        """The position as a sequence id, when that is cheap to know."""
        if pos.kind == "seq":
            return pos.value
        feed = self.feeds.get(name)
        if pos.kind == "latest":
            if feed is not None:
                return feed.next_seq
            info = await self.ns.stream_info(name)
            return int(info.next_sequence_id)
        if pos.kind == "dlsn" and feed is not None:
            assert pos.dlsn is not None
            return feed.seq_of(DLSN(*pos.dlsn))
        return None

    async def read_page(
        self, name: str, pos: wire.Position, limit: int, wait_s: float
    ) -> tuple[list[CachedRecord] | list[ReadRecord], str]:
        """Records from ``pos`` and where to continue."""
        cfg = self.config
        follow = wait_s > 0
        seq = await self._resolve_seq(name, pos)
        if seq is not None:
            feed = self.feeds.get(name)
            if feed is None and (follow or pos.kind == "latest"):
                feed = await self.feeds.open(name, seq)
            if feed is not None and feed.covers(seq):
                items = feed.slice(seq, limit, cfg.read_bytes_max)
                if not items and follow and await feed.wait_beyond(seq, wait_s):
                    items = feed.slice(seq, limit, cfg.read_bytes_max)
                self.metrics.served_records.labels("feed").inc(len(items))
                return items, f"seq:{seq + len(items)}"
            start = StartPosition.sequence(seq)
        else:
            start = _to_start(pos)
        timeout = wait_s if follow else cfg.range_read_timeout_ms / 1000
        recs = await self.pool.read(name, start, limit, timeout)
        self.metrics.served_records.labels("private").inc(len(recs))
        if recs:
            nxt = recs[-1].sequence_id + 1
            if follow and len(recs) < limit and self.feeds.get(name) is None:
                await self.feeds.open(name, nxt)  # this reader reached the head
            return recs, f"seq:{nxt}"
        return recs, f"seq:{seq}" if seq is not None else str(pos)

    async def read(self, request: web.Request) -> web.Response:
        cfg = self.config
        name = validate_name(request.match_info["name"], "stream name")
        pos = wire.parse_position(request.query.get("from"))
        limit = self._query_int(request, "limit", 100, cfg.read_records_max) or 1
        wait_ms = self._query_int(request, "wait_ms", 0, cfg.long_poll_ms_max)
        items, nxt = await self.read_page(name, pos, limit, wait_ms / 1000)
        media = wire.negotiate(request.headers.get("Accept"))
        if media == wire.MSGPACK:
            packed = [i if isinstance(i, CachedRecord) else pack_record(i) for i in items]
            body = _frame(packed, nxt)
        else:
            views = [record_view(i.record if isinstance(i, CachedRecord) else i) for i in items]
            body = wire.encode_body({"records": views, "next": nxt}, media)
        return web.Response(body=body, content_type=media)

    # -- WebSocket tail ----------------------------------------------------------------

    async def tail(self, request: web.Request) -> web.StreamResponse:
        cfg = self.config
        name = validate_name(request.match_info["name"], "stream name")
        pos = wire.parse_position(request.query.get("from", "latest"))
        as_json = request.query.get("format") == "json"
        if len(self._websockets) >= cfg.websockets_max:
            raise TooManyRequestsError(f"{len(self._websockets)} WebSocket tails; the limit")
        if not await self.ns.exists(name):  # 404 before upgrading (ZooKeeper only)
            raise NotFoundError(f"stream {name} does not exist")
        ws = web.WebSocketResponse(heartbeat=20.0, max_msg_size=64 * 1024)
        await ws.prepare(request)
        self._websockets.add(ws)
        self.metrics.websockets.set(len(self._websockets))
        watcher = asyncio.get_running_loop().create_task(_drain_client(ws))
        try:
            await self._tail_loop(ws, name, pos, as_json)
        except BooklineError as exc:
            if not ws.closed:
                await ws.send_str(json.dumps({"error": exc.to_dict()}))
                await ws.close(code=1011, message=exc.name.encode())
        except ConnectionResetError:
            pass  # the client went away mid-send: nothing to tell it
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
            self._websockets.discard(ws)
            self.metrics.websockets.set(len(self._websockets))
            if not ws.closed:
                await ws.close()
        return ws

    async def _tail_loop(
        self, ws: web.WebSocketResponse, name: str, pos: wire.Position, as_json: bool
    ) -> None:
        cfg = self.config
        frame_max = cfg.ws_frame_records_max
        seq = await self._resolve_seq(name, pos)
        if seq is None:
            # A txid/time/DLSN/earliest start: a first private page finds the sequence id.
            start = _to_start(pos)
            recs = await self.pool.read(name, start, frame_max, cfg.range_read_timeout_ms / 1000)
            if recs:
                seq = recs[-1].sequence_id + 1
                await self._send(ws, [pack_record(r) for r in recs], seq, as_json, "private")
            else:
                info = await self.ns.stream_info(name)
                seq = (
                    int(info.next_sequence_id)
                    if pos.kind != "earliest"
                    else int(
                        info.first_sequence_id
                        if info.first_sequence_id is not None
                        else info.next_sequence_id
                    )
                )
        feed: Feed = await self.feeds.open(name, seq)
        feed.subscribers += 1
        self.metrics.subscribers.inc()
        try:
            while not ws.closed:
                if self.feeds.get(name) is not feed:
                    feed.subscribers -= 1
                    feed = await self.feeds.open(name, seq)
                    feed.subscribers += 1
                if seq < feed.first_seq:
                    recs = await self.pool.read(
                        name, StartPosition.sequence(seq), frame_max, WS_WAIT_SLICE_S
                    )
                    if recs:
                        seq = recs[-1].sequence_id + 1
                        await self._send(
                            ws, [pack_record(r) for r in recs], seq, as_json, "private"
                        )
                    continue
                items = feed.slice(seq, frame_max, cfg.read_bytes_max)
                if items:
                    seq += len(items)
                    await self._send(ws, items, seq, as_json, "feed")
                else:
                    await feed.wait_beyond(seq, WS_WAIT_SLICE_S)
        finally:
            feed.subscribers -= 1
            self.metrics.subscribers.dec()

    async def _send(
        self,
        ws: web.WebSocketResponse,
        items: list[CachedRecord],
        next_seq: int,
        as_json: bool,
        path: str,
    ) -> None:
        if as_json:
            await ws.send_str(
                json.dumps(
                    wire._to_json(
                        {
                            "records": [record_view(i.record) for i in items],
                            "next": f"seq:{next_seq}",
                        }
                    )
                )
            )
        else:
            await ws.send_bytes(_frame(items, f"seq:{next_seq}"))
        self.metrics.served_records.labels(path).inc(len(items))


async def _drain_client(ws: web.WebSocketResponse) -> None:
    """Read (and ignore) what the client sends, so pings and close frames are handled."""
    async for msg in ws:
        if msg.type is WSMsgType.ERROR:
            log.info("websocket client error: %s", ws.exception())
            break
