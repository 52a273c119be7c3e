"""``/metrics`` and ``/health`` of ``bookline autorecovery --http-port N``.

``/metrics``: the process collectors, the ledger client's figures and the
``bookline_autorecovery_*`` families (docs/metrics.md): what the workers copied
(:class:`httpapi.monitoring.LedgerCollector`), what the auditor found
(:class:`AuditorCollector`) and the under-replicated ledgers, counted in ZooKeeper when
scraped (one children listing). ``/health``: :mod:`foundation.health`'s shape, ``down``
once a part (auditor, worker) stopped on an error (its text in ``error``, a detail).

Both are open (probes and scrapers carry no credentials). With ``[autorecovery]
auth_enabled`` (``bookline local`` and the deploy kit turn it on) ``/health``'s details
and recent log lines -- which can name streams: ledgers' metadata and the orphan
collector do -- and any family labelled by tenants' names go only to a token allowed
``consume`` on the cluster (:func:`foundation.auth.sees_detail`), as on the proxies and
bookies; anyone else learns whether autorecovery is up (docs/security.md).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Final

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from foundation.auth import Authority, bearer, load_authority, sees_detail
from foundation.errors import BooklineError
from foundation.health import State, health_body
from foundation.metrics import PublicMetrics, service_registry
from httpapi.monitoring import LedgerCollector, health_response
from metadata.zk import SessionState

if TYPE_CHECKING:
    from ledger.autorecovery import Autorecovery

log = logging.getLogger(__name__)

__all__ = ["AutorecoveryHttp"]

# A scrape waits at most this long for ZooKeeper's count of work items.
UNDERREPLICATED_TIMEOUT_S: Final = 5.0


class AuditorCollector(Collector):
    """The auditor's own counters (plain ints on :class:`ledger.auditor.Auditor`)."""

    def __init__(self, ar: Autorecovery) -> None:
        self._ar = ar

    def collect(self) -> Iterator[Metric]:
        a = self._ar.auditor
        yield GaugeMetricFamily(
            "bookline_autorecovery_auditor_leader",
            "1 while this instance is the elected auditor",
            value=1 if a.is_leader else 0,
        )
        yield CounterMetricFamily(
            "bookline_autorecovery_audits", "Scans for ledgers on lost bookies", value=a.audits
        )
        yield CounterMetricFamily(
            "bookline_autorecovery_ledgers_marked",
            "Ledgers marked under-replicated (lost bookies, replica check, damaged entries)",
            value=a.marked + a.replica_marked,
        )
        yield CounterMetricFamily(
            "bookline_autorecovery_replica_checks",
            "Full replica checks completed",
            value=a.replica_checks,
        )
        yield CounterMetricFamily(
            "bookline_autorecovery_orphan_ledgers_collected",
            "Ledgers a dead stream writer created in advance, deleted as orphans",
            value=a.orphans.collected,
        )


class AutorecoveryHttp:
    """The endpoints of one :class:`~ledger.autorecovery.Autorecovery`."""

    def __init__(self, ar: Autorecovery) -> None:
        """Loads the token secret and grants ``ar.config`` names (ConfigError at start
        for bad ones)."""
        self._ar = ar
        self._authority: Authority | None = load_authority(ar.config.auth())
        self.registry = service_registry()
        self._public = PublicMetrics(self.registry)
        self.registry.register(LedgerCollector(ar.client.env.metrics, autorecovery=True))
        self.registry.register(AuditorCollector(ar))
        self._underreplicated = Gauge(
            "bookline_autorecovery_underreplicated_ledgers",
            "Under-replicated ledgers waiting for repair (work items in ZooKeeper)",
            registry=self.registry,
        )
        self._last_count: int | None = None
        self._runner: web.AppRunner | None = None
        self.url = ""

    async def start(self, host: str, port: int) -> str:
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/health", self._health)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, host, port, reuse_address=True).start()
        bound = int(self._runner.addresses[0][1])
        self.url = f"http://{host}:{bound}"
        return self.url

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    async def _count(self) -> int | None:
        try:
            self._last_count = len(await self._ar.md.underreplicated.list())
        except BooklineError as exc:
            log.warning("could not count under-replicated ledgers: %s", exc)
        return self._last_count

    def _sees_detail(self, request: web.Request) -> bool:
        token = bearer(request.headers.get("Authorization", ""))
        return sees_detail(self._authority, token, time.time())

    async def _metrics(self, request: web.Request) -> web.Response:
        count = await self._count()
        if count is not None:
            self._underreplicated.set(count)
        shown = self.registry if self._sees_detail(request) else self._public
        resp = web.Response(body=generate_latest(shown))
        resp.headers["Content-Type"] = CONTENT_TYPE_LATEST
        return resp

    async def _health(self, request: web.Request) -> web.Response:
        ar = self._ar
        failed = ar.failed_part()
        error: dict[str, str] = {}
        if failed is not None:  # the part's error may name anything: a detail
            (why, text), state = failed, State.DOWN
            error = {"error": text} if text else {}
        elif ar.md.zk.state is not SessionState.CONNECTED:
            state, why = State.DEGRADED, "ZooKeeper session suspended"
        else:
            state, why = State.OK, "auditor" if ar.auditor.is_leader else "standing by"
        return health_response(
            health_body(
                "autorecovery",
                ar.instance_id,
                state,
                why,
                auditor_leader=ar.auditor.is_leader,
                underreplicated_ledgers=await self._count(),
                ledgers_replicated=ar.client.env.metrics.ledgers_replicated,
                **error,
            ),
            detail=self._sees_detail(request),
        )
