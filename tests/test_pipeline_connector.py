"""The Spark connector on a real cluster (issue 18): Kafka-compatible reads and writes,
topics, exactly once whatever a replay's partitioning, routing, metadata hygiene.

Shares the session's ``local[2]`` SparkSession and ``bookie_cluster``; every test uses
its own streams and topics. Tests that need no Spark job call the reader directly.
"""

from __future__ import annotations

import collections
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from pyspark.errors import PySparkException

from foundation.errors import BadRequestError, NotFoundError
from pipeline.streaming import start_query
from streams.records import LogRecord
from tests.waiting import scaled

pytestmark = [pytest.mark.spark, pytest.mark.integration]


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
    yield
    from pipeline import client

    client.close_all()


@pytest.fixture(scope="module")
def conn(bookie_cluster: Any) -> dict[str, str]:
    return {"zk": bookie_cluster.zk, "root": bookie_cluster.root}


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def _write(ns: Any, stream: str, payloads: list[bytes], **kw: Any) -> None:
    if not ns.exists(stream):
        ns.create_stream(stream)
    with ns.open_writer(stream, identity="test") as writer:
        writer.write_many([LogRecord(p, **kw) for p in payloads])


def _create_topic(ns: Any, topic: str, partitions: int) -> None:
    from groups.topics import TopicAdmin

    ns.runner.call(TopicAdmin(ns.ns).create_topic(topic, partitions))


def _values(spark: Any, conn: dict[str, str], **options: str) -> list[bytes]:
    df = spark.read.format("bookline").options(**conn).options(**options).load()
    return sorted(bytes(r["value"]) for r in df.select("value").collect())


def _segments(ns: Any, stream: str) -> int:
    return len(ns.segments(stream))


# -- defect 1: per-row routing keeps one writer per stream --------------------------


def test_interleaved_rows_keep_one_writer_per_stream_per_task(
    spark: Any, ns: Any, conn: dict[str, str]
) -> None:
    a, b = _name("inter-a"), _name("inter-b")
    warm_up = spark.createDataFrame([(_name("warm"), "w")], "stream string, value string")
    warm_up.write.format("bookline").options(**conn).mode("append").save()  # workers up
    rows = [((a, b)[i % 2], f"r{i}") for i in range(200)]
    df = spark.createDataFrame(rows, "stream string, value string").repartition(2)
    t0 = time.monotonic()
    df.write.format("bookline").options(**conn).mode("append").save()
    elapsed = time.monotonic() - t0
    assert _values(spark, conn, stream=a) == sorted(f"r{i}".encode() for i in range(0, 200, 2))
    assert _values(spark, conn, stream=b) == sorted(f"r{i}".encode() for i in range(1, 200, 2))
    # One writer (so one segment) per stream and task: 2 tasks -> at most 2 segments.
    assert _segments(ns, a) <= 2 and _segments(ns, b) <= 2, (_segments(ns, a), _segments(ns, b))
    assert elapsed < scaled(6), f"200 interleaved rows took {elapsed:.1f} s"


# -- defect 2: exactly once whatever the replay's partitioning ----------------------


def _failing_write(spark: Any, conn: dict[str, str], stream: str, *, n: int, fail_at: int,
                   value_of: str, write_id: str) -> None:  # fmt: skip
    """A write of one partition whose task fails part-way: the row ``fail_at`` is a
    record over the 1 MiB limit, which the task's writer refuses (TOO_LARGE) after it
    wrote the rows before it in 16 KiB pieces. The failure is the task's own, at a fixed
    row: a crash raised in the JVM instead (``raise_error``) came, on a loaded machine,
    before the Python task had written anything, since the JVM hands rows over well
    ahead of the task (three tries in a row wrote nothing)."""
    from pyspark.sql import functions as F

    df = (
        spark.range(n, numPartitions=1)
        .withColumn(
            "value",
            F.when(F.col("id") == fail_at, F.repeat(F.lit("x"), 2 << 20)).otherwise(
                F.expr(value_of)
            ),
        )
        .select("value")
    )
    writer = df.write.format("bookline").options(**conn).option("stream", stream)
    # Written in 16 KiB pieces: many are durable before the task reaches the bad row.
    writer = writer.option("bufferBytesMax", str(16 << 10))
    with pytest.raises(PySparkException, match=r"record of \d+ bytes; at most"):
        writer.option("writeId", write_id).option("batchId", "7").mode("append").save()


