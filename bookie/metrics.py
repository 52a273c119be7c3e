"""The bookie's Prometheus metrics and its ``/metrics`` + ``/health`` HTTP server.

The server calls :meth:`BookieMetrics.observe_request` per request and
:meth:`BookieMetrics.refresh` from its health loop (on the event loop thread, so the
storage is never touched from the HTTP thread). Each bookie owns its registry, so
several bookies can live in one test process. Every family is listed in
``docs/metrics.md``.

Storage figures come from the engine's optional ``stats()`` (a flat mapping
name -> number, read at refresh time) and are exported by :class:`StorageCollector`
as typed families: each counter of the engine is a ``..._total`` counter, each size or
count a gauge, with its unit in its name (:data:`STORAGE_FAMILIES`, one row per stat;
a test checks that every stat the engine reports has a row). Besides those:

* ``memtable_hits`` + ``read_cache_hits`` vs ``read_cache_misses`` ->
  ``bookline_bookie_read_cache_hit_ratio`` (reads answered from memory / reads);
* ``damaged_entries`` -> ``bookline_bookie_damaged_entries`` (entries held damaged,
  awaiting repair) and ``checksum_failures`` -> ``..._checksum_failures_total`` (every
  checksum failure met by reads, compaction and journal replay).

Journal fsync latency and group size are histograms fed by the journal thread through
:meth:`BookieMetrics.observe_journal_group` (prometheus_client metrics are thread-safe).

``/health`` answers the snapshot the event loop last published
(:meth:`BookieMetrics.publish_health`, every second); a snapshot older than
:data:`HEALTH_STALE_S` means the loop is stuck, and the bookie is reported down.

Both are open (scrapers and probes carry no credentials), so with auth on they show
what may name tenants' data -- ``/health``'s details and recent log lines, ``/metrics``'
families labelled by tenants' names -- only to a token allowed ``consume`` on the
cluster (:func:`foundation.auth.sees_detail`: admins, the services' own principal the
dashboard polls with); anyone else gets :func:`foundation.health.public_health` and
:class:`foundation.metrics.PublicMetrics` (issue 21, docs/security.md).
"""

from __future__ import annotations

import bisect
import itertools
import json
import logging
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from socketserver import ThreadingMixIn
from typing import Any, Final
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, make_wsgi_app
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from bookie.protocol import Op
from bookie.storage.api import DiskUsage
from foundation.auth import Authority, bearer, sees_detail
from foundation.health import State, health_body, http_status, public_health
from foundation.histograms import LATENCY_BUCKETS_S
from foundation.metrics import PublicMetrics, service_registry

log = logging.getLogger(__name__)

__all__ = ["STORAGE_FAMILIES", "BookieMetrics", "MetricsHttpServer", "StorageCollector"]

