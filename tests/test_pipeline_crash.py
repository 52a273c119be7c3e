"""``kill -9`` of a Spark driver during a streaming write to Bookline, twice, restarting
with a different partitioning each time: the output is exact (issue 18, acceptance).

Each driver is a child process (Python driver + its JVM + Python workers) in its own
session; a kill is SIGKILL to that process group, as a crashed driver host would be.
Every group is killed by its pid at the end, also when the test fails.
"""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from streams.records import LogRecord
from tests.waiting import scaled, wait_until

# Three Spark drivers (a JVM each) start one after the other: about 2 minutes on a quiet
# machine. The limit, like every deadline here, scales with the load (tests.waiting).
pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.timeout(600)]

RECORDS = 120_000
PER_TRIGGER = 20_000
# Short ZooKeeper sessions: a killed driver's writer locks free up sooner.
SESSION_MS = "4000"
RUN_TIMEOUT_S = 150.0

DRIVER = """
import sys, time
from pipeline.session import local_session
from pipeline.streaming import start_query

zk, root, src, dst, ckpt, parts, trigger = sys.argv[1:8]
spark = local_session("bookline-crash", cores=2)
conn = {"zk": zk, "root": root, "bookline.session_timeout_ms": "SESSION_MS"}
reader = (
    spark.readStream.format("bookline").options(**conn)
    .option("subscribe", src).option("startingOffsets", "earliest")
    .option("minPartitions", parts).option("maxOffsetsPerTrigger", "PER_TRIGGER")
    .load().selectExpr("key", "value")
)
writer = (
    reader.writeStream.format("bookline").options(**conn).option("topic", dst)
    .option("checkpointLocation", ckpt)
)
writer = writer.trigger(availableNow=True) if trigger == "now" else writer.trigger(
    processingTime="200 milliseconds")
query = start_query(writer)  # (Spark's 10 s worker wait, on a loaded machine)
print("STARTED", flush=True)
query.awaitTermination()
print("DONE", flush=True)
""".replace("SESSION_MS", SESSION_MS).replace("PER_TRIGGER", str(PER_TRIGGER))


@pytest.fixture
def drivers() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    try:
        yield started
    finally:
        for proc in started:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _start(drivers: list[subprocess.Popen[bytes]], script: Path, args: list[str],
           log: Path) -> subprocess.Popen[bytes]:  # fmt: skip
    with log.open("ab") as out:
        proc = subprocess.Popen(
            [sys.executable, str(script), *args], stdout=out, stderr=subprocess.STDOUT,
            cwd=script.parent, start_new_session=True,
        )  # fmt: skip
    drivers.append(proc)
    return proc


def _written(ns: Any, dst: str) -> int:
    return sum(ns.stream_info(f"{dst}~{p}").record_count for p in range(2))


def _kill_mid_batch(ns: Any, dst: str, proc: subprocess.Popen[bytes], log: Path) -> int:
    """SIGKILL the driver's process group once the output grew and stands mid-batch."""
    before = _written(ns, dst)

    def mid_batch() -> int:
        assert proc.poll() is None, f"driver exited early:\n{log.read_text()[-4000:]}"
        count = _written(ns, dst)
        return count if count > before and count % PER_TRIGGER != 0 else 0

    count = wait_until(mid_batch, f"the driver mid-batch (log {log})", timeout_s=RUN_TIMEOUT_S)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    return count


def test_kill_9_of_the_driver_twice_with_new_partitionings_writes_exactly_once(
    ns_factory: Any, bookie_cluster: Any, tmp_path: Path, drivers: list[subprocess.Popen[bytes]]
) -> None:
    from groups.topics import TopicAdmin

    ns = ns_factory
    src, dst = f"crash-src-{uuid.uuid4().hex[:6]}", f"crash-dst-{uuid.uuid4().hex[:6]}"
    ns.runner.call(TopicAdmin(ns.ns).create_topic(src, 2))
    ns.runner.call(TopicAdmin(ns.ns).create_topic(dst, 2))
    for p in range(2):
        with ns.open_writer(f"{src}~{p}") as writer:
            writer.write_many(
                [LogRecord(f"{p}-{i}".encode(), key=f"k{i}".encode()) for i in range(RECORDS // 2)]
            )
    script, log = tmp_path / "driver.py", tmp_path / "drivers.log"
    script.write_text(DRIVER)
    base = [bookie_cluster.zk, bookie_cluster.root, src, dst, str(tmp_path / "ckpt")]

    kills = []
    for parts in ("1", "4"):
        proc = _start(drivers, script, [*base, parts, "time"], log)
        kills.append(_kill_mid_batch(ns, dst, proc, log))
    assert 0 < kills[0] < kills[1] < RECORDS, kills  # both drivers died part-way
    proc = _start(drivers, script, [*base, "3", "now"], log)
    assert proc.wait(timeout=scaled(RUN_TIMEOUT_S)) == 0, log.read_text()[-4000:]

    got: collections.Counter[bytes] = collections.Counter()
    for p in range(2):
        info = ns.stream_info(f"{dst}~{p}")
        for seg in ns.segments(f"{dst}~{p}"):
            for lo in range(0, seg.last_entry_id + 1, 256):
                for rec in ns.read_entries(
                    f"{dst}~{p}", seg.seqno, lo, min(lo + 255, seg.last_entry_id)
                ):
                    got[rec.payload] += 1
        assert info.record_count > 0
    expected = collections.Counter(
        f"{p}-{i}".encode() for p in range(2) for i in range(RECORDS // 2)
    )
    assert sum(got.values()) == RECORDS, (kills, sum(got.values()))
    assert got == expected, f"kills at {kills}: duplicates or losses"


@pytest.fixture
def ns_factory(bookie_cluster: Any) -> Iterator[Any]:
    from streams.sync import SyncNamespace

    with SyncNamespace.open(bookie_cluster.zk, bookie_cluster.root) as ns:
        yield ns