def _replay(spark: Any, conn: dict[str, str], stream: str, *, n: int, value_of: str,
            write_id: str, partitions: int, driver_bytes: str) -> None:  # fmt: skip
    df = spark.range(n, numPartitions=1).selectExpr(f"{value_of} AS value").repartition(partitions)
    (
        df.write.format("bookline")
        .options(**conn)
        .option("driverWriteBytesMax", driver_bytes)
        .option("stream", stream)
        .option("writeId", write_id)
        .option("batchId", "7")
        .mode("append")
        .save()
    )


@pytest.mark.parametrize(
    ("value_of", "driver_bytes"),
    [
        ("CAST(id AS STRING)", "0"),  # distinct rows, written by the tasks
        ("CAST(id % 9000 AS STRING)", "0"),  # rows with equal content spread over tasks
        ("CAST(id % 9000 AS STRING)", str(4 << 20)),  # the same, written by the driver
    ],
)
def test_a_replay_partitioned_differently_writes_each_row_exactly_once(
    spark: Any, ns: Any, conn: dict[str, str], value_of: str, driver_bytes: str
) -> None:
    n = 30_000
    stream, write_id = _name("eos"), _name("job")
    _failing_write(spark, conn, stream, n=n, fail_at=25_000, value_of=value_of,
                   write_id=write_id)  # fmt: skip
    partial = ns.stream_info(stream).record_count
    assert 0 < partial < n, partial
    _replay(spark, conn, stream, n=n, value_of=value_of, write_id=write_id, partitions=4,
            driver_bytes=driver_bytes)  # fmt: skip
    expected = spark.range(n).selectExpr(f"{value_of} AS value").collect()
    got = collections.Counter(_values(spark, conn, stream=stream))
    assert got == collections.Counter(r["value"].encode() for r in expected)
    # A second replay (say the driver died after writing, before Spark logged it).
    _replay(spark, conn, stream, n=n, value_of=value_of, write_id=write_id, partitions=3,
            driver_bytes=driver_bytes)  # fmt: skip
    assert ns.stream_info(stream).record_count == n


# -- defect 3: a reader never writes metadata ---------------------------------------


def test_a_read_with_a_wrong_root_fails_clearly_and_creates_nothing(
    spark: Any, bookie_cluster: Any
) -> None:
    from kazoo.client import KazooClient

    root = f"/wrong-{uuid.uuid4().hex[:8]}"
    with pytest.raises(PySparkException, match="does not exist under root"):
        spark.read.format("bookline").option("zk", bookie_cluster.zk).option("root", root).option(
            "stream", "x"
        ).load().collect()
    zk = KazooClient(hosts=bookie_cluster.zk)
    zk.start()
    try:
        assert zk.exists(root) is None, f"the read created {root}"
    finally:
        zk.stop()
        zk.close()


# -- defect 4: offsets that name the wrong thing, or a start after the end ----------


def test_offsets_naming_an_unselected_stream_or_a_start_after_the_end_are_errors(
    ns: Any, conn: dict[str, str]
) -> None:
    from pipeline.options import parse_source_options
    from pipeline.source import BooklineBatchReader

    stream = _name("strict")
    _write(ns, stream, [b"x"] * 10)

    def plan(**options: str) -> Any:
        return BooklineBatchReader(parse_source_options({**conn, **options}), None).partitions()  # type: ignore[arg-type]

    with pytest.raises(BadRequestError, match="does not select"):
        plan(stream=stream, startingOffsets='{"' + stream + 'x": 3}')
    with pytest.raises(BadRequestError, match="after the end"):
        plan(
            stream=stream, startingOffsets=f'{{"{stream}": 7}}', endingOffsets=f'{{"{stream}": 3}}'
        )
    with pytest.raises(NotFoundError, match="no topic or stream"):
        plan(subscribe=_name("nothing"))
    assert len(plan(stream=stream, startingOffsets=f'{{"{stream}": {{"0": 3}}}}')) == 1


# -- Kafka compatibility and topics ------------------------------------------------


