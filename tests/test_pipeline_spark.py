"""The ``bookline`` Spark data source against a real cluster (ZooKeeper + 3 bookies).

One local[2] SparkSession (the session ``spark`` fixture) and the session's
``bookie_cluster``; every test uses its own streams.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pyspark.errors import PySparkException

from pipeline.streaming import start_query
from streams.dlsn import DLSN
from streams.records import LogRecord
from tests.waiting import wait_until

pytestmark = [pytest.mark.spark, pytest.mark.integration]

SEGMENT_RECORDS = 1_000


@pytest.fixture(scope="module")
def ns(bookie_cluster: Any) -> Iterator[Any]:
    from streams.sync import SyncNamespace

    namespace = SyncNamespace.open(zk=bookie_cluster.zk, root=bookie_cluster.root)
    try:
        yield namespace
    finally:
        namespace.close()


@pytest.fixture(scope="module", autouse=True)
def _close_cached_namespaces() -> Iterator[None]:
    """The data source caches a namespace per process; close ours before ZooKeeper stops."""
    yield
    from pipeline import client

    client.close_all()


@pytest.fixture(scope="module")
def conn(bookie_cluster: Any) -> dict[str, str]:
    return {"zk": bookie_cluster.zk, "root": bookie_cluster.root}


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _payload(i: int) -> bytes:
    return f"record-{i:06d}".encode()


def write_segments(
    ns: Any, stream: str, segments: int, per_segment: int, first: int = 0
) -> list[DLSN]:
    """Write ``segments`` x ``per_segment`` records; each writer session is a segment."""
    if not ns.exists(stream):
        ns.create_stream(stream)
    dlsns: list[DLSN] = []
    i = first
    for _ in range(segments):
        writer = ns.open_writer(stream, identity="test")
        try:
            batch = []
            for _ in range(per_segment):
                headers = {"n": str(i).encode()} if i % 2 == 0 else None
                batch.append(LogRecord(_payload(i), key=f"k{i % 7}".encode(), headers=headers))
                i += 1
            dlsns += writer.write_many(batch)
        finally:
            writer.close()
    return dlsns


def _read(spark: Any, conn: dict[str, str], **options: str) -> Any:
    return spark.read.format("bookline").options(**conn).options(**options).load()


def test_batch_read_of_three_segments_returns_exactly_what_was_written(
    spark: Any, ns: Any, conn: dict[str, str]
) -> None:
    stream = _name("batch")
    dlsns = write_segments(ns, stream, 3, SEGMENT_RECORDS)
    assert len(ns.segments(stream)) >= 3
    for arrow in ("true", "false"):
        df = _read(spark, conn, stream=stream, arrow=arrow, includeHeaders="true")
        assert df.rdd.getNumPartitions() >= 3
        rows = sorted(df.collect(), key=lambda r: r["sequence_id"])
        assert [r["sequence_id"] for r in rows] == list(range(3 * SEGMENT_RECORDS))
        assert [bytes(r["value"]) for r in rows] == [_payload(i) for i in range(3000)]
        assert [r["dlsn"] for r in rows] == [str(d) for d in dlsns]
        assert {r["stream"] for r in rows} == {stream}
        assert bytes(rows[7]["key"]) == b"k0"
        assert [(h["key"], bytes(h["value"])) for h in rows[4]["headers"]] == [("n", b"4")]
        assert rows[5]["headers"] is None
        assert rows[0]["timestamp"].year >= 2024
        assert all(a["txid"] <= b["txid"] for a, b in itertools.pairwise(rows))


def test_offset_ranges_timestamps_and_min_partitions_select_the_right_records(
    spark: Any, ns: Any, conn: dict[str, str]
) -> None:
    stream = _name("ranges")
    write_segments(ns, stream, 2, SEGMENT_RECORDS)
    time.sleep(0.05)  # the clock moves on: middle_ms lies strictly between the writes
    middle_ms = int(time.time() * 1000)
    time.sleep(0.05)
    write_segments(ns, stream, 1, SEGMENT_RECORDS, first=2 * SEGMENT_RECORDS)

    df = _read(
        spark,
        conn,
        stream=stream,
        startingOffsets=f'{{"{stream}": 500}}',
        endingOffsets=f'{{"{stream}": 1500}}',
    )
    assert sorted(r["sequence_id"] for r in df.collect()) == list(range(500, 1500))

    df = _read(spark, conn, stream=stream, startingTimestamp=str(middle_ms))
    assert sorted(r["sequence_id"] for r in df.collect()) == list(range(2000, 3000))

    with pytest.raises(PySparkException, match="cannot be 'latest'"):
        _read(spark, conn, stream=stream, startingOffsets="latest").count()

    df = _read(spark, conn, stream=stream, minPartitions="8")
    assert df.rdd.getNumPartitions() >= 8
    assert df.count() == 3000

    # A pattern selects several streams; JSON offsets apply per stream.
    other = _name("ranges")
    write_segments(ns, other, 1, 10)
    df = _read(
        spark, conn, streamPattern=f"({stream}|{other})", startingOffsets=f'{{"{stream}": 2990}}'
    )
    assert sorted((r["stream"], r["sequence_id"]) for r in df.collect()) == sorted(
        [(stream, i) for i in range(2990, 3000)] + [(other, i) for i in range(10)]
    )


def test_truncated_range_fails_or_is_skipped_per_fail_on_data_loss(
    spark: Any, ns: Any, conn: dict[str, str]
) -> None:
    stream = _name("trunc")
    dlsns = write_segments(ns, stream, 3, SEGMENT_RECORDS)
    writer = ns.open_writer(stream, identity="truncator")
    try:
        writer.truncate(dlsns[SEGMENT_RECORDS])  # the whole first segment goes
    finally:
        writer.close()
    assert ns.stream_info(stream).first_sequence_id == SEGMENT_RECORDS

    explicit = f'{{"{stream}": 0}}'
    with pytest.raises(PySparkException, match="failOnDataLoss") as info:
        _read(spark, conn, stream=stream, startingOffsets=explicit).collect()
    assert "TRUNCATED" in str(info.value)

    df = _read(spark, conn, stream=stream, startingOffsets=explicit, failOnDataLoss="false")
    assert sorted(r["sequence_id"] for r in df.collect()) == list(range(1000, 3000))
    # "earliest" means the oldest readable record: no data loss there.
    assert _read(spark, conn, stream=stream).count() == 2000


def _stream_to_parquet(
    spark: Any, conn: dict[str, str], stream: str, *, out: Path, checkpoint: Path, max_records: int
) -> Any:
    return (
        spark.readStream.format("bookline")
        .options(**conn)
        .option("stream", stream)
        .option("startingOffsets", "earliest")
        .option("maxRecordsPerTrigger", str(max_records))
        .load()
        .select("sequence_id", "value")
        .writeStream.format("parquet")
        .option("path", str(out))
        .option("checkpointLocation", str(checkpoint))
    )


def _data_batches(query: Any) -> list[int]:
    return [p["numInputRows"] for p in query.recentProgress if p["numInputRows"] > 0]


def test_streaming_read_is_rate_limited_and_resumes_exactly_from_its_checkpoint(
    spark: Any, ns: Any, conn: dict[str, str], tmp_path: Path
) -> None:
    stream = _name("stream")
    write_segments(ns, stream, 5, 1_000)
    out, ckpt = tmp_path / "out", tmp_path / "ckpt"

    writer = _stream_to_parquet(spark, conn, stream, out=out, checkpoint=ckpt, max_records=1000)
    query = start_query(writer.trigger(availableNow=True))
    query.awaitTermination()
    batches = _data_batches(query)
    assert len(batches) >= 5 and max(batches) <= 1000, batches
    assert sum(batches) == 5000

    # Stop a query part-way (processing-time trigger), then restart from the checkpoint.
    write_segments(ns, stream, 2, 1_000, first=5000)
    writer = _stream_to_parquet(spark, conn, stream, out=out, checkpoint=ckpt, max_records=300)
    query = start_query(writer.trigger(processingTime="100 milliseconds"))
    wait_until(lambda: len(_data_batches(query)) >= 2, "two batches", timeout_s=60, interval_s=0.1)
    query.stop()
    assert 0 < sum(_data_batches(query)) < 2000
    writer = _stream_to_parquet(spark, conn, stream, out=out, checkpoint=ckpt, max_records=1000)
    query = start_query(writer.trigger(availableNow=True))
    query.awaitTermination()

    seqs = [r["sequence_id"] for r in spark.read.parquet(str(out)).collect()]
    assert sorted(seqs) == list(range(7000)), "records skipped or repeated across restarts"


def test_streaming_write_of_a_replayed_batch_writes_each_record_once(
    spark: Any, ns: Any, conn: dict[str, str], tmp_path: Path
) -> None:
    source, target = _name("src"), _name("dst")
    write_segments(ns, source, 2, 1_000)
    ckpt = tmp_path / "ckpt"

    def run() -> Any:
        query = start_query(
            spark.readStream.format("bookline")
            .options(**conn)
            .option("stream", source)
            .option("startingOffsets", "earliest")
            .option("maxRecordsPerTrigger", "800")
            .load()
            .selectExpr("value", "key", "'copy' AS kind")
            .selectExpr("value", "key", "map('kind', CAST(kind AS BINARY)) AS headers")
            .writeStream.format("bookline")
            .options(**conn)
            .option("stream", target)
            .option("checkpointLocation", str(ckpt))
            .trigger(availableNow=True)
        )
        query.awaitTermination()
        return query

    run()
    assert _read(spark, conn, stream=target).count() == 2000
    # Forget that the last micro-batch was committed: the restart replays it.
    commits = sorted(
        (ckpt / "commits").iterdir(), key=lambda p: int(p.name) if p.name.isdigit() else -1
    )
    last = [p for p in commits if p.name.isdigit()][-1]
    last.unlink()
    (last.parent / f".{last.name}.crc").unlink(missing_ok=True)
    replay = run()
    assert any(p["numInputRows"] > 0 for p in replay.recentProgress), "nothing replayed"

    rows = _read(spark, conn, stream=target, includeHeaders="true").collect()
    assert sorted(bytes(r["value"]) for r in rows) == sorted(_payload(i) for i in range(2000))
    assert all([(h["key"], bytes(h["value"])) for h in r["headers"]] == [("kind", b"copy")]
               for r in rows)  # fmt: skip


def test_a_retried_task_skips_the_rows_it_already_wrote(
    ns: Any, conn: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import pyarrow as pa

    from pipeline import sink_task
    from pipeline.options import parse_sink_options
    from pipeline.sink import Tag, write_batches

    monkeypatch.setattr(sink_task, "WRITE_BATCH_RECORDS", 10)

    stream = _name("retry")
    # A row buffers ~141 bytes: 10 rows fill the buffer, so the crash comes after 3 writes.
    opts = parse_sink_options({**conn, "stream": stream, "bufferBytesMax": "1400"})
    tag = Tag("query-1", 3, "run-a", 0)
    rows = [_payload(i) for i in range(50)] + [_payload(0)]  # a legitimate duplicate row

    def batches(values: list[bytes], crash_after: int | None = None) -> Iterator[Any]:
        for n, lo in enumerate(range(0, len(values), 10)):
            if n == crash_after:
                raise Crash
            yield pa.RecordBatch.from_pydict({"value": values[lo : lo + 10]})

    class Crash(Exception):
        pass

    with pytest.raises(Crash):
        write_batches(opts, tag, batches(rows, crash_after=3))
    written = write_batches(opts, tag, batches(rows[::-1]), attempt=1)
    assert written.skipped[stream] == 30
    again = write_batches(opts, tag, batches(rows), attempt=2)
    assert again.written[stream] == 0
    assert again.skipped[stream] == len(rows)

    info = ns.stream_info(stream)
    assert info.next_sequence_id - info.first_sequence_id == len(rows)


def test_the_example_pipeline_runs_end_to_end(
    spark: Any, bookie_cluster: Any, tmp_path: Path
) -> None:
    from pipeline.examples import demo

    settings = demo.DemoSettings(
        dir=tmp_path,
        records=3_000,
        minutes=3,
        max_records_per_trigger=1_000,
        logs_stream=_name("access-logs"),
        results_stream=_name("access-stats"),
    )
    options = {"cluster": str(bookie_cluster.cluster_file())}
    summary = demo._run_pipeline(spark, options, settings, tmp_path)
    assert summary["streaming_matches_replay"]
    assert summary["minutes"] == 3
    assert summary["records_written"] == 3_001
    # One status row per (minute, status) plus one top-paths record per minute.
    assert summary["result_records"] == summary["status_count_rows"] + 3
    assert summary["first_minute_top_paths"]


def _slow_first_source_worker(spark: Any, tmp_path: Path) -> tuple[str, Path]:
    """Register the bookline source under another name whose Python workers start
    through a wrapper: the first streaming-source worker never connects back, so Spark's
    fixed 10 s wait expires (a CPU-starved machine, made certain). Returns the format name
    and the file listing each worker launch's module."""
    import stat
    import sys

    from pipeline.source import BooklineDataSource

    launches = tmp_path / "launches"
    wrapper = tmp_path / "python"
    wrapper.write_text(
        "#!/bin/sh\n"
        "# Spark starts a simple worker as: <python> -m <module>\n"
        f'echo "$2" >> {launches}\n'
        'if [ "$2" = pyspark.sql.streaming.python_streaming_source_runner ] && '
        # Never connects back (Spark leaves the process running: the test stops it by pid).
        f"mkdir {tmp_path / 'slowed'} 2>/dev/null; then echo $$ > {tmp_path / 'slowed/pid'}; "
        "exec sleep 60; fi\n"
        f'exec {sys.executable} "$@"\n'
    )
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    name = "bookline_slow_start"
    # Defined here, so cloudpickle ships the class itself to the workers.
    source = type("SlowStartSource", (BooklineDataSource,), {"name": classmethod(lambda _: name)})
    sc = spark.sparkContext
    python = sc.pythonExec
    sc.pythonExec = str(wrapper)  # what the registered source's workers run
    try:
        spark.dataSource.register(source)
    finally:
        sc.pythonExec = python
    return name, launches


