"""The write proxy's Prometheus metrics, in one place (one registry per proxy); also
what its write core reports (:class:`serving.write.metrics.WriteMetrics`).

Besides its own families (``bookline_writeproxy_*``, ``bookline_group_*``): the
process collectors (:func:`foundation.metrics.service_registry`) and the ledger layer's
figures of its core writers (``bookline_ledger_*``,
:class:`httpapi.monitoring.LedgerCollector`). Every family is in ``docs/metrics.md``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from foundation.metrics import NAMED_SERIES_MAX, BoundedLabels, service_registry
from foundation.names import parse_internal
from httpapi.monitoring import REQUEST_BUCKETS_S, LedgerCollector, counter_value, histogram_totals
from httpapi.strict import CONNECTION_LIMITS
from ledger.metrics import PROCESS_LEDGER_METRICS

if TYPE_CHECKING:
    from groups.coordinator import GroupStats


class GroupCollector(Collector):
    """The consumer groups this proxy coordinates, read at scrape time from the
    coordinators' cached offsets (no I/O on a scrape):

    * ``bookline_group_lag_records{group,topic,partition}`` -- end offset minus the
      committed offset (minus the start offset when nothing is committed);
    * ``bookline_group_members{group}``, ``bookline_group_generation{group}``;
    * ``bookline_group_rebalances_total{group}`` -- generation bumps since this proxy
      took the group over (a counter that starts again on the next coordinator).
    """

    def __init__(self, source: Callable[[], Iterable[GroupStats]]) -> None:
        self._source = source

    def collect(self) -> Iterator[Metric]:
        lag = GaugeMetricFamily(
            "bookline_group_lag_records",
            "Records not yet consumed: end offset - committed offset",
            labels=["group", "topic", "partition"],
        )
        members = GaugeMetricFamily(
            "bookline_group_members", "Live members of the group", labels=["group"]
        )
        generation = GaugeMetricFamily(
            "bookline_group_generation", "The group's generation", labels=["group"]
        )
        rebalances = CounterMetricFamily(
            "bookline_group_rebalances",
            "Generation bumps since this proxy coordinates the group",
            labels=["group"],
        )
        for stats in self._source():
            g = stats.group
            members.add_metric([g], stats.members)
            generation.add_metric([g], stats.generation)
            rebalances.add_metric([g], stats.rebalances)
            for (topic, p), value in sorted(stats.lag.items()):
                lag.add_metric([g, topic, str(p)], value)
        yield from (lag, members, generation, rebalances)

    def describe(self) -> Iterator[Metric]:
        return iter(())  # no samples at registration: the families depend on the groups


class _Counted(Collector):
    """Counters kept as plain ints (one add per acquisition), read at scrape time."""

    def __init__(self) -> None:
        self.acquisitions = 0
        self.takeover_scan_records = 0

    def collect(self) -> Iterator[Metric]:
        yield CounterMetricFamily(
            "bookline_writeproxy_acquisitions",
            "Streams acquired (owner record, writer lock, recovery of the last segment)",
            value=self.acquisitions,
        )
        yield CounterMetricFamily(
            "bookline_writeproxy_takeover_scan_records",
            "Records read back at acquisitions to rebuild the producers' dedup tables",
            value=self.takeover_scan_records,
        )


class WriteProxyMetrics:
    def __init__(self) -> None:
        self.registry = service_registry()
        r = self.registry
        self.requests = Counter(
            "bookline_writeproxy_requests", "Requests answered", ["endpoint", "status"], registry=r
        )
        self.request_seconds = Histogram(
            "bookline_writeproxy_request_seconds",
            "Time to answer a request, by route",
            ["method", "endpoint"],
            buckets=REQUEST_BUCKETS_S,
            registry=r,
        )
        self.records_written = Counter(
            "bookline_writeproxy_records_written", "Records appended to streams", registry=r
        )
        # per stream and per topic (bounded: foundation.metrics.BoundedLabels)
        self.stream_records = Counter(
            "bookline_writeproxy_stream_records",
            f"Records appended, by stream (the first {NAMED_SERIES_MAX} names; "
            "later ones as <other>)",
            ["stream"],
            registry=r,
        )
        self.topic_records = Counter(
            "bookline_writeproxy_topic_records",
            f"Records appended, by topic (the first {NAMED_SERIES_MAX} names; "
            "later ones as <other>)",
            ["topic"],
            registry=r,
        )
        self._stream_label = BoundedLabels()
        self._topic_label = BoundedLabels()
        self.bytes_written = Counter(
            "bookline_writeproxy_payload_bytes_written", "Payload bytes appended", registry=r
        )
        self.duplicates = Counter(
            "bookline_writeproxy_duplicate_records",
            "Retried records recognised and not written again",
            registry=r,
        )
        self.rejected = Counter(
            "bookline_writeproxy_rejected_requests",
            "Requests refused: 413 too_large, 429 overloaded",
            ["reason"],
            registry=r,
        )
        for reason in ("too_large", "overloaded"):
            self.rejected.labels(reason)  # both series exist from the start, at 0
        self.connections_closed = Counter(
            "bookline_writeproxy_connections_closed",
            "Connections closed by a limit: connections_max, body_timeout",
            ["reason"],
            registry=r,
        )
        for reason in CONNECTION_LIMITS:
            self.connections_closed.labels(reason)
        self.redirects = Counter(
            "bookline_writeproxy_redirects", "Requests redirected to the owner", registry=r
        )
        self._counted = _Counted()
        r.register(self._counted)
        r.register(LedgerCollector(PROCESS_LEDGER_METRICS))
        self.owned = Gauge("bookline_writeproxy_owned_streams", "Streams owned", registry=r)
        self.inflight_bytes = Gauge(
            "bookline_writeproxy_inflight_bytes", "Request bytes in flight", registry=r
        )
        self.inflight_requests = Gauge(
            "bookline_writeproxy_inflight_requests", "Write requests in flight", registry=r
        )

    def bind_groups(self, source: Callable[[], Iterable[GroupStats]]) -> None:
        """Export the coordinated groups (:class:`GroupCollector`); once per proxy."""
        self.registry.register(GroupCollector(source))

    def bind_gauges(
        self,
        owned: Callable[[], float],
        inflight_bytes: Callable[[], float],
        inflight_requests: Callable[[], float],
    ) -> None:
        self.owned.set_function(owned)
        self.inflight_bytes.set_function(inflight_bytes)
        self.inflight_requests.set_function(inflight_requests)

    # -- what the write core reports (serving.write.metrics.WriteMetrics) -------------

    def stream_acquired(self, scan_records: int) -> None:
        self._counted.acquisitions += 1
        self._counted.takeover_scan_records += scan_records

    def batch_written(self, stream: str, records: int, payload_bytes: int, duplicates: int) -> None:
        self.count_written(stream, records)
        self.bytes_written.inc(payload_bytes)
        self.duplicates.inc(duplicates)

    def health_figures(self) -> dict[str, Any]:
        """Write totals for ``/health`` (the dashboard draws rates from them)."""
        return {
            "records_written": counter_value(self.records_written),
            "payload_bytes_written": counter_value(self.bytes_written),
            "write_latency": histogram_totals(
                self.request_seconds,
                lambda labels: (
                    labels["endpoint"].endswith("/records") and labels["method"] == "POST"
                ),
            ),
        }

    def count_written(self, name: str, records: int) -> None:
        """``records`` appended to stream ``name`` (a topic's partition counts for its
        topic; a group's log for neither)."""
        self.records_written.inc(records)
        internal = parse_internal(name)
        if internal is None:
            self.stream_records.labels(self._stream_label(name)).inc(records)
        elif internal[0] == "partition":
            self.topic_records.labels(self._topic_label(internal[1])).inc(records)

    def count_status(self, status: int) -> None:
        """Refusals and redirects, from every answer's status."""
        if status == 429:
            self.rejected.labels("overloaded").inc()
        elif status == 413:
            self.rejected.labels("too_large").inc()
        elif status == 307:
            self.redirects.inc()
