"""What every service's Prometheus registry starts with (docs/metrics.md, "Every service").

* :func:`service_registry` -- a registry of its own (several services may share a test
  process) with the process, platform and garbage-collector collectors: CPU seconds,
  resident memory, open file descriptors, start time, ``python_info``, GC counts;
* ``_created`` series are off, process-wide: each counter and histogram would
  otherwise export a second series holding its creation time, doubling what is
  scraped for a figure no dashboard of ours uses (Prometheus >= 2.x does not need it).

Metric names follow Prometheus' conventions: ``bookline_<service>_<what>_<unit>``,
counters end in ``_total``, durations are ``_seconds``, sizes ``_bytes``, fractions
``_ratio``.
"""

from __future__ import annotations

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    disable_created_metrics,
)

from foundation.health import RecentErrors

__all__ = ["service_registry"]

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
    return registry
