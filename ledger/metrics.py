"""What the ledger layer counts: plain numbers, no Prometheus here.

The ledger client, its readers and writers, and autorecovery run inside other
processes (the proxies, ``bookline autorecovery``, an application using the core
library). They count into a :class:`LedgerMetrics` -- ints and bucket arrays, no locks,
no calls into a metrics library on the hot paths -- and the hosting service exports it
with a Prometheus collector (:class:`httpapi.monitoring.LedgerCollector`).

Every :class:`~ledger.env.LedgerEnv` carries one; by default the process-wide
:data:`PROCESS_LEDGER_METRICS`, so every client of a process adds to the same figures
(tests that want their own pass one to ``LedgerEnv.create``).

What is timed, per entry (never per record):

* ``add_seconds`` -- a writer's add-to-ack: from the entry's first send to its
  confirmation (Qa acknowledgements and every earlier entry confirmed);
* ``entry_read_seconds`` -- a reader's entry read from the bookies (catch-up and read
  ahead; speculative retries included; entries that came with a long poll excluded).
"""

from __future__ import annotations

import bisect
import collections
from typing import Final

from foundation.histograms import LATENCY_BUCKETS_S

__all__ = ["PROCESS_LEDGER_METRICS", "AddTimer", "LatencyHistogram", "LedgerMetrics"]


class LatencyHistogram:
    """Bucket counts and a sum as plain numbers (a bisect and two adds per observation;
    prometheus_client's Histogram takes a lock per call)."""

    __slots__ = ("buckets", "counts", "sum")

    def __init__(self, buckets: tuple[float, ...] = LATENCY_BUCKETS_S) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)  # the last one is +Inf
        self.sum = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, seconds)] += 1
        self.sum += seconds

    @property
    def count(self) -> int:
        return sum(self.counts)


class AddTimer:
    """One writer's entries in flight, by first-send time, for ``add_seconds``. Entries
    are pushed and confirmed in id order, so a deque is enough."""

    __slots__ = ("_histogram", "_pushed")

    def __init__(self, histogram: LatencyHistogram) -> None:
        self._histogram = histogram
        self._pushed: collections.deque[tuple[int, float]] = collections.deque()

    def pushed(self, entry_id: int, now: float) -> None:
        self._pushed.append((entry_id, now))

    def confirmed(self, lac: int, now: float) -> None:
        """Every entry up to ``lac`` is confirmed (a no-op when none was waiting)."""
        pushed = self._pushed
        while pushed and pushed[0][0] <= lac:
            self._histogram.observe(now - pushed.popleft()[1])


class LedgerMetrics:
    """Counters of one process's ledger clients and autorecovery (plain attributes:
    increment them directly; one event loop per process writes them)."""

    def __init__(self) -> None:
        # -- ledger clients
        self.add_seconds = LatencyHistogram()  # its count: entries confirmed
        self.entry_read_seconds = LatencyHistogram()
        self.ensemble_changes = 0  # new ensembles written by writers of this process
        self.speculative_reads = 0  # second (third...) replicas asked after a timeout
        self.speculative_reads_won = 0  # ...whose answer came first
        self.recoveries = 0  # ledgers this process recovered and closed
        # -- autorecovery
        self.ledgers_replicated = 0  # work items repaired and cleared
        self.replication_failures = 0  # repairs that failed (retried after a backoff)
        self.entries_copied = 0  # entry copies written by re-replication and repair
        self.bytes_copied = 0  # their bytes

    def add_timer(self) -> AddTimer:
        return AddTimer(self.add_seconds)


# The process's figures (see the module docstring).
PROCESS_LEDGER_METRICS: Final = LedgerMetrics()
