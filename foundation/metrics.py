"""What every service's Prometheus registry starts with (docs/metrics.md, "Every service").

* :func:`service_registry` -- a registry of its own (several services may share a test
  process) with the process, platform and garbage-collector collectors: CPU seconds,
  resident memory, open file descriptors, start time, ``python_info``, GC counts;
* ``bookline_build_info`` -- 1, labelled with Bookline's version and the Python
  version, on every service (which build answers: the usual Prometheus info gauge);
* :class:`BoundedLabels` -- label values named by tenants (a stream, a topic) kept to
  a fixed number of series: the first :data:`NAMED_SERIES_MAX` names seen get a series
  each, every later one counts under :data:`OTHER` (a scrape's size stays bounded
  whatever the cluster holds);
* :class:`PublicMetrics` -- a registry's families but those labelled by tenants' names
  (:data:`TENANT_LABELS`): what every service's ``/metrics`` serves to a scraper without
  a token allowed to see them (docs/security.md);
* ``_created`` series are off, process-wide: each counter and histogram would
  otherwise export a second series holding its creation time, doubling what is
  scraped for a figure no dashboard of ours uses (Prometheus >= 2.x does not need it).

Metric names follow Prometheus' conventions: ``bookline_<service>_<what>_<unit>``,
counters end in ``_total``, durations are ``_seconds``, sizes ``_bytes``, fractions
``_ratio``.
"""

from __future__ import annotations

import platform
from collections.abc import Iterator
from typing import Final

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    disable_created_metrics,
)
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from foundation.health import RecentErrors
from foundation.version import __version__

__all__ = [
    "NAMED_SERIES_MAX",
    "OTHER",
    "TENANT_LABELS",
    "BoundedLabels",
    "PublicMetrics",
    "service_registry",
]

# Series per family labelled by a stream's or topic's name: a scrape stays small with
# thousands of streams; the busiest few are usually the first ones written.
NAMED_SERIES_MAX: Final = 100
# The label value every name past NAMED_SERIES_MAX counts under: never a stream's or a
# topic's name (names starting with "<" are reserved, foundation/names.py).
OTHER: Final = "<other>"
# Label names whose values are tenants' names (a group's lag by topic, ...).
TENANT_LABELS: Final = frozenset({"stream", "topic", "group", "partition", "name"})

disable_created_metrics()  # type: ignore[no-untyped-call]


def service_registry() -> CollectorRegistry:
    """A fresh registry with the process, platform and GC collectors registered (the
    same collector objects as prometheus_client's default registry: they hold no
    per-registry state). Also starts keeping the process's recent WARNING+ log records
    for ``/health`` (from the service's start, not its first health request)."""
    RecentErrors.installed()
    registry = CollectorRegistry(auto_describe=True)
    for collector in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
        registry.register(collector)
    registry.register(_BuildInfo())
    return registry


class _BuildInfo(Collector):
    def collect(self) -> Iterator[Metric]:
        info = GaugeMetricFamily(
            "bookline_build_info", "Bookline's build: 1, labelled", labels=["version", "python"]
        )
        info.add_metric([__version__, platform.python_version()], 1)
        yield info


class PublicMetrics(Collector):
    """The families of ``registry`` that no tenant label names (whole families are left
    out, so what is served stays a family's complete set of samples or nothing)."""

    def __init__(self, registry: Collector) -> None:
        self._registry = registry

    def collect(self) -> Iterator[Metric]:
        for family in self._registry.collect():
            if not any(TENANT_LABELS & sample.labels.keys() for sample in family.samples):
                yield family


class BoundedLabels:
    """Label values for names, at most ``series_max`` distinct ones: the first names
    seen keep their own value, later ones share :data:`OTHER`."""

    def __init__(self, series_max: int = NAMED_SERIES_MAX) -> None:
        self._max = series_max
        self._named: set[str] = set()

    def __call__(self, name: str) -> str:
        if name in self._named:
            return name
        if len(self._named) < self._max:
            self._named.add(name)
            return name
        return OTHER