def _kafka_job(spark: Any, source: dict[str, str], sink: dict[str, str], *, topic: str,
               out: str, checkpoint: str) -> Any:  # fmt: skip
    """A Spark Kafka-connector job, as written for Kafka but for ``source``/``sink``."""
    stream = (
        spark.readStream.format(source["format"])
        .options(**{k: v for k, v in source.items() if k != "format"})
        .option("subscribe", topic)
        .option("startingOffsets", f'{{"{topic}": {{"0": 1, "1": -2, "2": -2}}}}')
        .option("maxOffsetsPerTrigger", "40")
        .load()
    )
    query = start_query(
        stream.selectExpr("key", "upper(CAST(value AS STRING)) AS value", f"'{out}' AS topic")
        .writeStream.format(sink["format"])
        .options(**{k: v for k, v in sink.items() if k != "format"})
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
    )
    query.awaitTermination()
    return query


def test_a_kafka_connector_job_runs_with_only_the_format_and_connection_changed(
    spark: Any, ns: Any, conn: dict[str, str], tmp_path: Any
) -> None:
    from foundation.partitioner import partition_for_key

    src, dst = _name("orders"), _name("shouted")
    _create_topic(ns, src, 3)
    _create_topic(ns, dst, 3)
    rows = [(f"k{i % 10}", f"order {i}") for i in range(120)]
    spark.createDataFrame(rows, "key string, value string").withColumn(
        "topic", __import__("pyspark.sql.functions", fromlist=["lit"]).lit(src)
    ).write.format("bookline").options(**conn).mode("append").save()

    bookline = {"format": "bookline", **conn}
    query = _kafka_job(
        spark, bookline, bookline, topic=src, out=dst, checkpoint=str(tmp_path / "ckpt")
    )
    batches = [p["numInputRows"] for p in query.recentProgress if p["numInputRows"] > 0]
    assert max(batches) <= 40 and len(batches) >= 3, batches

    df = spark.read.format("bookline").options(**conn).option("subscribe", src).load()
    assert df.columns[:7] == [
        "key", "value", "topic", "partition", "offset", "timestamp", "timestampType",
    ]  # fmt: skip
    got = df.collect()
    assert len(got) == 120
    for r in got:  # keyed rows land where Kafka's partitioner puts them
        assert r["partition"] == partition_for_key(bytes(r["key"]), 3)
        assert r["topic"] == src and r["stream"] == f"{src}~{r['partition']}"
        assert r["offset"] == r["sequence_id"]
    # Partition 0 started at offset 1: its first record was not copied.
    first_of_0 = min((r for r in got if r["partition"] == 0), key=lambda r: r["offset"])
    out = spark.read.format("bookline").options(**conn).option("subscribe", dst).load().collect()
    expected = sorted(
        (bytes(r["key"]), bytes(r["value"]).upper()) for r in got if r is not first_of_0
    )
    assert sorted((bytes(r["key"]), bytes(r["value"])) for r in out) == expected
    for r in out:
        assert r["partition"] == partition_for_key(bytes(r["key"]), 3)

    # assign: one partition only; endingOffsets per partition.
    one = (
        spark.read.format("bookline").options(**conn)
        .option("assign", f'{{"{src}": [2]}}')
        .option("endingOffsets", f'{{"{src}": {{"2": 3}}}}')
        .load().collect()
    )  # fmt: skip
    assert sorted(r["offset"] for r in one) == [0, 1, 2] and {r["partition"] for r in one} == {2}


def test_streaming_picks_up_new_partitions_and_honours_min_offsets_per_trigger(
    ns: Any, conn: dict[str, str]
) -> None:
    from groups.topics import TopicAdmin
    from pipeline.options import parse_source_options
    from pipeline.source import BooklineStreamReader

    topic = _name("grow")
    _create_topic(ns, topic, 2)
    _write(ns, f"{topic}~0", [b"a"] * 3)
    now = [0.0]
    opts = parse_source_options(
        {**conn, "subscribe": topic, "startingOffsets": "earliest",
         "minOffsetsPerTrigger": "5", "maxTriggerDelay": "2s"},
        streaming=True,
    )  # fmt: skip
    reader = BooklineStreamReader(opts, None, clock=lambda: now[0])  # type: ignore[arg-type]
    start = reader.initialOffset()
    assert start == {topic: {"0": 0, "1": 0}}
    assert reader.latestOffset(start) == start, "3 < minOffsetsPerTrigger: wait"
    now[0] = 2.5  # maxTriggerDelay is over
    assert reader.latestOffset(start) == {topic: {"0": 3, "1": 0}}
    ns.runner.call(TopicAdmin(ns.ns).alter_partitions(topic, 3))
    _write(ns, f"{topic}~2", [b"b"] * 6)
    end = reader.latestOffset({topic: {"0": 3, "1": 0}})
    assert end == {topic: {"0": 3, "1": 0, "2": 6}}, "a new partition starts at earliest"
    parts = reader.partitions({topic: {"0": 3, "1": 0}}, end)
    assert [(p.slice.topic, p.slice.partition) for p in parts] == [(topic, 2)]  # type: ignore[attr-defined]
    reader.stop()


