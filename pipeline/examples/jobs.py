"""The example's Spark jobs: a Structured Streaming job and a batch replay.

Streaming (:func:`start_streaming`): read the access-log stream with the ``bookline``
source, parse Common Log Format, and per event-time minute (1-minute watermark) compute

* status-code counts, and
* the top paths (``TOP_PATHS`` per minute).

Each finished minute is written, from ``foreachBatch``, to a results stream (one JSON
record per row; key ``status:<minute>:<code>`` or ``paths:<minute>``) and to Parquet
(``<out>/status_counts`` and ``<out>/top_paths``). Both writes are replay-safe: the
Bookline write passes ``writeId``/``batchId`` so a replayed micro-batch is skipped, and
each Parquet batch goes to its own ``batch_id=N`` directory, overwritten on replay.

Batch (:func:`replay_status_counts`): the same status counts over the whole history,
read with ``spark.read`` from the earliest record: what the streaming job must agree
with once all minutes are finished.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from foundation.errors import TimeoutError_
from pipeline.examples.accesslogs import FLUSH_PATH
from pipeline.planning import decode_offsets
from pipeline.streaming import start_query

__all__ = [
    "parse_logs",
    "replay_status_counts",
    "start_streaming",
    "status_counts",
    "stop_when_caught_up",
]

TOP_PATHS = 3
# Event-time lateness accepted before a minute is final.
WATERMARK = "1 minute"
LOG_PATTERN = r'^(\S+) \S+ \S+ \[([^\]]+)\] "(\S+) (\S+) [^"]*" (\d{3}) (\d+)$'


def parse_logs(df: Any) -> Any:
    """value (CLF bytes) -> client, event_time, method, path, status, size_bytes."""
    from pyspark.sql import functions as F

    line = F.col("value").cast("string")
    return df.select(
        F.regexp_extract(line, LOG_PATTERN, 1).alias("client"),
        F.to_timestamp(F.regexp_extract(line, LOG_PATTERN, 2), "dd/MMM/yyyy:HH:mm:ss Z").alias(
            "event_time"
        ),
        F.regexp_extract(line, LOG_PATTERN, 3).alias("method"),
        F.regexp_extract(line, LOG_PATTERN, 4).alias("path"),
        F.regexp_extract(line, LOG_PATTERN, 5).cast("int").alias("status"),
        F.regexp_extract(line, LOG_PATTERN, 6).cast("long").alias("size_bytes"),
    )


def status_counts(parsed: Any) -> Any:
    """Per-minute status counts (minute, status, count) of a batch or streaming frame."""
    from pyspark.sql import functions as F

    return (
        parsed.where(F.col("path") != FLUSH_PATH)
        .groupBy(F.window("event_time", "1 minute").start.alias("minute"), "status")
        .count()
    )


def _connection(options: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in options.items() if k in ("zk", "root", "cluster", "namespace")}


def _write_results(
    batch: Any,
    batch_id: int,
    kind: str,
    *,
    options: dict[str, str],
    results_stream: str,
    out_dir: Path,
    query_name: str,
) -> None:
    from pyspark.sql import functions as F

    if kind == "status":
        rows = batch.select(
            F.concat_ws(
                ":",
                F.lit("status"),
                F.date_format("minute", "yyyy-MM-dd'T'HH:mm"),
                F.col("status").cast("string"),
            ).alias("key"),
            F.to_json(F.struct(F.lit("status").alias("kind"), "minute", "status", "count")).alias(
                "value"
            ),
        )
    else:
        rows = batch.select(
            F.concat_ws(":", F.lit("paths"), F.date_format("minute", "yyyy-MM-dd'T'HH:mm")).alias(
                "key"
            ),
            F.to_json(F.struct(F.lit("top_paths").alias("kind"), "minute", "paths")).alias("value"),
        )
    (
        rows.write.format("bookline")
        .options(**_connection(options))
        .option("stream", results_stream)
        .option("writeId", f"{query_name}-{kind}")
        .option("batchId", str(batch_id))
        .mode("append")
        .save()
    )
    target = out_dir / ("status_counts" if kind == "status" else "top_paths")
    batch.write.mode("overwrite").parquet(str(target / f"batch_id={batch_id}"))


def _top_paths(batch: Any) -> Any:
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    rank = F.row_number().over(Window.partitionBy("minute").orderBy(F.desc("count"), F.asc("path")))
    return (
        batch.withColumn("rank", rank)
        .where(F.col("rank") <= TOP_PATHS)
        .groupBy("minute")
        .agg(
            F.sort_array(
                F.collect_list(F.struct(F.col("rank"), F.col("path"), F.col("count")))
            ).alias("paths")
        )
    )


def start_streaming(
    spark: Any,
    options: dict[str, str],
    *,
    logs_stream: str,
    results_stream: str,
    out_dir: Path,
    checkpoint_dir: Path,
    available_now: bool = True,
    max_records_per_trigger: int | None = None,
    query_name: str = "access-logs",
) -> list[Any]:
    """Start the two streaming queries (status counts, top paths); returns them.

    One after the other (:func:`pipeline.streaming.start_query` returns once a query's
    source is initialized): two Python worker starts at once could each miss Spark's
    fixed wait for them on a loaded machine."""
    from pyspark.sql import functions as F

    reader = (
        spark.readStream.format("bookline")
        .options(**_connection(options))
        .option("stream", logs_stream)
        .option("startingOffsets", "earliest")
    )
    if max_records_per_trigger is not None:
        reader = reader.option("maxRecordsPerTrigger", str(max_records_per_trigger))
    parsed = parse_logs(reader.load()).withWatermark("event_time", WATERMARK)
    # Group by the window itself (not its start): Spark finalises windows by watermark.
    # The flush line must reach the watermark operator, and Spark pushes filters that do
    # not touch the event time below it: so flush rows are grouped apart and dropped in
    # the sink instead of filtered here.
    window = F.window("event_time", "1 minute").alias("w")
    flagged = parsed.withColumn("flush", F.col("path") == FLUSH_PATH)
    frames = {
        "status": flagged.groupBy(window, "status", "flush")
        .count()
        .select(F.col("w.start").alias("minute"), "status", "count", "flush"),
        "paths": flagged.groupBy(window, "path", "flush")
        .count()
        .select(F.col("w.start").alias("minute"), "path", "count", "flush"),
    }
    writers = []
    for kind, frame in frames.items():

        def sink(batch: Any, batch_id: int, kind: str = kind) -> None:
            kept = batch.where(~F.col("flush")).drop("flush")
            out = kept if kind == "status" else _top_paths(kept)
            _write_results(
                out,
                batch_id,
                kind,
                options=options,
                results_stream=results_stream,
                out_dir=out_dir,
                query_name=query_name,
            )

        writer = (
            frame.writeStream.outputMode("append")
            .foreachBatch(sink)
            .option("checkpointLocation", str(checkpoint_dir / kind))
            .queryName(f"{query_name}-{kind}")
        )
        writers.append(
            writer.trigger(availableNow=True)
            if available_now
            else writer.trigger(processingTime="500 milliseconds")
        )
    return _start_all(writers)


def _start_all(writers: list[Any]) -> list[Any]:
    """Start the queries one after the other; if one cannot start, stop those started."""
    queries: list[Any] = []
    try:
        for writer in writers:
            queries.append(start_query(writer))
    except BaseException:
        for query in queries:
            query.stop()
        raise
    return queries


def records_read(progress: dict[str, Any] | None) -> int:
    """Records a query has read so far, from its last progress' source end offsets (a
    fresh stream starts at offset 0). Not ``sum(recentProgress)``: Spark keeps only the
    last 100 progress entries (spark.sql.streaming.numRecentProgressUpdates)."""
    if not progress:
        return 0
    total = 0
    for source in progress.get("sources", []):
        end = source.get("endOffset")
        if end is not None:
            total += sum(decode_offsets(json.loads(end) if isinstance(end, str) else end).values())
    return total


def stop_when_caught_up(queries: list[Any], records: int, timeout_s: float) -> int:
    """Wait until every query has read ``records`` source rows and then run a batch
    without data (Spark runs one when the watermark moved: that is when the last
    minutes are emitted), then stop them; returns the largest micro-batch count.

    Trigger.AvailableNow stops right after the last data batch, before the batch that
    would evict the final windows, hence a processing-time trigger for the demo.
    """
    deadline = time.monotonic() + timeout_s
    batches = 0
    try:
        for q in queries:
            data_batches: set[int] = set()
            while True:
                if q.exception() is not None:
                    raise q.exception()
                data_batches.update(p["batchId"] for p in q.recentProgress if p["numInputRows"] > 0)
                last = q.lastProgress
                seen = records_read(last)
                if seen >= records and last and last["numInputRows"] == 0:
                    batches = max(batches, len(data_batches))
                    break
                if time.monotonic() > deadline:
                    raise TimeoutError_(
                        f"streaming query {q.name} read {seen} of {records} records "
                        f"within {timeout_s:.0f}s"
                    )
                time.sleep(0.2)
    finally:
        for q in queries:
            q.stop()
    return batches


def replay_status_counts(spark: Any, options: dict[str, str], logs_stream: str) -> Any:
    """The batch job: status counts per minute over the stream's whole history."""
    df = (
        spark.read.format("bookline")
        .options(**_connection(options))
        .option("stream", logs_stream)
        .option("startingOffsets", "earliest")
        .load()
    )
    return status_counts(parse_logs(df))
