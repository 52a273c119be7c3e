"""The bookie's Prometheus metrics, in one place.

The server calls :meth:`BookieMetrics.observe_request` per request and
:meth:`BookieMetrics.refresh` from its health loop (on the event loop thread, so the
storage is never touched from the HTTP thread). Each bookie owns its registry, so
several bookies can live in one test process.

Storage figures come from the engine's optional ``stats()`` (a flat mapping
name -> number, read at refresh time): every entry is exported as
``bookline_bookie_storage{stat="<name>"}``, and these get dedicated series:

* ``memtable_bytes`` -> ``bookline_bookie_memtable_bytes``
* ``memtable_hits`` + ``read_cache_hits`` vs ``read_cache_misses`` ->
  ``..._read_cache_hit_ratio``
  (reads answered from memory / reads)
* ``damaged_entries`` -> ``bookline_bookie_damaged_entries`` (entries held damaged,
  awaiting repair) and ``checksum_failures`` -> ``..._checksum_failures_total`` (every
  checksum failure met by reads, compaction and journal replay)

Journal fsync latency and group size are histograms fed by the journal thread through
:meth:`BookieMetrics.observe_journal_group` (prometheus_client metrics are thread-safe).
"""

from __future__ import annotations

import bisect
import itertools
import logging
import threading
from collections.abc import Iterator, Mapping
from typing import Final
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric

from bookie.protocol import Op
from bookie.storage.api import DiskUsage

log = logging.getLogger(__name__)

__all__ = ["BookieMetrics", "MetricsHttpServer"]

# Request latencies span a cached read (~50 us) to a slow fsync (~100 ms).
_LATENCY_BUCKETS_S: Final = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.002,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    1.0,
    5.0,
)
# Every op of the wire protocol (a new op cannot be served without its metrics).
_OPS: Final = tuple(op.name for op in Op)


class _RequestStats:
    """Per-op request counts and latency histograms as plain ints, exported at scrape
    time. prometheus_client's Histogram takes a lock and scans buckets per observation;
    at 50k requests/s that is a measurable share of the bookie's CPU."""

    def __init__(self) -> None:
        self.buckets = _LATENCY_BUCKETS_S
        self.bucket_counts = {op: [0] * (len(self.buckets) + 1) for op in _OPS}
        self.sums = dict.fromkeys(_OPS, 0.0)
        self.statuses: dict[tuple[str, str], int] = {}

    def observe(self, op: str, status: str, seconds: float) -> None:
        self.bucket_counts[op][bisect.bisect_left(self.buckets, seconds)] += 1
        self.sums[op] += seconds
        key = (op, status)
        self.statuses[key] = self.statuses.get(key, 0) + 1

    def collect(self) -> Iterator[Metric]:
        # Runs on the HTTP thread: copy first (list/dict copies are atomic under the GIL).
        statuses = dict(self.statuses)
        requests = CounterMetricFamily(
            "bookline_bookie_requests", "Requests answered", labels=["op", "status"]
        )
        for (op, status), count in sorted(statuses.items()):
            requests.add_metric([op, status], count)
        yield requests
        latency = HistogramMetricFamily(
            "bookline_bookie_request_seconds",
            "Time from decoded request to encoded response",
            labels=["op"],
        )
        for op in _OPS:
            counts = list(self.bucket_counts[op])
            cumulative = list(itertools.accumulate(counts))
            bounds = [*(repr(b) for b in self.buckets), "+Inf"]
            latency.add_metric(
                [op], list(zip(bounds, cumulative, strict=True)), sum_value=self.sums[op]
            )
        yield latency


class _StorageCounters:
    """Counters kept by the storage engine, exported as Prometheus counters with the
    value of the last refresh (the engine counts; we only publish)."""

    def __init__(self) -> None:
        self.checksum_failures = 0.0

    def collect(self) -> Iterator[Metric]:
        yield CounterMetricFamily(
            "bookline_bookie_checksum_failures",
            "Checksum failures met in entry logs and the journal (reads, compaction, replay)",
            value=self.checksum_failures,
        )