# -- defect 7: a Spark-written stream copies with its headers -------------------------


def test_a_spark_written_stream_can_be_copied_with_its_headers(
    spark: Any, conn: dict[str, str]
) -> None:
    first, copy = _name("hdr"), _name("hdr-copy")
    df = spark.createDataFrame(
        [(f"v{i}", [("source", b"web"), ("n", str(i).encode())]) for i in range(20)],
        "value string, headers array<struct<key:string,value:binary>>",
    )
    df.write.format("bookline").options(**conn).option("stream", first).mode("append").save()
    read = spark.read.format("bookline").options(**conn).option("includeHeaders", "true")
    back = read.option("stream", first).load()
    back.select("value", "headers").write.format("bookline").options(**conn).option(
        "stream", copy
    ).mode("append").save()
    # A header named like the sink's tag header before format v3 is the user's now
    # (the tag is in the record framing): written and read back like any other.
    tagged = spark.createDataFrame(
        [(f"v{i}", {"bookline.spark": b"old:1:r:0", "n": str(i).encode()}) for i in range(3)],
        "value string, headers map<string,binary>",
    )
    tagged.write.format("bookline").options(**conn).option("stream", first + "-t").mode(
        "append"
    ).save()
    again = read.option("stream", first + "-t").load().collect()
    assert sorted(sorted((h["key"], bytes(h["value"])) for h in r["headers"]) for r in again) == [
        [("bookline.spark", b"old:1:r:0"), ("n", str(i).encode())] for i in range(3)
    ]
    rows = read.option("stream", copy).load().collect()
    assert sorted((bytes(r["value"]), [(h["key"], bytes(h["value"])) for h in r["headers"]])
                  for r in rows) == sorted(
        (f"v{i}".encode(), [("source", b"web"), ("n", str(i).encode())]) for i in range(20)
    )  # fmt: skip


# -- defect 8: markers cleaned up, no segment for nothing ---------------------------


def test_writes_leave_no_sink_markers_and_a_skipped_replay_opens_no_writer(
    spark: Any, ns: Any, conn: dict[str, str]
) -> None:
    stream = _name("hygiene")
    df = spark.range(60, numPartitions=6).selectExpr("CAST(id AS STRING) AS value")
    df.write.format("bookline").options(**conn).option("stream", stream).mode("append").save()
    assert ns.stream_info(stream).record_count == 60
    assert [s for s in ns.list_subscribers(stream) if s.startswith("spark-sink")] == []
    # Six small tasks: the driver's commit wrote their rows, one writer, one segment.
    assert _segments(ns, stream) == 1

    # A foreachBatch-style write replayed: nothing to write, so no writer and no segment.
    job = _name("job")
    w = df.write.format("bookline").options(**conn).option("stream", stream)
    w.option("writeId", job).option("batchId", "3").mode("append").save()
    segments = _segments(ns, stream)
    w.option("writeId", job).option("batchId", "3").mode("append").save()
    assert ns.stream_info(stream).record_count == 120
    assert _segments(ns, stream) == segments
    assert ns.list_subscribers(stream).count(f"spark-sink.{job}") == 1


# -- defect 9: client settings pass through ----------------------------------------


def test_a_stream_written_with_hmac_and_a_password_reads_with_bookline_settings(
    spark: Any, bookie_cluster: Any, conn: dict[str, str]
) -> None:
    from streams.config import NamespaceConfig
    from streams.sync import SyncNamespace

    stream = _name("hmac")
    config = NamespaceConfig(digest_type="hmac", password="s3cret")
    with SyncNamespace.open(bookie_cluster.zk, bookie_cluster.root, config=config) as secret:
        _write(secret, stream, [b"p1", b"p2"])
    settings = {"bookline.digest_type": "hmac", "bookline.password": "s3cret"}
    assert _values(spark, conn, stream=stream, **settings) == [b"p1", b"p2"]
