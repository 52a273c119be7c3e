"""The read proxy's Prometheus metrics, in one place (one registry per proxy).

``core_records`` / ``core_entries`` count what this proxy pulled from the core library
(each entry fetched once from the bookies); ``served_records`` counts what it handed to
clients. With many tailing readers of one stream the second grows N times faster than
the first: that is the shared cache at work.

It implements the read core's :class:`serving.read.metrics.ReadMetrics` with these
families. Besides its own families: the process collectors
(:func:`foundation.metrics.service_registry`) and the ledger layer's figures of its
readers (``bookline_ledger_*``, :class:`httpapi.monitoring.LedgerCollector`). Every
family is in ``docs/metrics.md``.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import Counter, Gauge, Histogram

from foundation.metrics import NAMED_SERIES_MAX, BoundedLabels, service_registry
from foundation.names import parse_internal
from httpapi.monitoring import REQUEST_BUCKETS_S, LedgerCollector, counter_value, histogram_totals
from httpapi.strict import CONNECTION_LIMITS
from ledger.metrics import PROCESS_LEDGER_METRICS


class ReadProxyMetrics:
    def __init__(self) -> None:
        self.registry = service_registry()
        r = self.registry
        self.requests = Counter(
            "bookline_readproxy_requests", "Requests answered", ["endpoint", "status"], registry=r
        )
        self.request_seconds = Histogram(
            "bookline_readproxy_request_seconds",
            "Time spent serving a request, by route (a long poll's wait for new records "
            "excluded: bookline_readproxy_long_poll_wait_seconds)",
            ["method", "endpoint"],
            buckets=REQUEST_BUCKETS_S,
            registry=r,
        )
        self.long_poll_wait_seconds = Histogram(
            "bookline_readproxy_long_poll_wait_seconds",
            "Time a request waited for new records (long polls, WebSocket tails), by route",
            ["method", "endpoint"],
            buckets=REQUEST_BUCKETS_S,
            registry=r,
        )
        self.connections_closed = Counter(
            "bookline_readproxy_connections_closed",
            "Connections closed by a limit: connections_max, body_timeout",
            ["reason"],
            registry=r,
        )
        for reason in CONNECTION_LIMITS:
            self.connections_closed.labels(reason)
        r.register(LedgerCollector(PROCESS_LEDGER_METRICS))
        self.core_records = Counter(
            "bookline_readproxy_core_records",
            "Records read through the core library",
            ["source"],
            registry=r,
        )
        self.core_entries = Counter(
            "bookline_readproxy_core_entries",
            "Distinct entries read through the core library",
            ["source"],
            registry=r,
        )
        self.served_records = Counter(
            "bookline_readproxy_served_records", "Records sent to clients", ["path"], registry=r
        )
        # per stream and per topic (bounded: foundation.metrics.BoundedLabels)
        self.stream_served = Counter(
            "bookline_readproxy_stream_served_records",
            f"Records sent to clients, by stream (the first {NAMED_SERIES_MAX} names; "
            "later ones as <other>)",
            ["stream"],
            registry=r,
        )
        self.topic_served = Counter(
            "bookline_readproxy_topic_served_records",
            f"Records sent to clients, by topic (the first {NAMED_SERIES_MAX} names; "
            "later ones as <other>)",
            ["topic"],
            registry=r,
        )
        self._stream_label = BoundedLabels()
        self._topic_label = BoundedLabels()
        self.feeds = Gauge("bookline_readproxy_feeds", "Shared tail feeds open", registry=r)
        self.subscribers = Gauge(
            "bookline_readproxy_subscribers", "Readers attached to feeds", registry=r
        )
        self.cache_bytes = Gauge(
            "bookline_readproxy_cache_bytes", "Bytes held by feeds' caches", registry=r
        )
        self.private_readers = Gauge(
            "bookline_readproxy_private_readers", "Private readers open", registry=r
        )
        self.websockets = Gauge("bookline_readproxy_websockets", "WebSocket tails open", registry=r)

    # -- the read core's reports (serving.read.metrics.ReadMetrics) ---------------------

    def count_core(self, source: str, *, records: int = 0, entries: int = 0) -> None:
        if records:
            self.core_records.labels(source).inc(records)
        if entries:
            self.core_entries.labels(source).inc(entries)

    def set_feeds(self, count: int) -> None:
        self.feeds.set(count)

    def set_cache_bytes(self, size: int) -> None:
        self.cache_bytes.set(size)

    def set_private_readers(self, count: int) -> None:
        self.private_readers.set(count)

    def add_subscribers(self, delta: int) -> None:
        self.subscribers.inc(delta)

    def count_served(self, path: str, name: str, records: int) -> None:
        """``records`` of stream ``name`` sent to a client by ``path`` (a topic's
        partition counts for its topic; a group's log for neither)."""
        self.served_records.labels(path).inc(records)
        internal = parse_internal(name)
        if internal is None:
            self.stream_served.labels(self._stream_label(name)).inc(records)
        elif internal[0] == "partition":
            self.topic_served.labels(self._topic_label(internal[1])).inc(records)

    def health_figures(self) -> dict[str, Any]:
        """Read totals for ``/health`` (the dashboard draws rates from them)."""
        return {
            "served_records": counter_value(self.served_records),
            "core_records": counter_value(self.core_records),
            "read_latency": histogram_totals(
                self.request_seconds,
                lambda labels: labels["endpoint"].endswith(("/records", "/recordsets")),
            ),
        }
