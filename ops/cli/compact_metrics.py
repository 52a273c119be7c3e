"""The metrics of a ``bookline topic compact`` run, in a registry of their own.

Compaction runs as a job (:mod:`ops.cli.compact`), so there is no endpoint to scrape:
``--metrics-file`` writes this registry in Prometheus' text format for a node
exporter's textfile collector (Prometheus' way for batch jobs). Families are listed in
``docs/metrics.md`` ("Compaction job"), which a test keeps in step.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from streams.compaction import CompactionReport

__all__ = ["CompactionMetrics"]


class CompactionMetrics:
    def __init__(self) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.runs = Counter("bookline_compaction_runs", "compaction runs that finished",
                            ["topic"], registry=r)  # fmt: skip
        self.failures = Counter("bookline_compaction_failures", "compaction runs that failed",
                                ["topic"], registry=r)  # fmt: skip
        self.records = Counter("bookline_compaction_records_removed",
                               "records compaction removed (superseded or expired tombstones)",
                               ["topic"], registry=r)  # fmt: skip
        self.tombstones = Counter("bookline_compaction_tombstones_removed",
                                  "expired tombstones compaction removed", ["topic"],
                                  registry=r)  # fmt: skip
        self.bytes = Counter("bookline_compaction_reclaimed_bytes",
                             "stored bytes compaction reclaimed", ["topic"],
                             registry=r)  # fmt: skip
        self.segments = Counter("bookline_compaction_segments_rewritten",
                                "segments compaction rewrote into new ledgers", ["topic"],
                                registry=r)  # fmt: skip
        self.seconds = Gauge("bookline_compaction_last_run_seconds",
                             "how long the last run took", ["topic"], registry=r)  # fmt: skip

    def record(self, topic: str, report: CompactionReport, seconds: float) -> None:
        self.runs.labels(topic).inc()
        self.records.labels(topic).inc(report.records_removed)
        self.tombstones.labels(topic).inc(report.tombstones_removed)
        self.bytes.labels(topic).inc(max(0, report.bytes_reclaimed))
        self.segments.labels(topic).inc(report.segments_rewritten)
        self.seconds.labels(topic).set(seconds)

    def failed(self, topic: str) -> None:
        self.failures.labels(topic).inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
