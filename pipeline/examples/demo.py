"""``bookline pipeline demo``: the example pipeline end to end on a local cluster.

1. start ZooKeeper + 3 bookies under ``DIR/cluster`` (or use ``--cluster``);
2. write ``--records`` access logs over ``--minutes`` minutes into ``access-logs``;
3. run the streaming job (``maxRecordsPerTrigger``) until it has read everything and
   emitted the last minute, into the
   ``access-stats`` stream and Parquet under ``DIR/out``;
4. replay the whole history with the batch job and check that it agrees with what the
   streaming job wrote;
5. stop Spark and the cluster (also on failure).

Returns a summary dict (printed as JSON by the CLI).
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from foundation.errors import InvariantViolation
from pipeline.examples import accesslogs, jobs

log = logging.getLogger(__name__)

__all__ = ["DemoSettings", "run"]

# 2026-01-01T00:00:00Z: a fixed start makes the demo's minutes reproducible.
DEMO_START_MS = 1_767_225_600_000
SEED = 7
# The streaming job must have read everything within this long.
STREAMING_TIMEOUT_S = 300.0


@dataclass(frozen=True, slots=True)
class DemoSettings:
    dir: Path  # state: cluster data, checkpoints, Parquet output
    records: int = 20_000  # access logs to generate
    minutes: int = 10  # event-time span of the logs
    max_records_per_trigger: int = 5_000  # admission control of the streaming job
    logs_stream: str = "access-logs"
    results_stream: str = "access-stats"


def _rows(df: Any) -> list[tuple[Any, ...]]:
    return sorted(tuple(r) for r in df.collect())


def _run_pipeline(
    spark: Any, options: dict[str, str], s: DemoSettings, run_dir: Path
) -> dict[str, Any]:
    from streams.sync import SyncNamespace

    ns = SyncNamespace.from_cluster_file(options["cluster"])
    try:
        logs = list(
            accesslogs.generate(s.records, seed=SEED, start_ms=DEMO_START_MS, minutes=s.minutes)
        )
        logs.append(accesslogs.flush_line(logs[-1].time_ms if logs else DEMO_START_MS))
        t0 = time.perf_counter()
        written = accesslogs.write_logs(ns, s.logs_stream, iter(logs))
        write_s = time.perf_counter() - t0
    finally:
        ns.close()

    t0 = time.perf_counter()
    queries = jobs.start_streaming(
        spark,
        options,
        logs_stream=s.logs_stream,
        results_stream=s.results_stream,
        out_dir=run_dir / "out",
        checkpoint_dir=run_dir / "checkpoints",
        available_now=False,
        max_records_per_trigger=s.max_records_per_trigger,
    )
    batches = jobs.stop_when_caught_up(queries, written, STREAMING_TIMEOUT_S)
    stream_s = time.perf_counter() - t0

    streamed = spark.read.parquet(str(run_dir / "out" / "status_counts")).select(
        "minute", "status", "count"
    )
    t0 = time.perf_counter()
    replayed = jobs.replay_status_counts(spark, options, s.logs_stream)
    replay_rows = _rows(replayed)
    replay_s = time.perf_counter() - t0
    stream_rows = _rows(streamed)
    if stream_rows != replay_rows:
        raise InvariantViolation(
            f"streaming and batch results differ: {len(stream_rows)} vs {len(replay_rows)} rows"
        )
    results = (
        spark.read.format("bookline")
        .option("cluster", options["cluster"])
        .option("stream", s.results_stream)
        .load()
    )
    top = spark.read.parquet(str(run_dir / "out" / "top_paths")).orderBy("minute").first()
    return {
        "records_written": written,
        "write_s": round(write_s, 3),
        "streaming_s": round(stream_s, 3),
        "streaming_data_micro_batches": batches,
        "replay_s": round(replay_s, 3),
        "minutes": len({r[0] for r in replay_rows}),
        "status_count_rows": len(replay_rows),
        "streaming_matches_replay": True,
        "result_records": results.count(),
        "first_minute_top_paths": [
            {"path": p["path"], "count": p["count"]} for p in (top["paths"] if top else [])
        ],
        "parquet_dir": str(run_dir / "out"),
    }


def run(settings: DemoSettings, cluster_file: Path) -> dict[str, Any]:
    """Run the demo against the cluster ``cluster_file`` describes (``bookline pipeline
    demo`` starts one when not given a running cluster); the Spark session it starts is
    stopped before it returns or raises."""
    from pipeline.session import local_session, stop_session

    run_dir = settings.dir.resolve() / f"run-{uuid.uuid4().hex[:8]}"
    run_dir.mkdir(parents=True)
    spark = local_session("bookline-pipeline-demo")
    try:
        summary = _run_pipeline(spark, {"cluster": str(cluster_file)}, settings, run_dir)
    finally:
        stop_session(spark)
    log.info("pipeline demo done: %s", summary)
    return summary