class BookieMetrics:
    """Counters and gauges of one bookie; owns its own registry."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self._requests = _RequestStats()
        r.register(self._requests)
        self._rejected = Counter(
            "bookline_bookie_rejected_requests",
            "Requests refused with TOO_MANY_REQUESTS by the in-flight bound",
            registry=r,
        )
        self._bad_frames = Counter(
            "bookline_bookie_bad_frames", "Malformed frames received", ["fatal"], registry=r
        )
        self._connections = Gauge(
            "bookline_bookie_connections", "Open client connections", registry=r
        )
        self._read_only = Gauge(
            "bookline_bookie_read_only", "1 when the bookie is read-only", registry=r
        )
        self._disk_used = Gauge(
            "bookline_bookie_disk_used_fraction", "Used fraction of the fullest disk", registry=r
        )
        self._disk_free = Gauge(
            "bookline_bookie_disk_free_bytes", "Free bytes on the fullest disk", registry=r
        )
        self._fsync = Histogram(
            "bookline_bookie_journal_fsync_seconds",
            "Journal group commit: write + fdatasync latency",
            buckets=_LATENCY_BUCKETS_S,
            registry=r,
        )
        self._group = Histogram(
            "bookline_bookie_journal_group_records",
            "Records per journal group commit",
            buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 5000),
            registry=r,
        )
        self._memtable = Gauge(
            "bookline_bookie_memtable_bytes", "Bytes in the memtable", registry=r
        )
        self._hit_ratio = Gauge(
            "bookline_bookie_read_cache_hit_ratio", "Read cache hits / lookups", registry=r
        )
        self._storage = Gauge(
            "bookline_bookie_storage", "Raw storage engine stats", ["stat"], registry=r
        )
        self._damaged = Gauge(
            "bookline_bookie_damaged_entries",
            "Entries held damaged on this bookie, awaiting repair by a recovery add",
            registry=r,
        )
        self._storage_counters = _StorageCounters()
        r.register(self._storage_counters)

    def observe_request(self, op: str, status: str, seconds: float) -> None:
        """One answered request (event loop thread)."""
        self._requests.observe(op, status, seconds)

    def request_rejected(self) -> None:
        self._rejected.inc()

    def bad_frame(self, *, fatal: bool) -> None:
        self._bad_frames.labels("true" if fatal else "false").inc()

    def connection_opened(self) -> None:
        self._connections.inc()

    def connection_closed(self) -> None:
        self._connections.dec()

    def observe_journal_group(self, seconds: float, records: int, _bytes: int) -> None:
        """One group commit (called on the journal thread)."""
        self._fsync.observe(seconds)
        self._group.observe(records)

    def refresh(self, usage: DiskUsage, stats: Mapping[str, object]) -> None:
        """Copy the storage's current figures into the gauges (event loop thread)."""
        self._read_only.set(1 if usage.read_only else 0)
        self._disk_used.set(usage.used_fraction)
        self._disk_free.set(usage.free_bytes)
        numbers = {k: float(v) for k, v in stats.items() if isinstance(v, int | float)}
        for name, value in numbers.items():
            self._storage.labels(name).set(value)
        if "memtable_bytes" in numbers:
            self._memtable.set(numbers["memtable_bytes"])
        if "damaged_entries" in numbers:
            self._damaged.set(numbers["damaged_entries"])
        if "checksum_failures" in numbers:
            self._storage_counters.checksum_failures = numbers["checksum_failures"]
        hits = numbers.get("memtable_hits", 0.0) + numbers.get("read_cache_hits", 0.0)
        lookups = hits + numbers.get("read_cache_misses", 0.0)
        if lookups > 0:
            self._hit_ratio.set(hits / lookups)


class MetricsHttpServer:
    """``/metrics`` over prometheus_client's threaded HTTP server."""

    def __init__(self, metrics: BookieMetrics, host: str, port: int) -> None:
        self._httpd: WSGIServer
        self._thread: threading.Thread
        self._httpd, self._thread = start_http_server(port, addr=host, registry=metrics.registry)
        self.port = int(self._httpd.server_address[1])
        self.host = host

    @property
    def address(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5.0)
