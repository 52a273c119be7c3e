"""``bookline bench compare``: the pure parts (medians, ratios, targets, the table) and
a seconds-long smoke of the whole command -- a Bookline cluster, a 3-node NATS
JetStream cluster and a Redis, every workload against each, plots drawn."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ops.bench.compare.common import Latencies
from ops.bench.compare.hops import histogram
from ops.bench.compare.run import _median, hop_table, ratios_and_targets, table

ROOT = Path(__file__).resolve().parents[1]


def _hist(*ms: float) -> str:
    lat = Latencies()
    for v in ms:
        lat.add_s(v / 1000.0)
    return lat.encode()


def test_median_of_runs_and_merged_histogram() -> None:
    runs = [
        {"records_per_s": 10.0, "p99_ms": 3.0, "p50_ms": 1.0, "hist": _hist(1, 3)},
        {"records_per_s": 30.0, "p99_ms": 1.0, "p50_ms": 1.0, "hist": _hist(1)},
        {"records_per_s": 20.0, "p99_ms": 2.0, "p50_ms": 1.0, "hist": _hist(2), "load_avg": 1.5},
    ]
    out = _median(runs)
    assert out["records_per_s"] == 20.0
    assert out["p99_ms"] == 2.0
    assert out["runs"] == [3.0, 1.0, 2.0]  # latency workloads list their p99s
    assert out["load_avg"] == [None, None, 1.5]
    assert Latencies.decode(out["hist"]).count == 4


def test_ratios_and_targets_follow_the_issue() -> None:
    results = {
        "bookline": {
            "batched": {"records_per_s": 500_000.0},
            "pipelined": {"records_per_s": 100_000.0},
            "ack": {"p99_ms": 3.0},
            "e2e_1000": {"p99_ms": 6.0},
            "e2e_10000": {"p99_ms": 9.0},
            "catchup": {"records_per_s": 700_000.0},
            "large": {"mb_per_s": 140.0},
        },
        "jetstream": {
            "batched": {"records_per_s": 25_000.0},
            "pipelined": {"records_per_s": 60_000.0},
            "ack": {"p99_ms": 4.0},
            "e2e_1000": {"p99_ms": 5.0},
            "e2e_10000": {"p99_ms": 5.0, "sustained": False},
            "catchup": {"records_per_s": 100_000.0},
        },
        "redis": {"batched": {"records_per_s": 100_000.0}},
    }
    ratios, targets = ratios_and_targets(
        results, {"seq_write_fsync_mb_per_s": 1200.0}, (1000.0, 10000.0)
    )
    assert ratios["bookline_over_jetstream"]["batched_records_per_s"] == 20.0
    assert ratios["bookline_large_over_disk_sixth"] == 0.7
    met = {k: v["met"] for k, v in targets.items()}
    assert met == {
        "batched_vs_jetstream": True,
        "batched_vs_redis": True,
        "pipelined_vs_jetstream": False,  # 1.67x, 2x wanted
        "ack_p99_vs_jetstream": True,
        "e2e_1000_p99_vs_jetstream": False,  # 1.2x the peer's p99
        "e2e_10000_p99_vs_jetstream": True,  # 1.8x, within 2x
        "catchup_vs_jetstream": True,
        "large_vs_disk_sixth": True,
    }
    assert "did not sustain" in targets["e2e_10000_p99_vs_jetstream"]["note"]
    rows = table(results, ["bookline", "jetstream", "redis"]).splitlines()
    assert rows[0] == "| workload | bookline | jetstream | redis |"
    assert "| batched, records/s | 500,000 | 25,000 | 100,000 |" in rows


def test_hop_split_reads_the_services_histograms_and_medians_per_hop() -> None:
    """The hop split (issue 26) takes its means from the services' own /metrics: a
    label value holding braces (a route) is still one series."""
    text = (
        'bookline_writeproxy_request_seconds_sum{endpoint="/v1/streams/{name}/records",'
        'method="POST"} 0.25\n'
        'bookline_writeproxy_request_seconds_count{endpoint="/v1/streams/{name}/records",'
        'method="POST"} 1.0\n'
        'bookline_writeproxy_request_seconds_sum{endpoint="/v1/streams",method="GET"} 9\n'
        "bookline_bookie_journal_fsync_seconds_sum 2.0\n"
        "bookline_bookie_journal_fsync_seconds_count 4\n"
    )
    assert histogram(text, "bookline_writeproxy_request_seconds", 'method="POST"') == (0.25, 1.0)
    assert histogram(text, "bookline_bookie_journal_fsync_seconds", "") == (2.0, 4.0)
    runs = [
        {"p99_ms": 3.0, "hops_ms": {"ack_ms": 1.0, "fsync_ms": 0.2},
         "cpu_us_per_record": {"bookies": 100.0},
         "run_queue_us_per_record": {"bookies": 10.0, "total": 10.0}},
        {"p99_ms": 4.0, "hops_ms": {"ack_ms": 3.0, "fsync_ms": 0.4},
         "cpu_us_per_record": {"bookies": 300.0},
         "run_queue_us_per_record": {"bookies": 30.0, "total": 30.0}},
    ]  # fmt: skip
    med = _median(runs)
    assert med["hops_ms"] == {"ack_ms": 2.0, "fsync_ms": 0.3}
    assert med["cpu_us_per_record"] == {"bookies": 200.0}
    assert med["run_queue_us_per_record"] == {"bookies": 20.0, "total": 20.0}
    lines = hop_table({"bookline": {"e2e_1000": med}}).splitlines()
    assert lines[0].startswith("| system, workload | ack_ms |")
    assert lines[0].endswith("| run queue µs/rec total |")
    assert lines[2].startswith("| bookline e2e_1000 | 2 |")
    assert lines[2].endswith("| 20 |")


@pytest.mark.integration
@pytest.mark.timeout(240)
def test_compare_smoke_runs_every_system_and_workload(tmp_path: Path) -> None:
    plots = tmp_path / "plots"
    proc = subprocess.run(
        [sys.executable, "-m", "ops.cli", "bench", "compare", "--smoke", "--json",
         "--dir", str(tmp_path / "state"), "--plots", str(plots)],
        cwd=ROOT, env=dict(os.environ), capture_output=True, text=True, timeout=220, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["bench"] == "compare" and out["smoke"] is True
    assert out["skipped"] == {}, "peers come with ops/setup.sh"
    workloads = {"batched", "catchup", "pipelined", "ack", "e2e_200", "large"}
    for system in (out["bookline"], out["bookline"]["thin_client"], out["jetstream"], out["redis"]):
        assert workloads <= set(system), sorted(system)
        assert system["batched"]["records_per_s"] > 0
        assert system["catchup"]["records_per_s"] > 0
        assert system["e2e_200"]["p99_ms"] > 0
        assert system["ack"]["sustained"] is True
    for system in (out["bookline"], out["bookline"]["thin_client"]):  # issue 26: per hop
        e2e = system["e2e_200"]
        assert {"ack_ms", "ack_to_reader_ms", "writer_add_ms", "bookie_add_ms", "fsync_ms"} <= set(
            e2e["hops_ms"]
        ), e2e["hops_ms"]
        assert {"bookies", "client", "reader"} <= set(e2e["cpu_us_per_record"])
        assert {"bookies", "client", "reader"} <= set(e2e["run_queue_us_per_record"])
    assert "proxy_request_ms" in out["bookline"]["thin_client"]["ack"]["hops_ms"]
    assert "write_proxy" in out["bookline"]["thin_client"]["ack"]["cpu_us_per_record"]
    assert out["limits"]["seq_write_fsync_mb_per_s"] > 0
    assert out["limits"]["fsync_small_p50_ms"] > 0
    assert set(out["targets"]) >= {"batched_vs_jetstream", "catchup_vs_jetstream"}
    assert out["ratios"]["bookline_over_jetstream"]["batched_records_per_s"] > 0
    assert {p.name for p in plots.iterdir()} == {
        "compare_ack_cdf.png",
        "compare_e2e_200_cdf.png",
        "compare_throughput.png",
    }
    # Every server it started (their configs and data live under tmp_path) is gone.
    ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True, check=True).stdout
    assert str(tmp_path) not in ps
