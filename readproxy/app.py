"""The read proxy's HTTP service (see ``docs/openapi.json`` and ``docs/proxies.md``).

Routes:

* ``GET /v1/streams/{name}/records?from=POS&limit=N&wait_ms=MS`` -- a page of records
  from ``POS`` (earliest, latest, ``s:e:s``, ``seq:N``, ``txid:N``, ``time:MS``);
  ``wait_ms > 0`` makes it a long poll (answers as soon as one record is there) and
  serves it from the stream's shared feed (:mod:`serving.read.pages`);
* ``GET /v1/streams/{name}/recordsets?from=POS&bytes_max=B&wait_ms=MS`` -- catch-up
  reads: the entries' record sets as the bookies stored them, nothing decoded or
  re-encoded (binary, :mod:`httpapi.recordsets`; the thin client decodes them);
* ``GET /v1/streams/{name}/tail?from=POS`` -- WebSocket; binary msgpack frames
  ``{"records": [...], "next": "seq:N"}`` (text JSON frames with ``format=json``;
  :mod:`readproxy.tail`);
* ``GET /v1/topics/{t}/partitions/{p}/records?offset=N&limit=M&wait_ms=MS`` -- a topic
  partition by offset, for consumers (:mod:`readproxy.topics`);
* ``GET|POST|DELETE /v1/streams/{name}/subscriptions[/{sub}]`` -- core subscriptions
  (:mod:`readproxy.subscriptions`);
* ``GET /v1/streams``, ``GET /v1/streams/{name}``, ``/health``, ``/metrics``,
  ``/openapi.json``;
* ``GET /dashboard`` -- the live dashboard, polling ``GET /v1/cluster``
  (:mod:`readproxy.dashboard`, :mod:`readproxy.cluster`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import TYPE_CHECKING, Any, Final

from aiohttp import web

from foundation.errors import (
    BooklineError,
    ClosedError,
    NotFoundError,
    TooManyRequestsError,
)
from foundation.health import State, health_body
from foundation.names import validate_name
from httpapi import recordsets, wire
from httpapi.auth import (
    auth_middlewares,
    check_rules,
    sees_detail,
    service_token_source,
    token_expiry,
)
from httpapi.monitoring import health_response, latency_middleware
from httpapi.positions import parse_position
from httpapi.proxy_config import READ_PROXY_PREFIX
from httpapi.server import cancel_task, proxy_app, respond, start_site
from httpapi.views import info_view
from kafkaapi.hosting import KafkaHost, start_kafka
from metadata.proxies import ProxyInfo
from metadata.zk import SessionState
from readproxy import subscriptions, topics
from readproxy.cluster import ClusterView
from readproxy.config import ReadProxyConfig
from readproxy.dashboard import register_dashboard
from readproxy.metrics import ReadProxyMetrics
from readproxy.tail import serve_tail
from readproxy.topics import query_int
from serving.read.feeds import FeedRegistry
from serving.read.frames import page_body
from serving.read.pages import Pages
from serving.read.readers import ReaderPool

if TYPE_CHECKING:
    from metadata.client import MetadataClient
    from streams.namespace import Namespace

log = logging.getLogger(__name__)

__all__ = ["ReadProxy"]

# How often idle private readers are closed.
REAP_INTERVAL_S: Final = 2.0
# Largest message a tailing client may send (it only sends pings and close frames).
WS_CLIENT_MESSAGE_BYTES_MAX: Final = 64 * 1024
# WebSocket ping interval: a silent dead client is noticed within about twice this.
WS_HEARTBEAT_S: Final = 20.0


class ReadProxy:
    def __init__(self, config: ReadProxyConfig) -> None:
        self.config = config
        self.metrics = ReadProxyMetrics()
        self.url = config.url
        self._ns: Namespace | None = None
        self._md: MetadataClient | None = None
        self._feeds: FeedRegistry | None = None
        self._pool: ReaderPool | None = None
        self._pages: Pages | None = None
        self._runner: web.AppRunner | None = None
        self._reap_task: asyncio.Task[None] | None = None
        self._websockets: set[web.WebSocketResponse] = set()
        self._stopping = False
        self._cluster: ClusterView | None = None
        self._kafka: KafkaHost | None = None  # with kafka_enabled (docs/kafka.md)

    @property
    def registration_id(self) -> str:
        return READ_PROXY_PREFIX + self.config.proxy_id

    # -- lifecycle -----------------------------------------------------------------

    async def start(self) -> None:
        from streams.config import NamespaceConfig
        from streams.namespace import Namespace

        cfg = self.config
        self.build_app()  # bad auth files (or an unruled route) fail here, before ZooKeeper
        # Its own short-lived service tokens, when it holds the signing secret, for the
        # bookies (renewed per connection) and the other services' /health details;
        # else $BOOKLINE_TOKEN.
        token = service_token_source(cfg.auth(), cfg.auth_service_token_lifetime_s)
        self._ns = await Namespace.open(
            zk=cfg.zk,
            root=cfg.root,
            namespace=cfg.namespace,
            config=NamespaceConfig(session_timeout_ms=cfg.session_timeout_ms),
            token=token,
        )
        core = cfg.read_config()
        self._feeds = FeedRegistry(self._ns, core, self.metrics)
        self._feeds.start()
        self._pool = ReaderPool(self._ns, core, self.metrics)
        self._pages = Pages(self._ns, self._feeds, self._pool, core, self.metrics)
        self._runner, self.url = await start_site(self.build_app(), cfg)
        # One ZooKeeper session per proxy: the core's. The registration then lives and
        # dies with the same session as the readers.
        self._md = self._ns.context.md
        self._cluster = ClusterView(
            self._ns, self._md, self.health_body, token=token, zk_connect=cfg.zk
        )
        self._kafka = await start_kafka(
            cfg, self.registration_id, self._ns, current_ns=lambda: self.ns,
            pages=lambda: self.pages,
        )  # fmt: skip
        info = ProxyInfo(self.registration_id, self.url, 0.0)
        if self._kafka is not None:  # announces the Kafka listener too
            info = self._kafka.registration(self.registration_id, self.url, 0.0)
        await self._md.proxies.register(info)
        self._reap_task = asyncio.get_running_loop().create_task(self._reap())

    async def _reap(self) -> None:
        while True:
            await asyncio.sleep(REAP_INTERVAL_S)
            await self.pages.pool.reap()

    async def stop(self) -> None:
        self._stopping = True
        await cancel_task(self._reap_task)
        if self._kafka is not None:
            await self._kafka.stop()
        for ws in list(self._websockets):
            await ws.close(code=1001, message=b"read proxy stopping")
        if self._runner is not None:
            await self._runner.cleanup()
        if self._cluster is not None:
            await self._cluster.close()
        if self._feeds is not None:
            await self._feeds.close()
        if self._pool is not None:
            await self._pool.close()
        if self._md is not None:
            with contextlib.suppress(BooklineError):
                await self._md.proxies.unregister(self.registration_id)
        if self._ns is not None:
            await self._ns.close()

    @property
    def ns(self) -> Namespace:
        if self._ns is None:
            raise ClosedError("read proxy not started")
        return self._ns

    @property
    def pages(self) -> Pages:
        if self._pages is None:
            raise ClosedError("read proxy not started")
        return self._pages

    def build_app(self) -> web.Application:
        app = proxy_app(
            health=self.health,
            registry=self.metrics.registry,
            requests=self.metrics.requests,
            connections_closed=self.metrics.connections_closed,
            middlewares=[
                *auth_middlewares(self.config.auth()),  # none unless auth_enabled
                latency_middleware(
                    self.metrics.request_seconds, self.metrics.long_poll_wait_seconds
                ),
            ],
        )
        p = wire.API_PREFIX
        app.router.add_get(f"{p}/streams", self.list_streams)
        app.router.add_get(f"{p}/streams/{{name}}", self.describe)
        app.router.add_get(f"{p}/streams/{{name}}/records", self.read)
        app.router.add_get(f"{p}/streams/{{name}}/recordsets", self.read_sets)
        app.router.add_get(f"{p}/streams/{{name}}/tail", self.tail)
        topics.add_routes(app, lambda: self.pages, self.config)
        subscriptions.add_routes(app, lambda: self.ns)
        register_dashboard(app, lambda: self._cluster)
        check_rules(app)  # every route has an access rule (httpapi.auth)
        return app

    # -- plain routes ----------------------------------------------------------------

    async def health(self, request: web.Request) -> web.Response:
        # stream names in log lines are not for anyone: details for a token allowed them
        return health_response(self.health_body(), detail=sees_detail(request))

    def health_body(self) -> dict[str, Any]:
        """State (:mod:`foundation.health`), shared feeds and read totals."""
        feeds = self._feeds
        if self._stopping:
            state, why = State.STOPPING, "stopping"
        elif feeds is None or self._md is None:
            state, why = State.STARTING, "starting: connecting to ZooKeeper"
        elif self._md.zk.state is not SessionState.CONNECTED:
            state, why = State.DEGRADED, "ZooKeeper session suspended: new reads wait"
        else:
            state, why = State.OK, "serving"
        return health_body(
            "readproxy",
            self.config.proxy_id,
            state,
            why,
            proxy_id=self.config.proxy_id,
            url=self.url,
            feeds=len(feeds.feeds) if feeds else 0,
            cache_bytes=feeds.cache_bytes if feeds else 0,
            websockets=len(self._websockets),
            **self.metrics.health_figures(),
        )

    async def list_streams(self, request: web.Request) -> web.Response:
        return respond(request, {"streams": sorted(await self.ns.list_streams())})

    async def describe(self, request: web.Request) -> web.Response:
        name = validate_name(request.match_info["name"], "stream name")
        return respond(request, info_view(await self.ns.stream_info(name)))

    # -- reads -----------------------------------------------------------------------

    async def read(self, request: web.Request) -> web.Response:
        cfg = self.config
        name = validate_name(request.match_info["name"], "stream name")
        pos = parse_position(request.query.get("from"))
        limit = query_int(request, "limit", 100, cfg.read_records_max) or 1
        wait_ms = query_int(request, "wait_ms", 0, cfg.long_poll_ms_max)
        items, nxt = await self.pages.read_page(name, pos, limit, wait_ms / 1000)
        media = wire.negotiate(request.headers.get("Accept"))
        return web.Response(body=page_body(items, nxt, media), content_type=media)

    async def read_sets(self, request: web.Request) -> web.Response:
        cfg = self.config
        name = validate_name(request.match_info["name"], "stream name")
        pos = parse_position(request.query.get("from"))
        bytes_max = query_int(request, "bytes_max", cfg.read_bytes_max, cfg.read_bytes_max) or 1
        wait_ms = query_int(request, "wait_ms", 0, cfg.long_poll_ms_max)
        sets, nxt = await self.pages.read_sets(name, pos, bytes_max, wait_ms / 1000)
        frames = [recordsets.SetFrame(s.payload, s.segment_seqno, s.entry_id,
                                      s.start_sequence_id, s.from_slot) for s in sets]  # fmt: skip
        return web.Response(body=recordsets.encode(frames, nxt),
                            content_type=recordsets.MEDIA_TYPE)  # fmt: skip

    async def tail(self, request: web.Request) -> web.StreamResponse:
        name = validate_name(request.match_info["name"], "stream name")
        pos = parse_position(request.query.get("from", "latest"))
        as_json = request.query.get("format") == "json"
        if len(self._websockets) >= self.config.websockets_max:
            raise TooManyRequestsError(f"{len(self._websockets)} WebSocket tails; the limit")
        if not await self.ns.exists(name):  # 404 before upgrading (ZooKeeper only)
            raise NotFoundError(f"stream {name} does not exist")
        ws = web.WebSocketResponse(
            heartbeat=WS_HEARTBEAT_S, max_msg_size=WS_CLIENT_MESSAGE_BYTES_MAX
        )
        await ws.prepare(request)
        self._websockets.add(ws)
        self.metrics.websockets.set(len(self._websockets))
        try:
            # the token's expiry ends the tail (auth holds for the WebSocket's life)
            expires_at = token_expiry(request)
            await serve_tail(
                ws,
                self.pages,
                name,
                pos,
                as_json,
                frame_records_max=self.config.ws_frame_records_max,
                expires_at=expires_at,
            )
        finally:
            self._websockets.discard(ws)
            self.metrics.websockets.set(len(self._websockets))
        return ws