# READ_LAC long polls wait up to the bookie's cap (a minute) for the LAC to move.
_WAIT_BUCKETS_S: Final = (0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
# Every op of the wire protocol (a new op cannot be served without its metrics).
_OPS: Final = tuple(op.name for op in Op)
# /health reports the bookie down when its event loop published nothing for this long
# (the loop publishes every second; a checkpoint or GC pause is well under this).
HEALTH_STALE_S: Final = 10.0
# Why a connection was closed by a limit (bookie/server_connection.py): one connection
# too many, unfinished frames over the bookie's budget, idle or stalled too long.
LIMIT_CLOSE_REASONS: Final = (
    "connections_max",
    "buffered_bytes",
    "idle",
    "auth_timeout",
    "unauthenticated_max",
)


class _RequestStats:
    """Per-op request counts and latency histograms as plain ints, exported at scrape
    time. prometheus_client's Histogram takes a lock and scans buckets per observation;
    at 50k requests/s that is a measurable share of the bookie's CPU."""

    def __init__(self) -> None:
        self.buckets = LATENCY_BUCKETS_S
        self.bucket_counts = {op: [0] * (len(self.buckets) + 1) for op in _OPS}
        self.sums = dict.fromkeys(_OPS, 0.0)
        self.statuses: dict[tuple[str, str], int] = {}
        self.wait_counts = [0] * (len(_WAIT_BUCKETS_S) + 1)
        self.wait_sum = 0.0

    def observe_wait(self, seconds: float) -> None:
        self.wait_counts[bisect.bisect_left(_WAIT_BUCKETS_S, seconds)] += 1
        self.wait_sum += seconds

    def observe(self, op: str, status: str, seconds: float) -> None:
        self.bucket_counts[op][bisect.bisect_left(self.buckets, seconds)] += 1
        self.sums[op] += seconds
        key = (op, status)
        self.statuses[key] = self.statuses.get(key, 0) + 1

    def totals(self) -> dict[str, dict[str, float]]:
        """Per op: requests answered and the sum of their latencies (for /health, from
        which the dashboard draws rates and mean latencies)."""
        return {
            op: {"count": sum(self.bucket_counts[op]), "sum_seconds": self.sums[op]}
            for op in _OPS
            if self.sums[op] or any(self.bucket_counts[op])
        }

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
            "Time from decoded request to encoded response (a READ_LAC long poll's wait "
            "for the LAC excluded: bookline_bookie_long_poll_wait_seconds)",
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
        waits = HistogramMetricFamily(
            "bookline_bookie_long_poll_wait_seconds",
            "Time READ_LAC long polls waited for the LAC to move",
        )
        bounds = [*(repr(b) for b in _WAIT_BUCKETS_S), "+Inf"]
        cumulative = list(itertools.accumulate(list(self.wait_counts)))
        waits.add_metric([], list(zip(bounds, cumulative, strict=True)), sum_value=self.wait_sum)
        yield waits


@dataclass(frozen=True, slots=True)
class StorageFamily:
    """How one engine stat is exported: family name (a counter's without ``_total``),
    type, help, and an optional label (name, value) when several stats share a family."""

    name: str
    kind: str  # "counter" or "gauge"
    help: str
    label: tuple[str, str] | None = None


_C, _G = "counter", "gauge"
_READS = "bookline_bookie_storage_read_lookups"
_READS_HELP = "Entry lookups by where they were answered from"
_REJECTED = "bookline_bookie_storage_adds_rejected"
_REJECTED_HELP = "Adds the storage refused, by reason"

# Engine stat name -> its family; None: exported elsewhere (a histogram, a dedicated
# gauge) or not at all (a "last value" that a histogram shows better).
STORAGE_FAMILIES: Final[Mapping[str, StorageFamily | None]] = {
    "adds": StorageFamily("bookline_bookie_storage_adds", _C, "Entries added to storage"),
    "add_bytes": StorageFamily(
        "bookline_bookie_storage_added_bytes", _C, "Entry bytes added to storage"
    ),
    "adds_rejected_too_many": StorageFamily(
        _REJECTED, _C, _REJECTED_HELP, ("reason", "too_many_requests")
    ),
    "adds_rejected_read_only": StorageFamily(
        _REJECTED, _C, _REJECTED_HELP, ("reason", "read_only")
    ),
    "reads": StorageFamily("bookline_bookie_storage_reads", _C, "Entry reads served by storage"),
    "read_bytes": StorageFamily(
        "bookline_bookie_storage_read_bytes", _C, "Entry bytes read from storage"
    ),
    "memtable_hits": StorageFamily(_READS, _C, _READS_HELP, ("result", "memtable_hit")),
    "read_cache_hits": StorageFamily(_READS, _C, _READS_HELP, ("result", "read_cache_hit")),
    "read_cache_misses": StorageFamily(_READS, _C, _READS_HELP, ("result", "read_cache_miss")),
    "read_ahead_entries": StorageFamily(
        "bookline_bookie_storage_read_ahead_entries", _C, "Entries read ahead into the read cache"
    ),
    "checkpoints": StorageFamily("bookline_bookie_storage_checkpoints", _C, "Checkpoints done"),
    "checkpoint_entries": StorageFamily(
        "bookline_bookie_storage_checkpoint_entries",
        _C,
        "Entries written to entry logs by checkpoints",
    ),
    "checkpoint_seconds_total": StorageFamily(
        "bookline_bookie_storage_checkpoint_seconds", _C, "Time spent in checkpoints"
    ),
    "compacted_logs": StorageFamily(
        "bookline_bookie_storage_compacted_entry_logs", _C, "Entry logs compacted away"
    ),
    "compaction_bytes_reclaimed": StorageFamily(
        "bookline_bookie_storage_compaction_reclaimed_bytes",
        _C,
        "Disk bytes reclaimed by compaction",
    ),
    "deleted_ledgers": StorageFamily(
        "bookline_bookie_storage_deleted_ledgers", _C, "Ledgers deleted by garbage collection"
    ),
    "checksum_failures": StorageFamily(
        "bookline_bookie_checksum_failures",
        _C,
        "Checksum failures met in entry logs and the journal (reads, compaction, replay)",
    ),
    "journal_groups": StorageFamily("bookline_bookie_journal_groups", _C, "Journal group commits"),
    "journal_records": StorageFamily(
        "bookline_bookie_journal_records", _C, "Records written to the journal"
    ),
    "journal_bytes": StorageFamily(
        "bookline_bookie_journal_written_bytes", _C, "Bytes written to the journal"
    ),
    "journal_fsyncs": StorageFamily(
        "bookline_bookie_journal_fsyncs", _C, "Journal fdatasync calls"
    ),
    "journal_files_rolled": StorageFamily(
        "bookline_bookie_journal_files_rolled", _C, "Journal files rolled over"
    ),
    # The histograms bookline_bookie_journal_fsync_seconds / _group_records show these.
    "journal_group_entries": None,
    "journal_fsync_seconds": None,
    "journal_fsync_seconds_total": None,
    "journal_fsync_seconds_max": None,
    "memtable_bytes": StorageFamily("bookline_bookie_memtable_bytes", _G, "Bytes in the memtable"),
    "memtable_entries": StorageFamily(
        "bookline_bookie_memtable_entries", _G, "Entries in the memtable"
    ),
    "read_cache_bytes": StorageFamily(
        "bookline_bookie_read_cache_bytes", _G, "Bytes held by the read cache"
    ),
    "read_cache_entries": StorageFamily(
        "bookline_bookie_read_cache_entries", _G, "Entries held by the read cache"
    ),
    "ledgers": StorageFamily("bookline_bookie_ledgers", _G, "Ledgers with entries on this bookie"),
    "read_only": None,  # bookline_bookie_read_only, from the disk check
    "damaged_entries": StorageFamily(
        "bookline_bookie_damaged_entries",
        _G,
        "Entries held damaged on this bookie, awaiting repair by a recovery add",
    ),
}


class StorageCollector(Collector):
    """The engine's last stats snapshot as typed families (every family is exported,
    at 0 before the first snapshot). Stats without a row are logged once and skipped."""

    def __init__(self) -> None:
        self.stats: Mapping[str, float] = {}
        self._unknown_logged: set[str] = set()

    def collect(self) -> Iterator[Metric]:
        stats = self.stats  # replaced whole by refresh(): no torn reads
        families: dict[str, CounterMetricFamily | GaugeMetricFamily] = {}
        for stat, spec in STORAGE_FAMILIES.items():
            if spec is None:
                continue
            family = families.get(spec.name)
            if family is None:
                cls = CounterMetricFamily if spec.kind == _C else GaugeMetricFamily
                labels = [spec.label[0]] if spec.label else None
                family = families[spec.name] = cls(spec.name, spec.help, labels=labels)
            value = stats.get(stat, 0.0)
            family.add_metric([spec.label[1]] if spec.label else [], value)
        for stat in stats.keys() - STORAGE_FAMILIES.keys() - self._unknown_logged:
            self._unknown_logged.add(stat)
            log.warning("storage stat %r has no metric family (bookie/metrics.py)", stat)
        yield from families.values()


class BookieMetrics:
    """Counters and gauges of one bookie; owns its own registry."""

    def __init__(self) -> None:
        self.registry = service_registry()
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
        for fatal in ("true", "false"):
            self._bad_frames.labels(fatal)  # both series exist from the start, at 0
        self._connections = Gauge(
            "bookline_bookie_connections", "Open client connections", registry=r
        )
        self._limit_closes = Counter(
            "bookline_bookie_connections_closed",
            "Connections closed by a resource limit",
            ["reason"],
            registry=r,
        )
        for reason in LIMIT_CLOSE_REASONS:
            self._limit_closes.labels(reason)  # every series exists from the start, at 0
        self._buffered = Gauge(
            "bookline_bookie_buffered_bytes",
            "Bytes of unfinished frames held for all connections",
            registry=r,
        )
        self._read_only = Gauge(
            "bookline_bookie_read_only", "1 when the bookie is read-only", registry=r
        )
        self._disk_used = Gauge(
            "bookline_bookie_disk_used_ratio", "Used fraction of the fullest disk", registry=r
        )
        self._disk_free = Gauge(
            "bookline_bookie_disk_free_bytes", "Free bytes on the fullest disk", registry=r
        )
        self._fsync = Histogram(
            "bookline_bookie_journal_fsync_seconds",
            "Journal group commit: write + fdatasync latency",
            buckets=LATENCY_BUCKETS_S,
            registry=r,
        )
        self._group = Histogram(
            "bookline_bookie_journal_group_records",
            "Records per journal group commit",
            buckets=(1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 5000),
            registry=r,
        )
        self._hit_ratio = Gauge(
            "bookline_bookie_read_cache_hit_ratio", "Read cache hits / lookups", registry=r
        )
        self._storage = StorageCollector()
        r.register(self._storage)
        self._health: tuple[float, dict[str, Any]] = (
            time.monotonic(),
            health_body("bookie", "", State.STARTING, "starting"),
        )

    def observe_request(self, op: str, status: str, seconds: float) -> None:
        """One answered request (event loop thread)."""
        self._requests.observe(op, status, seconds)

    def observe_long_poll_wait(self, seconds: float) -> None:
        """A READ_LAC long poll's wait for the LAC (event loop thread)."""
        self._requests.observe_wait(seconds)

    def request_rejected(self) -> None:
        self._rejected.inc()

    def bad_frame(self, *, fatal: bool) -> None:
        self._bad_frames.labels("true" if fatal else "false").inc()

    def connection_opened(self) -> None:
        self._connections.inc()

    def connection_closed(self) -> None:
        self._connections.dec()

    def closed_by_limit(self, reason: str) -> None:
        """A connection closed by a limit: one of :data:`LIMIT_CLOSE_REASONS`."""
        self._limit_closes.labels(reason).inc()

    def set_buffered_bytes(self, value: int) -> None:
        self._buffered.set(value)

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
        self._storage.stats = numbers
        hits = numbers.get("memtable_hits", 0.0) + numbers.get("read_cache_hits", 0.0)
        lookups = hits + numbers.get("read_cache_misses", 0.0)
        if lookups > 0:
            self._hit_ratio.set(hits / lookups)

    # -- /health ----------------------------------------------------------------------

    def request_totals(self) -> dict[str, dict[str, float]]:
        return self._requests.totals()

    def publish_health(self, body: dict[str, Any]) -> None:
        """The body ``/health`` answers until the next call (event loop thread)."""
        self._health = (time.monotonic(), body)

    def health(self) -> tuple[int, dict[str, Any]]:
        """HTTP status and body of ``/health`` (HTTP thread)."""
        published, body = self._health
        age_s = time.monotonic() - published
        if age_s > HEALTH_STALE_S and body["state"] not in (State.DOWN, State.STOPPING):
            body = {
                **body,
                "state": State.DOWN.value,
                "status": State.DOWN.value,
                "why": f"event loop unresponsive: no health update for {age_s:.0f} s",
            }
        return http_status(State(body["state"])), body


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
        pass  # scrapes every few seconds would fill the log


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a hung scraper never holds up the bookie's exit


class MetricsHttpServer:
    """``/metrics`` (Prometheus text) and ``/health`` (JSON) on a thread of their own,
    so they answer while the event loop is busy; any other path is 404. With an
    ``authority`` (auth on) the detail only for a token allowed it (module docstring)."""

    def __init__(
        self, metrics: BookieMetrics, host: str, port: int, authority: Authority | None = None
    ) -> None:
        self._metrics = metrics
        self._authority = authority
        self._prometheus = make_wsgi_app(metrics.registry)
        public = CollectorRegistry(auto_describe=False)  # a registry: ?name[]= works too
        public.register(PublicMetrics(metrics.registry))
        self._public_prometheus = make_wsgi_app(public)
        self._httpd = make_server(host, port, self._app, _ThreadingServer, handler_class=_Quiet)
        self.port = int(self._httpd.server_address[1])
        self.host = host
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, name="bookie-metrics-http", daemon=True
        )
        self._thread.start()

    def _app(self, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path not in ("/metrics", "/health"):
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"not found: try /metrics or /health\n"]
        token = bearer(str(environ.get("HTTP_AUTHORIZATION", "")))
        detail = sees_detail(self._authority, token, time.time())
        if path == "/metrics":
            app = self._prometheus if detail else self._public_prometheus
            return app(environ, start_response)  # type: ignore[no-any-return]
        status, body = self._metrics.health()
        data = json.dumps(body if detail else public_health(body)).encode()
        reason = "OK" if status == 200 else "Service Unavailable"
        start_response(
            f"{status} {reason}",
            [("Content-Type", "application/json"), ("Content-Length", str(len(data)))],
        )
        return [data]

    @property
    def address(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5.0)
