"""The write proxy's Prometheus metrics, in one place (one registry per proxy)."""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, Counter, Gauge


class WriteProxyMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "bookline_writeproxy_requests", "Requests answered", ["endpoint", "status"], registry=r
        )
        self.records_written = Counter(
            "bookline_writeproxy_records_written", "Records appended to streams", registry=r
        )
        self.bytes_written = Counter(
            "bookline_writeproxy_payload_bytes_written", "Payload bytes appended", registry=r
        )
        self.duplicates = Counter(
            "bookline_writeproxy_duplicate_records",
            "Retried records recognised and not written again",
            registry=r,
        )
        self.rejected = Counter(
            "bookline_writeproxy_rejected", "Requests refused with 429", registry=r
        )
        self.redirects = Counter(
            "bookline_writeproxy_redirects", "Requests redirected to the owner", registry=r
        )
        self.acquisitions = Counter(
            "bookline_writeproxy_acquisitions", "Streams acquired", registry=r
        )
        self.owned = Gauge("bookline_writeproxy_owned_streams", "Streams owned", registry=r)
        self.inflight_bytes = Gauge(
            "bookline_writeproxy_inflight_bytes", "Request bytes in flight", registry=r
        )
        self.inflight_requests = Gauge(
            "bookline_writeproxy_inflight_requests", "Write requests in flight", registry=r
        )

    def bind_gauges(
        self,
        owned: Callable[[], float],
        inflight_bytes: Callable[[], float],
        inflight_requests: Callable[[], float],
    ) -> None:
        self.owned.set_function(owned)
        self.inflight_bytes.set_function(inflight_bytes)
        self.inflight_requests.set_function(inflight_requests)
