"""The latency buckets every histogram of Bookline uses, in one place (a leaf: no
Prometheus here, so the ledger layer's plain counters share them with the services'
Prometheus histograms).

One set for every latency (a bookie's request, a ledger add or entry read, a proxy's
HTTP request) so that figures of different layers line up bucket for bucket on a
dashboard, and a bound a query names (``le="0.005"``) exists in every family.
"""

from __future__ import annotations

from typing import Final

__all__ = ["LATENCY_BUCKETS_S"]

# From a memtable hit or a cached answer on loopback (~100 us) through a slow fsync
# (~100 ms) and a request timeout (seconds) to a long poll's wait (up to 30 s).
LATENCY_BUCKETS_S: Final = (
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
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)
