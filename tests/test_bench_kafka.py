"""``bookline bench kafka`` at a tiny size (issue 25): its own local cluster with the
Kafka listener on, librdkafka's idempotent producer, a consumer reading every record
back, and the open-loop latency run; the figures are not judged here (a loaded machine
would make any threshold flaky), only that each workload ran to its end and is
reported."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_bench_kafka_runs_every_workload(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "ops.cli", "bench", "kafka", "--json", "--dir", str(tmp_path),
         "--records", "3000", "--rate", "200", "--seconds", "0.5"],
        cwd=ROOT, env=dict(os.environ), capture_output=True, text=True, timeout=280, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["bench"] == "kafka" and out["partitions"] == 6 and out["record_size"] == 100
    assert out["produce"]["records"] == 3000
    assert out["consume"]["records"] == 3000 + 6  # and one warm-up record per partition
    assert out["latency"]["records"] == out["latency"]["samples"] == 100
    for figure in ("produce_records_per_s", "consume_records_per_s", "ack_p50_ms",
                   "ack_p99_ms", "e2e_p50_ms", "e2e_p99_ms"):  # fmt: skip
        assert out[figure] > 0, figure
    assert out["ack_p50_ms"] <= out["ack_p99_ms"] and out["e2e_p50_ms"] <= out["e2e_p99_ms"]
    assert out["produce_proxy_cpu_us_per_record"] > 0  # its own cluster: local processes


def test_bench_kafka_phases_are_checked() -> None:
    """``--phases`` names phases of the bench; consume reads what produce wrote."""
    import argparse

    from ops.bench.kafka import PHASES, _phases

    assert _phases("latency") == {"latency"}
    assert _phases(" produce , consume ") == {"produce", "consume"}
    assert _phases(",".join(PHASES)) == set(PHASES)
    for bad in ("", "fetch", "consume", "latency,consume"):
        with pytest.raises(argparse.ArgumentTypeError):
            _phases(bad)
