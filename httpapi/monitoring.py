"""Monitoring plumbing the services share: request latency per route, the ledger
layer's figures as Prometheus families, and the ``/health`` answer.

* :func:`latency_middleware` -- one histogram observation per request (never per
  record), labelled by method and route (``/v1/streams/{name}/records``: the pattern,
  so the label set stays bounded whatever the names). Time spent waiting for new data
  (a long poll, a WebSocket tail between records: :mod:`foundation.waits`) is not
  serving time: it goes to a second histogram, when the service keeps one;
* :class:`LedgerCollector` -- a :class:`~ledger.metrics.LedgerMetrics` exported at
  scrape time (``bookline_ledger_*``, and with ``autorecovery=True`` the
  ``bookline_autorecovery_*`` families that the replication workers count);
* :func:`health_response` -- a :mod:`foundation.health` body with its status (200 while
  serving, 503 otherwise); without ``detail`` only its public fields;
* :class:`PublicMetrics` -- a registry without the families labelled by tenants'
  names (:data:`TENANT_LABELS`), what ``/metrics`` serves to a scraper without a token
  allowed to see them (docs/security.md); from :mod:`foundation.metrics`, which the
  bookie's ``/metrics`` uses too.

Family names and meanings: ``docs/metrics.md``.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Final

from aiohttp import web
from aiohttp.typedefs import Middleware
from prometheus_client import Counter, Histogram
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from foundation.health import State, http_status, public_health
from foundation.histograms import LATENCY_BUCKETS_S
from foundation.metrics import TENANT_LABELS, PublicMetrics
from foundation.waits import request_waits
from ledger.metrics import LatencyHistogram, LedgerMetrics

__all__ = [
    "REQUEST_BUCKETS_S",
    "TENANT_LABELS",
    "LedgerCollector",
    "PublicMetrics",
    "counter_value",
    "health_response",
    "histogram_totals",
    "latency_middleware",
]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

# The proxies' request latencies: the one set (foundation.histograms).
REQUEST_BUCKETS_S: Final = LATENCY_BUCKETS_S


def route_label(request: web.Request) -> str:
    """The route's pattern (bounded label values), ``unmatched`` for a 404."""
    resource = request.match_info.route.resource
    return resource.canonical if resource is not None else "unmatched"


def latency_middleware(histogram: Histogram, waits: Histogram | None = None) -> Middleware:
    """Observe every request's serving time in ``histogram`` (labels: method,
    endpoint), errors included (the error middleware outside turns them into answers);
    with ``waits``, the time it waited for new data goes there (same labels; only
    requests that waited), not into ``histogram``."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        started = time.perf_counter()
        with request_waits() as waited:
            try:
                return await handler(request)
            finally:
                elapsed = time.perf_counter() - started
                labels = (request.method, route_label(request))
                if waits is None:  # waits not kept apart: the whole time
                    histogram.labels(*labels).observe(elapsed)
                else:
                    histogram.labels(*labels).observe(max(0.0, elapsed - waited.seconds))
                    if waited.seconds > 0:
                        waits.labels(*labels).observe(waited.seconds)

    return middleware


def health_response(body: dict[str, Any], *, detail: bool = True) -> web.Response:
    """``/health``: always JSON (a probe need not negotiate), 503 unless serving; only
    the public fields (:func:`foundation.health.public_health`) without ``detail``."""
    shown = body if detail else public_health(body)
    return web.json_response(shown, status=http_status(State(body["state"])))


def counter_value(counter: Counter) -> float:
    """The sum of a counter's ``_total`` samples (every label set)."""
    return sum(
        s.value for metric in counter.collect() for s in metric.samples if s.name.endswith("_total")
    )


def histogram_totals(
    histogram: Histogram, where: Callable[[dict[str, str]], bool] = lambda _labels: True
) -> dict[str, float]:
    """Observations and their sum over the label sets ``where`` accepts, as
    ``{"count", "sum_seconds"}`` (``/health`` figures: a reader's deltas give rates and
    mean latencies)."""
    count = total = 0.0
    for metric in histogram.collect():
        for s in metric.samples:
            if not where(s.labels):
                continue
            if s.name.endswith("_count"):
                count += s.value
            elif s.name.endswith("_sum"):
                total += s.value
    return {"count": count, "sum_seconds": total}


def _histogram(name: str, doc: str, hist: LatencyHistogram) -> HistogramMetricFamily:
    counts = list(hist.counts)  # copy first: the loop thread may add meanwhile
    bounds = [*(repr(b) for b in hist.buckets), "+Inf"]
    family = HistogramMetricFamily(name, doc)
    family.add_metric(
        [], list(zip(bounds, itertools.accumulate(counts), strict=True)), sum_value=hist.sum
    )
    return family


class LedgerCollector(Collector):
    """``bookline_ledger_*`` (and ``bookline_autorecovery_*``) from ``metrics``."""

    def __init__(self, metrics: LedgerMetrics, *, autorecovery: bool = False) -> None:
        self._m = metrics
        self._autorecovery = autorecovery

    def collect(self) -> Iterator[Metric]:
        m = self._m
        yield _histogram(
            "bookline_ledger_add_seconds",
            "Core writer add-to-ack: an entry's first send to its confirmation",
            m.add_seconds,
        )
        yield _histogram(
            "bookline_ledger_entry_read_seconds",
            "Entry reads from the bookies (catch-up, read ahead; speculation included)",
            m.entry_read_seconds,
        )
        counters: tuple[tuple[str, str, int], ...] = (
            (
                "bookline_ledger_ensemble_changes",
                "Ensembles replaced by writers",
                m.ensemble_changes,
            ),
            (
                "bookline_ledger_speculative_reads",
                "Replicas asked because the earlier ones were slow",
                m.speculative_reads,
            ),
            (
                "bookline_ledger_speculative_reads_won",
                "Speculative reads whose answer came first",
                m.speculative_reads_won,
            ),
            ("bookline_ledger_recoveries", "Ledgers recovered and closed", m.recoveries),
        )
        if self._autorecovery:
            counters += (
                (
                    "bookline_autorecovery_ledgers_replicated",
                    "Under-replicated ledgers repaired and cleared",
                    m.ledgers_replicated,
                ),
                (
                    "bookline_autorecovery_replication_failures",
                    "Repairs that failed (retried after a backoff)",
                    m.replication_failures,
                ),
                (
                    "bookline_autorecovery_entries_copied",
                    "Entry copies written by re-replication and repair",
                    m.entries_copied,
                ),
                (
                    "bookline_autorecovery_copied_bytes",
                    "Bytes of the entry copies written",
                    m.bytes_copied,
                ),
            )
        for name, doc, value in counters:
            yield CounterMetricFamily(name, doc, value=value)
