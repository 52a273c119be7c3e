"""Raw disk limits of this machine, measured the way the journal uses the disk.

* sequential write bandwidth with an ``fdatasync`` after every chunk (what a group
  commit of that size costs);
* small-write ``fdatasync`` latency (the floor under any acknowledged add).

These bound what the bookie benchmarks can reach on the same disk; the bookie and
ledger figures in ``docs/benchmarks.md`` are quoted against them.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

# Enough data to get past the page cache's first burst, small enough for a quick run.
SEQ_BYTES_TOTAL = 256 << 20
SEQ_CHUNK_BYTES = 1 << 20
SMALL_WRITE_BYTES = 512
SMALL_WRITES = 2000


def _percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    index = min(len(sorted_values) - 1, round(q * (len(sorted_values) - 1)))
    return sorted_values[index]


def measure(directory: Path | None = None) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(dir=directory, prefix="bookline-disk-") as tmp:
        path = Path(tmp) / "probe"
        chunk = os.urandom(SEQ_CHUNK_BYTES)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            start = time.perf_counter()
            written = 0
            while written < SEQ_BYTES_TOTAL:
                written += os.write(fd, chunk)
                os.fdatasync(fd)
            seq_s = time.perf_counter() - start
        finally:
            os.close(fd)

        small = os.urandom(SMALL_WRITE_BYTES)
        latencies: list[float] = []
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            # Preallocate so we time fdatasync of data, not of growing metadata.
            os.posix_fallocate(fd, 0, SMALL_WRITE_BYTES * SMALL_WRITES)
            for _ in range(SMALL_WRITES):
                t0 = time.perf_counter()
                os.write(fd, small)
                os.fdatasync(fd)
                latencies.append((time.perf_counter() - t0) * 1000.0)
        finally:
            os.close(fd)
    latencies.sort()
    return {
        "bench": "disk",
        "seq_write_fsync_mb_per_s": round(SEQ_BYTES_TOTAL / seq_s / 1e6, 1),
        "seq_chunk_bytes": SEQ_CHUNK_BYTES,
        "fsync_small_p50_ms": round(statistics.median(latencies), 3),
        "fsync_small_p99_ms": round(_percentile(latencies, 0.99), 3),
        "fsyncs_per_s": round(1000.0 / statistics.mean(latencies), 1),
    }
