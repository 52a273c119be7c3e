"""The write proxy's Prometheus metrics, in one place (one registry per proxy)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

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
