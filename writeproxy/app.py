"""The write proxy's HTTP service (see ``docs/openapi.json`` and ``docs/proxies.md``).

Routes (all bodies msgpack or JSON, errors ``{code, name, message}``):

* ``POST   /v1/streams/{name}/records``    write one record or a batch (idempotent with
  producer + seq); 307 OWNER_MOVED when another proxy owns the stream
* ``POST   /v1/streams/{name}/heartbeat``  own the stream (acquire if free), flush
* ``POST   /v1/streams/{name}/truncate``   ``{"dlsn": "s:e:s"}``
* ``POST   /v1/streams/{name}/release``    hand the stream back
* ``GET    /v1/streams/{name}/owner``      who owns it
* ``GET|DELETE /v1/streams/{name}``        describe / delete
* ``GET|POST /v1/streams``                 list / create ``{"name": ...}``
* ``/v1/topics...``                         topics and partition writes (writeproxy/topics.py)
* ``/v1/groups/...``                       consumer group coordinators (``writeproxy.groups``)
* ``GET /health``, ``GET /metrics``, ``GET /openapi.json``
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

from aiohttp import web

from foundation.errors import (
    AlreadyExistsError,
    BadRequestError,
    BooklineError,
    ConfigError,
    NotFoundError,
    OwnerMovedError,
    TooLargeError,
    UnavailableError,
)
from foundation.health import State, health_body
from foundation.names import validate_name
from httpapi import wire, writes
from httpapi.auth import (
    auth_middlewares,
    check_rules,
    require,
    sees_detail,
    service_token_source,
)
from httpapi.monitoring import health_response, latency_middleware
from httpapi.positions import parse_dlsn
from httpapi.server import cancel_task, proxy_app, read_body, respond, start_site
from httpapi.views import info_view
from kafkaapi.hosting import KafkaHost, start_kafka
from metadata.proxies import ProxyInfo
from metadata.zk import SessionState
from serving.write.batch import ProducerSeq, WriteBatch
from serving.write.core import WriteCore
from serving.write.ownership import Ownership
from serving.write.topics import TopicHosting
from streams.dlsn import DLSN
from writeproxy.config import WriteProxyConfig
from writeproxy.faults import fault_middlewares
from writeproxy.groups import GroupRoutes, register_group_routes
from writeproxy.metrics import WriteProxyMetrics
from writeproxy.topics import register_topic_routes

if TYPE_CHECKING:
    from groups.coordinator import GroupStats
    from metadata.client import MetadataClient
    from streams.namespace import Namespace

log = logging.getLogger(__name__)

# A registration of our id left by an earlier process at another address is waited out:
# its session expires within session_timeout_ms; this grace covers ZooKeeper's expiry
# slack (ticks) before giving up with ALREADY_EXISTS (a second proxy with our id).
REGISTER_GRACE_S = 5.0
REGISTER_RETRY_S = 0.5
# A stop (SIGTERM) ends well within the 10 s after which ops.cluster.procs -- like most process
# managers -- SIGKILLs, which would leave the registration and owner records behind for
# a session timeout. Writers get this long to flush and seal; with their bookies down
# they never would, and closing the ZooKeeper session then releases their locks (the
# next owner recovers the segments). In-flight requests are answered at once; the HTTP
# server gives handlers http_server.SHUTDOWN_ANSWER_S.
STOP_WRITERS_S = 3.0


class WriteProxy:
    """One write proxy: ZooKeeper registration, owned streams, HTTP routes."""

    def __init__(self, config: WriteProxyConfig) -> None:
        self.config = config
        self.metrics = WriteProxyMetrics()
        # The write path (serving.write): admission, ownership, producer order, dedup.
        self.core = WriteCore(config.write_config(), self.metrics, lambda: self.ownership)
        self.limiter = self.core.limiter
        self.url = config.url
        self._ns: Namespace | None = None
        self._md: MetadataClient | None = None
        self._ownership: Ownership | None = None
        self._runner: web.AppRunner | None = None
        self._load_task: asyncio.Task[None] | None = None
        self._stopping = False
        self.metrics.bind_gauges(
            lambda: float(len(self._ownership.owned) if self._ownership else 0),
            lambda: float(self.limiter.total_bytes),
            lambda: float(self.limiter.total_requests),
        )
        self._groups: GroupRoutes | None = None
        self._kafka: KafkaHost | None = None  # with kafka_enabled (docs/kafka.md)

    # -- lifecycle -----------------------------------------------------------------

    async def start(self) -> None:
        from streams.config import NamespaceConfig
        from streams.namespace import Namespace

        cfg = self.config
        self._runner, self.url = await start_site(self.build_app(), cfg)
        core_overrides: dict[str, Any] = {
            "session_timeout_ms": cfg.session_timeout_ms,
            # Admission keeps a stream's pending bytes under half of this, so the core
            # writer never makes a batch wait for room (see serving.write.owned).
            "pending_bytes_max": 2 * cfg.stream_inflight_bytes_max,
            "ensemble_size": cfg.ensemble_size,
            "write_quorum": cfg.write_quorum,
            "ack_quorum": cfg.ack_quorum,
        }
        if cfg.writer_flush_interval_ms:
            core_overrides["flush_interval_ms"] = cfg.writer_flush_interval_ms
        self._ns = await Namespace.open(
            zk=cfg.zk,
            root=cfg.root,
            namespace=cfg.namespace,
            config=NamespaceConfig(**core_overrides),
            # Its own short-lived service tokens for the bookies when it holds the
            # signing secret (renewed per connection), else $BOOKLINE_TOKEN.
            token=service_token_source(cfg.auth(), cfg.auth_service_token_lifetime_s),
        )
        # One ZooKeeper session per proxy: the core's. The owner records then live and
        # die with the same session as the writer locks.
        self._md = self._ns.context.md
        await self._check_bookies()
        self._ownership = Ownership(
            self.core.config, self._ns, self._md, self.url, metrics=self.metrics
        )
        self._md.zk.add_state_listener(self._on_session)
        self._kafka = await start_kafka(
            cfg, cfg.proxy_id, self._ns, current_ns=lambda: self.ns, write=self.core,
            topics=TopicHosting(self), groups=self._groups.hosting if self._groups else None,
        )  # fmt: skip
        await self._register(self._registration(0.0))
        self._load_task = asyncio.get_running_loop().create_task(self._report_load())

    def _registration(self, load: float) -> ProxyInfo:
        if self._kafka is not None:  # announces the Kafka listener too
            return self._kafka.registration(self.config.proxy_id, self.url, load)
        return ProxyInfo(self.config.proxy_id, self.url, load)

    async def _check_bookies(self) -> None:
        """A quorum no set of writable bookies can meet is a configuration error: say so
        at start (naming the setting), not at every write."""
        assert self._md is not None
        writable = await self._md.bookies.list_writable()
        if len(writable) < self.config.ensemble_size:
            raise ConfigError(
                f"writeproxy.ensemble_size is {self.config.ensemble_size} but only "
                f"{len(writable)} bookies are writable ({', '.join(sorted(writable)) or 'none'}):"
                " start more bookies or lower ensemble_size / write_quorum / ack_quorum"
            )

    async def _register(self, info: ProxyInfo) -> None:
        """Register, taking over a stale registration of our own address (a restart
        within the old session's timeout) and waiting out one at another address."""
        assert self._md is not None
        deadline = time.monotonic() + self.config.session_timeout_ms / 1000 + REGISTER_GRACE_S
        while True:
            try:
                await self._md.proxies.register(info)
                return
            except AlreadyExistsError as exc:
                if time.monotonic() > deadline:
                    raise
                log.info(
                    "write proxy %s: waiting for a previous session to expire (%s)",
                    info.proxy_id,
                    exc.message,
                )
                await asyncio.sleep(REGISTER_RETRY_S)

    def _on_session(self, state: SessionState) -> None:
        if state is SessionState.LOST and self._ownership is not None:
            log.warning("ZooKeeper session lost: dropping every owned stream")
            self._ownership.drop_all_soon()

    async def _report_load(self) -> None:
        assert self._md is not None
        while True:
            await asyncio.sleep(self.config.load_report_interval_ms / 1000)
            owned = len(self._ownership.owned) if self._ownership else 0
            try:
                await self._md.proxies.update(self._registration(owned))
            except NotFoundError:
                # Our registration expired with an old session: register again.
                await self._md.proxies.register(self._registration(owned))
            except BooklineError as exc:
                log.warning("could not report load: %s", exc)

    async def stop(self) -> None:
        """Stop within a bounded time, also with the bookies down: refuse new requests
        (503 UNAVAILABLE), answer the writes in flight (503 OUTCOME_UNKNOWN: their
        retries learn the outcome from the stream's next owner), release the owner
        records, close the writers (at most STOP_WRITERS_S), unregister, and close the
        ZooKeeper session -- whatever ephemeral node is left goes with it."""
        self._stopping = True
        await cancel_task(self._load_task)
        if self._kafka is not None:
            await self._kafka.stop()
        if self._ownership is not None:
            self._ownership.abort_all()
        try:
            if self._runner is not None:
                await self._runner.cleanup()
            if self._ownership is not None:
                await self._ownership.close(STOP_WRITERS_S)
            if self._md is not None:
                try:
                    await self._md.proxies.unregister(self.config.proxy_id)
                except BooklineError as exc:  # the session may be gone, and the node with it
                    log.warning("could not unregister: %s", exc)
        finally:
            if self._ns is not None:
                await self._ns.close()

    # The site listens before the ZooKeeper session is up (its URL, with the port picked
    # when ``port`` is 0, goes into the registration): requests in that window answer the
    # retriable 503 UNAVAILABLE, so clients wait or go elsewhere instead of failing.

    @property
    def ownership(self) -> Ownership:
        if self._stopping:
            raise UnavailableError("write proxy is shutting down; retry")
        if self._ownership is None:
            raise UnavailableError("write proxy is starting; retry")
        return self._ownership

    @property
    def ns(self) -> Namespace:
        if self._stopping:
            raise UnavailableError("write proxy is shutting down; retry")
        if self._ns is None:
            raise UnavailableError("write proxy is starting; retry")
        return self._ns

    # -- routes --------------------------------------------------------------------

    def build_app(self) -> web.Application:
        app = proxy_app(
            health=self.health,
            registry=self.metrics.registry,
            requests=self.metrics.requests,
            connections_closed=self.metrics.connections_closed,
            on_status=self.metrics.count_status,
            client_max_size=self.config.request_bytes_max,
            middlewares=[
                *auth_middlewares(self.config.auth()),  # none unless auth_enabled
                latency_middleware(self.metrics.request_seconds),
                *fault_middlewares(self.config),  # none unless a test asks
            ],
        )
        p = wire.API_PREFIX
        app.router.add_get(f"{p}/streams", self.list_streams)
        app.router.add_post(f"{p}/streams", self.create_stream)
        app.router.add_get(f"{p}/streams/{{name}}", self.describe)
        app.router.add_delete(f"{p}/streams/{{name}}", self.delete_stream)
        app.router.add_post(f"{p}/streams/{{name}}/records", self.write)
        app.router.add_post(f"{p}/streams/{{name}}/heartbeat", self.heartbeat)
        app.router.add_post(f"{p}/streams/{{name}}/truncate", self.truncate)
        app.router.add_post(f"{p}/streams/{{name}}/release", self.release)
        app.router.add_get(f"{p}/streams/{{name}}/owner", self.owner)
        register_topic_routes(app, self)  # topics and their partitions (writeproxy/topics.py)
        # consumer group coordinators (writeproxy/groups.py)
        self._groups = register_group_routes(app, self)
        check_rules(app)  # every route has an access rule (httpapi.auth)
        return app

    async def health(self, request: web.Request) -> web.Response:
        """State (:mod:`foundation.health`) and what the dashboard shows of this proxy:
        owned streams, in-flight load, write totals, hosted groups' lag."""
        ownership = self._ownership
        if self._stopping:
            state, why = State.STOPPING, "stopping"
        elif ownership is None:
            state, why = State.STARTING, "starting: connecting to ZooKeeper"
        elif self._md is None or self._md.zk.state is not SessionState.CONNECTED:
            state, why = State.DEGRADED, "ZooKeeper session suspended: writes wait"
        else:
            state, why = State.OK, "serving"
        return health_response(
            health_body(
                "writeproxy",
                self.config.proxy_id,
                state,
                why,
                proxy_id=self.config.proxy_id,
                url=self.url,
                owned_streams=len(ownership.owned) if ownership else 0,
                inflight_bytes=self.limiter.total_bytes,
                inflight_requests=self.limiter.total_requests,
                groups=[_group_view(s) for s in self._groups.stats()] if self._groups else [],
                **self.metrics.health_figures(),
            ),
            detail=sees_detail(request),  # group names and log lines: not for anyone
        )

    async def list_streams(self, request: web.Request) -> web.Response:
        return respond(request, {"streams": sorted(await self.ns.list_streams())})

    async def create_stream(self, request: web.Request) -> web.Response:
        body = await read_body(request)
        name = validate_name(body.get("name"), "stream name")
        require(request, "admin", "stream", name)
        await self.ns.create_stream(name)
        return respond(request, {"name": name}, status=201)

    async def describe(self, request: web.Request) -> web.Response:
        name = _stream(request)
        info = info_view(await self.ns.stream_info(name))
        info["owner"] = await self.ownership.owner_of(name)
        return respond(request, info)

    async def delete_stream(self, request: web.Request) -> web.Response:
        name = _stream(request)
        await self._redirect_unless_mine_or_free(name)
        await self.ownership.drop(name)
        await self.ns.delete_stream(name)
        return respond(request, {"deleted": name})

    async def _redirect_unless_mine_or_free(self, name: str) -> None:
        owner = await self.ownership.owner_of(name)
        if owner is not None and owner != self.url:
            raise OwnerMovedError(f"{name} is owned by {owner}", owner=owner)

    async def write(self, request: web.Request) -> web.Response:
        return await self.write_stream(request, _stream(request))

    async def write_stream(self, request: web.Request, name: str) -> web.Response:
        """A write to stream ``name`` (a topic partition's too: writeproxy.topics)."""
        cfg = self.config
        size = request.content_length or 0
        if size > cfg.request_bytes_max:
            raise TooLargeError(f"request of {size} bytes; at most {cfg.request_bytes_max}")
        # Admit on the declared size before reading the body: memory stays bounded.
        with self.core.admit(name, size) as admission:
            body = await read_body(request)
            req = writes.parse_write(body, records_max=cfg.request_records_max)
            result = await self.core.write(admission, _batch(name, req))
        media = wire.negotiate(request.headers.get("Accept"))
        answer = writes.write_answer(result.dlsns, media, result.duplicates, result.offsets)
        return web.Response(body=wire.encode_body(answer, media), content_type=media)

    async def heartbeat(self, request: web.Request) -> web.Response:
        name = _stream(request)
        stream = await self.ownership.get(name)
        await stream.writer.flush()
        last = stream.writer.last_dlsn
        return respond(
            request,
            {
                "owner": self.url,
                "last_dlsn": None if last is None else str(last),
                "time_ms": int(time.time() * 1000),
            },
        )

    async def truncate(self, request: web.Request) -> web.Response:
        name = _stream(request)
        body = await read_body(request)
        text = body.get("dlsn")
        if not isinstance(text, str):
            raise BadRequestError("truncate needs {'dlsn': 'seg:entry:slot'}")
        dlsn = DLSN(*parse_dlsn(text))
        stream = await self.ownership.get(name)
        await stream.writer.truncate(dlsn)
        return respond(request, {"truncated_before": str(dlsn)})

    async def release(self, request: web.Request) -> web.Response:
        name = _stream(request)
        await self._redirect_unless_mine_or_free(name)
        await self.ownership.drop(name)
        return respond(request, {"released": name})

    async def owner(self, request: web.Request) -> web.Response:
        name = _stream(request)
        return respond(request, {"owner": await self.ownership.owner_of(name)})


def _stream(request: web.Request) -> str:
    return validate_name(request.match_info["name"], "stream name")


def _group_view(stats: GroupStats) -> dict[str, Any]:
    return {
        "group": stats.group,
        "members": stats.members,
        "generation": stats.generation,
        "lag_records": sum(stats.lag.values()),
        "partitions": [
            {"topic": topic, "partition": p, "lag_records": lag}
            for (topic, p), lag in sorted(stats.lag.items())
        ],
    }


def _batch(name: str, req: writes.WriteRequest) -> WriteBatch:
    """The write core's batch of a request body: its lists, not copied."""
    producer = None
    if req.producer is not None and req.seq is not None:
        producer = ProducerSeq(req.producer, req.seq, req.epoch)
    if req.payloads is not None:
        return WriteBatch(name, producer, payloads=req.payloads, keys=req.keys)
    return WriteBatch(name, producer, records=req.records)


__all__ = ["WriteProxy"]
