"""``GET /v1/cluster``: the whole cluster in one JSON answer, for the dashboard.

Built from ZooKeeper and the services' own ``/health`` answers, at most once per
:data:`SUMMARY_TTL_S` however many dashboards poll (concurrent requests share one
build):

* ``bookies`` -- every bookie ZooKeeper knows of (registered, or with a cookie: a bookie
  that is down keeps its cookie), with its registration (writable / read-only / none)
  and what its ``/health`` says: state, why, disk, request totals. A bookie whose
  ``/health`` does not answer is ``down`` at once -- a ``kill -9`` shows within one
  poll, long before its ZooKeeper session expires;
* ``proxies`` -- the registered write and read proxies and their ``/health``;
* ``streams`` (user streams) and ``topics`` with segments, records and sizes (at most
  :data:`STREAMS_MAX` / :data:`TOPICS_MAX`; ``truncated`` says when there are more);
* ``groups`` -- the consumer groups the write proxies coordinate, with their lag;
* ``underreplicated_ledgers`` -- autorecovery's work items; ``autorecovery`` -- the
  elected auditor and whether re-replication is enabled; ``zookeeper`` -- this proxy's
  session and each server's mode (:mod:`readproxy.cluster_state`);
* ``totals`` -- cumulative counters (records written and served, their latencies,
  bookie ADD and READ requests): a poller's deltas give rates and mean latencies;
* ``recent_errors`` -- the newest WARNING+ log records of every service that answered.

Services show their ``/health`` details only to a token allowed them: the view presents
one of the services' own principal (``token``), minted with the proxy's secret.

Nothing here writes: the dashboard is read-only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any, Final

import aiohttp

from foundation import tls
from foundation.errors import BooklineError
from foundation.names import parse_internal
from groups.topics import TopicAdmin
from httpapi.proxy_config import READ_PROXY_PREFIX
from readproxy.cluster_state import autorecovery_state, zookeeper_state

if TYPE_CHECKING:
    from metadata.bookies import BookieInfo
    from metadata.client import MetadataClient
    from streams.namespace import Namespace

log = logging.getLogger(__name__)

__all__ = ["ClusterView"]

# A summary is rebuilt at most this often (every dashboard polls every 2 s).
SUMMARY_TTL_S: Final = 1.0
# A service's /health gets this long to answer before it is reported down.
HEALTH_TIMEOUT_S: Final = 1.5
# Streams and topics described per summary (each costs ZooKeeper reads and a LAC read).
STREAMS_MAX: Final = 50
TOPICS_MAX: Final = 20
# Concurrent stream/topic descriptions and health requests.
DESCRIBE_CONCURRENCY: Final = 8
# Recent errors kept in a summary, newest first.
RECENT_ERRORS_MAX: Final = 30
# Bookie ids remembered with their last health URL (a bookie whose registration expired
# and whose cookie was deleted is forgotten after this many).
REMEMBERED_BOOKIES_MAX: Final = 1024


class ClusterView:
    """Builds and caches the ``/v1/cluster`` answer of one read proxy."""

    def __init__(
        self,
        ns: Namespace,
        md: MetadataClient,
        own_health: Callable[[], dict[str, Any]],
        *,
        token: Callable[[], str | None] = lambda: None,
        zk_connect: str = "",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._ns = ns
        self._zk_connect = zk_connect  # the servers whose mode the summary shows
        self._md = md
        self._own_health = own_health
        self._clock = clock
        # a token other services show their /health details to (the services' own)
        self._token = token
        self._session: aiohttp.ClientSession | None = None
        self._cached: tuple[float, dict[str, Any]] | None = None
        self._building: asyncio.Future[dict[str, Any]] | None = None
        # bookie id -> base URL of its /health, from its last registration
        self._bookie_urls: dict[str, str] = {}

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def summary(self) -> dict[str, Any]:
        cached = self._cached
        if cached is not None and self._clock() - cached[0] < SUMMARY_TTL_S:
            return cached[1]
        if self._building is None:
            self._building = asyncio.ensure_future(self._build())
        building = self._building
        try:
            result = await asyncio.shield(building)
        finally:
            if building.done() and self._building is building:
                self._building = None
        self._cached = (self._clock(), result)
        return result

    # -- the parts -----------------------------------------------------------------

    async def _build(self) -> dict[str, Any]:
        bookies, proxies, streams, topics, (ur, recovery), zk = await asyncio.gather(
            self._bookies(), self._proxies(), self._streams(), self._topics(),
            self._autorecovery(), zookeeper_state(self._md, self._zk_connect),
        )  # fmt: skip
        healths = [b["health"] for b in bookies if b["health"]]
        healths += [p["health"] for p in proxies if p["health"]]
        writers = [p["health"] for p in proxies if p["kind"] == "writeproxy" and p["health"]]
        readers = [p["health"] for p in proxies if p["kind"] == "readproxy" and p["health"]]
        return {
            "time_ms": int(time.time() * 1000),
            "namespace": self._ns.name,
            "bookies": [{k: v for k, v in b.items() if k != "health"} for b in bookies],
            "proxies": [{k: v for k, v in p.items() if k != "health"} for p in proxies],
            "streams": streams,
            "topics": topics,
            "groups": [g for h in writers for g in h.get("groups", [])],
            "underreplicated_ledgers": ur,
            "autorecovery": recovery,
            "zookeeper": zk,
            "totals": _totals(bookies, writers, readers),
            "recent_errors": _recent_errors(healths),
        }

    async def _bookies(self) -> list[dict[str, Any]]:
        md = self._md
        infos: dict[str, BookieInfo] = await md.bookies.list_info()
        try:
            known = set(await md.zk.get_children(md.layout.cookies))
        except BooklineError:
            known = set()
        for bookie_id, info in infos.items():
            if info.http_address:
                self._bookie_urls[bookie_id] = info.http_address.removesuffix("/metrics")
        while len(self._bookie_urls) > REMEMBERED_BOOKIES_MAX:
            del self._bookie_urls[next(iter(self._bookie_urls))]
        ids = sorted(known | set(infos) | set(self._bookie_urls))

        async def one(bookie_id: str) -> dict[str, Any]:
            info = infos.get(bookie_id)
            url = self._bookie_urls.get(bookie_id)
            health, error = await self._health(url) if url else (None, "no health URL known")
            registered = info.state if info is not None else "no"
            if health is not None:
                state, why = str(health.get("state", "down")), _why(health)
            else:
                state = "down"
                why = error if info is not None else f"not registered; {error}"
            disk = (health or {}).get("disk") or (
                {
                    "used_ratio": info.disk_usage,
                    "free_bytes": info.free_bytes,
                    "total_bytes": info.total_bytes,
                }
                if info is not None
                else None
            )
            return {
                "id": bookie_id,
                "address": info.address if info is not None else (health or {}).get("address"),
                "registered": registered,
                "state": state,
                "why": why,
                "disk": disk,
                "connections": (health or {}).get("connections"),
                "requests": (health or {}).get("requests", {}),
                "health": health,
            }

        return list(await _bounded(one(b) for b in ids))

    async def _proxies(self) -> list[dict[str, Any]]:
        registered = await self._md.proxies.list()
        own = self._own_health()

        async def one(proxy_id: str, url: str) -> dict[str, Any]:
            kind = "readproxy" if proxy_id.startswith(READ_PROXY_PREFIX) else "writeproxy"
            short = proxy_id.removeprefix(READ_PROXY_PREFIX)
            health: dict[str, Any] | None
            if kind == "readproxy" and short == own.get("id"):
                health, error = own, ""
            else:
                health, error = await self._health(url)
            return {
                "id": short,
                "kind": kind,
                "url": url,
                "state": health.get("state", "down") if health else "down",
                "why": health.get("why", "") if health else error,
                "health": health,
            }

        return list(
            await _bounded(one(pid, info.address) for pid, info in sorted(registered.items()))
        )

    async def _streams(self) -> dict[str, Any]:
        names = [n for n in await self._ns.list_streams() if parse_internal(n) is None]

        async def one(name: str) -> dict[str, Any] | None:
            try:
                info = await self._ns.stream_info(name)
            except BooklineError as exc:  # deleted meanwhile, or its bookies are down
                return {"name": name, "error": exc.message}
            return {
                "name": name,
                "segments": len(info.segments),
                "records": info.record_count,
                "size_bytes": info.size_bytes,
                "end_offset": info.next_sequence_id,
                "last_dlsn": str(info.last_dlsn) if info.last_dlsn is not None else None,
            }

        shown = await _bounded(one(n) for n in names[:STREAMS_MAX])
        return {"total": len(names), "items": [s for s in shown if s is not None]}

    async def _topics(self) -> dict[str, Any]:
        admin = TopicAdmin(self._ns)
        names = await admin.list_topics()

        async def one(name: str) -> dict[str, Any]:
            try:
                info = await admin.describe_topic(name)
            except BooklineError as exc:
                return {"name": name, "error": exc.message}
            return {
                "name": name,
                "partitions": len(info.partitions),
                "segments": sum(p.segments for p in info.partitions),
                "records": info.record_count,
                "size_bytes": info.size_bytes,
                "end_offset": sum(p.end_offset for p in info.partitions),
            }

        return {
            "total": len(names),
            "items": list(await _bounded(one(n) for n in names[:TOPICS_MAX])),
        }

    async def _autorecovery(self) -> tuple[int | None, dict[str, Any]]:
        under, state = await asyncio.gather(self._under(), autorecovery_state(self._md))
        return under, state

    async def _under(self) -> int | None:
        try:
            return len(await self._md.underreplicated.list())
        except BooklineError as exc:
            log.warning("dashboard: could not count under-replicated ledgers: %s", exc)
            return None

    async def _health(self, base_url: str) -> tuple[dict[str, Any] | None, str]:
        """A service's /health answer (any status: a 503 carries state and why), or
        None and what went wrong."""
        if self._session is None:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=HEALTH_TIMEOUT_S),
                # https proxies' certificates chain to the [tls] CA, not the system's
                connector=aiohttp.TCPConnector(ssl=tls.client_context() or True),
            )
        token = self._token()
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        try:
            url = f"{base_url.rstrip('/')}/health"
            async with self._session.get(url, headers=headers) as resp:
                body = await resp.json(content_type=None)
        except aiohttp.ClientConnectorError as exc:
            return None, f"/health refused: {exc.os_error.strerror or exc.os_error}"
        except TimeoutError:
            return None, f"/health gave no answer within {HEALTH_TIMEOUT_S} s"
        except (aiohttp.ClientError, ValueError) as exc:
            return None, f"/health failed: {type(exc).__name__} {exc}".strip()
        if not isinstance(body, dict) or "state" not in body:
            return None, "/health answered something else"
        return body, ""


def _why(health: dict[str, Any]) -> str:
    """``why``, with the error a down service shows its detail readers (``error``)."""
    why, error = str(health.get("why", "")), health.get("error")
    return f"{why}: {error}" if error else why


async def _bounded(coros: Iterable[Awaitable[Any]]) -> list[Any]:
    """Run ``coros`` with at most DESCRIBE_CONCURRENCY at once; results in order."""
    limit = asyncio.Semaphore(DESCRIBE_CONCURRENCY)

    async def run(coro: Awaitable[Any]) -> Any:
        async with limit:
            return await coro

    return list(await asyncio.gather(*(run(c) for c in coros)))


def _sum(items: Iterable[dict[str, Any]], *path: str) -> float:
    total = 0.0
    for item in items:
        value: Any = item
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        if isinstance(value, int | float):
            total += value
    return total


def _totals(
    bookies: list[dict[str, Any]], writers: list[dict[str, Any]], readers: list[dict[str, Any]]
) -> dict[str, float]:
    up = [b for b in bookies if b["health"]]
    return {
        "records_written": _sum(writers, "records_written"),
        "payload_bytes_written": _sum(writers, "payload_bytes_written"),
        "write_count": _sum(writers, "write_latency", "count"),
        "write_seconds": _sum(writers, "write_latency", "sum_seconds"),
        "records_served": _sum(readers, "served_records"),
        "read_count": _sum(readers, "read_latency", "count"),
        "read_seconds": _sum(readers, "read_latency", "sum_seconds"),
        "bookie_adds": _sum(up, "requests", "ADD", "count"),
        "bookie_add_seconds": _sum(up, "requests", "ADD", "sum_seconds"),
        "bookie_reads": _sum(up, "requests", "READ", "count"),
        "bookie_read_seconds": _sum(up, "requests", "READ", "sum_seconds"),
    }


def _recent_errors(healths: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for health in healths:
        for err in health.get("recent_errors", []):
            with contextlib.suppress(AttributeError, TypeError):
                out.append({"service": health.get("service"), "id": health.get("id"), **err})
    out.sort(key=lambda e: e.get("time_ms", 0), reverse=True)
    return out[:RECENT_ERRORS_MAX]
