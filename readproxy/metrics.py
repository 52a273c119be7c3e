"""The read proxy's Prometheus metrics, in one place (one registry per proxy).

``core_records`` / ``core_entries`` count what this proxy pulled from the core library
(each entry fetched once from the bookies); ``served_records`` counts what it handed to
clients. With many tailing readers of one stream the second grows N times faster than
the first: that is the shared cache at work.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class ReadProxyMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "bookline_readproxy_requests", "Requests answered", ["endpoint", "status"], registry=r
        )
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