def test_a_query_whose_source_worker_missed_sparks_wait_is_started_again(
    spark: Any, ns: Any, conn: dict[str, str], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 22: Spark waits a fixed 10 s for a streaming source's Python worker; one that
    started later killed the query before it read anything. start_query starts it again
    and every record is read exactly once."""
    stream = _name("slow")
    write_segments(ns, stream, 2, 500)
    name, launches = _slow_first_source_worker(spark, tmp_path)
    writer = (
        spark.readStream.format(name)
        .options(**conn)
        .option("stream", stream)
        .option("startingOffsets", "earliest")
        .load()
        .select("sequence_id")
        .writeStream.format("parquet")
        .option("path", str(tmp_path / "out"))
        .option("checkpointLocation", str(tmp_path / "ckpt"))
        .trigger(availableNow=True)
    )
    try:
        with caplog.at_level(logging.WARNING, logger="pipeline.streaming"):
            query = start_query(writer)
        query.awaitTermination()
    finally:
        pid_file = tmp_path / "slowed" / "pid"
        if pid_file.exists():
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid_file.read_text()), signal.SIGKILL)

    runners = [m for m in launches.read_text().split() if m.endswith("source_runner")]
    assert len(runners) == 2, launches.read_text()
    assert any("connect back within Spark's fixed 10 s" in r.getMessage() for r in caplog.records)
    seqs = [r["sequence_id"] for r in spark.read.parquet(str(tmp_path / "out")).collect()]
    assert sorted(seqs) == list(range(1000))
