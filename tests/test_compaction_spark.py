"""The Spark source reads a compacted stream (issue 24, item 6): both read paths (Arrow
columns cut from the entries, and records) return exactly the records kept, at their
own offsets (sparse), DLSNs and values -- a compaction's gaps are not data loss."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from streams.compaction_plan import CompactionPolicy
from streams.records import LogRecord

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


def test_spark_reads_a_compacted_stream_on_both_paths(
    spark: Any, ns: Any, bookie_cluster: Any
) -> None:
    stream = f"compacted-{uuid.uuid4().hex[:8]}"
    ns.create_stream(stream)
    keys, rounds = 300, 4
    for _segment in range(2):  # two sealed segments, each holding every key twice
        writer = ns.open_writer(stream, identity="test")
        try:
            for r in range(rounds // 2):
                writer.write_many([
                    LogRecord(b"%d:%d" % (k, r + _segment * 2), key=b"%d" % k,
                              headers=[("n", b"%d" % k)] if k % 2 else None)
                    for k in range(keys)
                ])  # fmt: skip
        finally:
            writer.close()
    # Keys 0..9 get one value more in a third segment: their last value moves there.
    writer = ns.open_writer(stream, identity="test")
    writer.write_many([LogRecord(b"%d:last" % k, key=b"%d" % k) for k in range(10)])
    writer.close()
    report = ns.runner.call(ns.ns.compact(stream, CompactionPolicy(compact=True)))
    assert report.records_removed == keys * (rounds - 1) + 10
    expected = [r for r in _core_read(ns, stream)]
    assert len(expected) == keys  # keys 0..9 only in the third segment now
    conn = {"zk": bookie_cluster.zk, "root": bookie_cluster.root}
    for arrow in ("true", "false"):
        df = (
            spark.read.format("bookline").options(**conn)
            .options(stream=stream, arrow=arrow, includeHeaders="true").load()
        )  # fmt: skip
        rows = sorted(df.collect(), key=lambda r: r["sequence_id"])
        assert [r["sequence_id"] for r in rows] == [e.sequence_id for e in expected], arrow
        assert [bytes(r["value"]) for r in rows] == [e.payload for e in expected], arrow
        assert [bytes(r["key"]) for r in rows] == [e.key for e in expected], arrow
        assert [r["dlsn"] for r in rows] == [str(e.dlsn) for e in expected], arrow
        with_headers = [(h["key"], bytes(h["value"])) for h in rows[11]["headers"] or []]
        assert with_headers == (expected[11].headers or []), arrow


def _core_read(ns: Any, stream: str) -> list[Any]:
    end = ns.runner.call(ns.ns.end_offset(stream))
    reader = ns.open_reader(stream, "earliest")
    out: list[Any] = []
    try:
        while not out or out[-1].sequence_id < end - 1:
            batch = reader.read_many(10_000, timeout_s=20)
            assert batch
            out.extend(batch)
    finally:
        reader.close()
    return out
