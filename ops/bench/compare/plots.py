"""The PNG plots of ``bookline bench compare --plots DIR`` (matplotlib, Agg backend).

* ``compare_ack_cdf.png``, ``compare_e2e_<rate>_cdf.png``: latency distributions as
  CDFs (every run of a system merged; log-scaled milliseconds);
* ``compare_throughput.png``: batched, single pipelined and catch-up records/s per
  system (log scale), and 64 KiB MB/s against the disk's fsync'd bandwidth / 6.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

from ops.bench.compare.common import Latencies

LABELS: Final = {
    "bookline": "Bookline (core)",
    "bookline_thin": "Bookline (thin client)",
    "jetstream": "NATS JetStream (R3)",
    "redis": "Redis Streams (1 node)",
}
COLORS: Final = {
    "bookline": "#1f77b4",
    "bookline_thin": "#6baed6",
    "jetstream": "#2ca02c",
    "redis": "#d62728",
}
SHORT: Final = {
    "bookline": "Bookline core",
    "bookline_thin": "Bookline thin",
    "jetstream": "JetStream R3",
    "redis": "Redis",
}
#: Percentiles a CDF is drawn through (denser towards the tail).
_CDF_POINTS: Final = (
    [float(p) for p in range(1, 90)]
    + [90 + i * 0.1 for i in range(90)]
    + [99 + i * 0.01 for i in range(91)]
)


def _cdf(hist_text: str) -> tuple[list[float], list[float]]:
    lat = Latencies.decode(hist_text)
    xs = [lat.hist.get_value_at_percentile(p) / 1000.0 for p in _CDF_POINTS]
    return xs, [p / 100.0 for p in _CDF_POINTS]


def render(results: dict[str, Any], limits: dict[str, Any], out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    workloads = sorted(
        {w for per in results.values() for w in per if w == "ack" or w.startswith("e2e_")}
    )
    for workload in workloads:
        fig, ax = plt.subplots(figsize=(7, 4.2))
        for system, per in results.items():
            hist = per.get(workload, {}).get("hist")
            if hist:
                xs, ys = _cdf(hist)
                ax.plot(xs, ys, label=LABELS.get(system, system), color=COLORS.get(system))
        ax.set_xscale("log")
        ax.set_xlabel("latency, ms (log)")
        ax.set_ylabel("fraction of records")
        title = (
            "acknowledgement latency at 1,000 records/s"
            if workload == "ack"
            else f"end-to-end latency (write -> tailing reader) at {int(workload[4:]):,} records/s"
        )
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(loc="lower right")
        path = out_dir / f"compare_{workload}_cdf.png"
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)

    bars = [
        ("batched", "records_per_s", "batched"),
        ("pipelined", "records_per_s", "single pipelined"),
        ("catchup", "records_per_s", "catch-up read"),
    ]
    systems = list(results)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2), gridspec_kw={"width_ratios": [3, 1.3]})
    width = 0.8 / max(1, len(systems))
    for i, system in enumerate(systems):
        vals = [results[system].get(w, {}).get(k) or 0 for w, k, _ in bars]
        xs = [j + i * width for j in range(len(bars))]
        ax1.bar(xs, vals, width, label=LABELS.get(system, system), color=COLORS.get(system))
    ax1.set_xticks([j + width * (len(systems) - 1) / 2 for j in range(len(bars))])
    ax1.set_xticklabels([b[2] for b in bars])
    ax1.set_yscale("log")
    ax1.set_ylabel("records/s (100 B records, log)")
    ax1.set_title("throughput")
    ax1.grid(True, axis="y", which="both", alpha=0.3)
    ax1.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.1), ncol=4)
    large = [results[s].get("large", {}).get("mb_per_s") or 0 for s in systems]
    ax2.bar(range(len(systems)), large, color=[COLORS.get(s) for s in systems])
    disk = limits.get("seq_write_fsync_mb_per_s")
    if disk:
        ax2.axhline(disk / 6, color="black", linestyle="--", linewidth=1)
        ax2.text(-0.4, disk / 6, " disk / 6", va="bottom", fontsize=8)
    ax2.set_xticks(range(len(systems)))
    ax2.set_xticklabels([SHORT.get(s, s) for s in systems], rotation=20, fontsize=8)
    ax2.set_ylabel("MB/s")
    ax2.set_title("64 KiB records")
    fig.tight_layout()
    path = out_dir / "compare_throughput.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(path)
    return written
