"""``bookline bench spark``: batch read through Spark vs the core library.

Writes ``--records`` records of ``--record-size`` bytes into one stream (segments
rolled every ``--segment-records`` records so the read has several segments), then
reads all of it:

* ``core_read_entries``: the core library, one thread, ``read_entries`` over every
  segment (what a Spark task does, minus Spark), before and after the Spark reads
  (``spark_arrow_vs_core_read_entries`` is Spark's rate over their mean);
* ``core_reader``: the core library, one thread, a ``LogReader`` from the earliest
  record (``read_many``);
* ``spark_arrow`` / ``spark_tuples``: ``spark.read.format("bookline")`` on
  ``local[--cores]``, tasks yielding Arrow record batches or Python tuples, forcing
  every value to be read (``sum(length(value))``).

Then writes ``--write-records`` rows of ``--record-size`` bytes with
``df.write.format("bookline")`` into ``--write-streams`` streams (a ``stream`` column),
``--write-partitions`` Spark partitions, twice, each into fresh streams:

* ``write_sorted``: partition ``i`` holds the rows of stream ``i`` only (as after
  sorting by stream);
* ``write_interleaved``: row ``n`` goes to stream ``n % streams`` (every task writes
  every stream, rows alternating).

``--spark-reads N`` repeats the Arrow read N times (the report gives each rate and
ratio and uses the median); ``--no-writes`` leaves the write cases out. With each Arrow
read the CPU seconds per 1,000,000 records of each kind of process are reported
(``/proc``: the Spark JVM, its Python workers -- the daemon, its forked workers and the
children they reaped --, the bookies; the core read's own process for
``core_read_entries``): less sensitive than wall time to neighbours on a shared machine.

Starts its own ZooKeeper + 3 bookies in a temporary directory unless ``--cluster``
names a running cluster's ``cluster.json``. Spark's JVM and the cluster are stopped at
the end, also on failure.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

from ops.bench.common import local_cluster

# Records per write_many call while loading the data.
LOAD_BATCH_RECORDS = 5_000
_TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def _load(ns: Any, stream: str, records: int, size: int, segment_records: int) -> float:
    from streams.records import LogRecord

    payload = b"x" * size
    t0 = time.perf_counter()
    written = 0
    while written < records:
        writer = ns.open_writer(stream, identity="bench-spark-loader")
        try:
            goal = min(records, written + segment_records)
            while written < goal:
                n = min(LOAD_BATCH_RECORDS, goal - written)
                writer.write_many([LogRecord(payload) for _ in range(n)])
                written += n
        finally:
            writer.close()  # closing seals the segment: the next writer rolls a new one
    return time.perf_counter() - t0


def _core_read_entries(ns: Any, stream: str) -> tuple[int, float, float]:
    """Records, seconds, CPU seconds of this process (with the namespace's loop thread)."""
    t0, c0 = time.perf_counter(), time.process_time()
    count = 0
    for seg in ns.segments(stream):
        for lo in range(0, seg.last_entry_id + 1, 512):
            hi = min(seg.last_entry_id, lo + 511)
            count += len(ns.read_entries(stream, seg.seqno, lo, hi))
    return count, time.perf_counter() - t0, time.process_time() - c0


def _proc_stat(pid: int) -> tuple[int, float, float] | None:
    """(parent pid, own CPU s, CPU s of reaped children) of ``pid``; None if gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    f = stat[stat.rindex(")") + 2 :].split()
    own = (int(f[11]) + int(f[12])) / _TICKS_PER_S
    return int(f[1]), own, (int(f[13]) + int(f[14])) / _TICKS_PER_S


def _cpu_by_kind(jvm_pid: int, bookie_pids: list[int]) -> dict[str, float]:
    """CPU seconds so far of the Spark JVM, of its descendant (Python) processes
    including the children they reaped, and of the bookies."""
    stats = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and (st := _proc_stat(int(entry.name))) is not None:
            stats[int(entry.name)] = st
    below: set[int] = set()
    frontier = [jvm_pid]
    while frontier:
        parent = frontier.pop()
        kids = [pid for pid, st in stats.items() if st[0] == parent and pid not in below]
        below.update(kids)
        frontier += kids
    jvm = stats.get(jvm_pid)
    return {
        "jvm": jvm[1] if jvm else 0.0,
        "python_workers": sum(stats[p][1] + stats[p][2] for p in below),
        "bookies": sum(stats[p][1] for p in bookie_pids if p in stats),
    }


def _jvm_pid() -> int:
    from pyspark import SparkContext

    gateway = getattr(SparkContext, "_gateway", None)
    proc = getattr(gateway, "proc", None)
    if proc is None:
        raise RuntimeError("no Spark JVM process to account CPU to")
    return int(proc.pid)


def _bookie_pids(cluster_file: str) -> list[int]:
    spec = json.loads(Path(cluster_file).read_text())
    return [int(b["pid"]) for b in spec.get("bookies", []) if b.get("pid")]


def _core_reader(ns: Any, stream: str, total: int) -> tuple[int, float]:
    t0 = time.perf_counter()
    reader = ns.open_reader(stream, "earliest")
    count = 0
    try:
        while count < total:
            batch = reader.read_many(10_000, timeout_s=30.0)
            if not batch:
                raise RuntimeError(f"reader stalled at {count} of {total} records")
            count += len(batch)
    finally:
        reader.close()
    return count, time.perf_counter() - t0


def _spark_read(spark: Any, cluster: str, stream: str, arrow: bool) -> tuple[int, float, int]:
    from pyspark.sql import functions as F

    df = (
        spark.read.format("bookline")
        .option("cluster", cluster)
        .option("stream", stream)
        .option("arrow", str(arrow).lower())
        .load()
    )
    t0 = time.perf_counter()
    row = df.agg(F.count(F.lit(1)).alias("n"), F.sum(F.length("value")).alias("b")).first()
    elapsed = time.perf_counter() - t0
    return int(row["n"]), elapsed, df.rdd.getNumPartitions()


def _spark_write(spark: Any, cluster: str, prefix: str, args: argparse.Namespace,
                 interleaved: bool) -> float:  # fmt: skip
    n, streams = args.write_records, args.write_streams
    route = f"id % {streams}" if interleaved else f"floor(id * {streams} / {n})"
    df = spark.range(n, numPartitions=args.write_partitions).selectExpr(
        f"concat('{prefix}-', CAST({route} AS STRING)) AS stream",
        f"CAST(repeat('x', {args.record_size}) AS BINARY) AS value",
    )
    t0 = time.perf_counter()
    df.write.format("bookline").option("cluster", cluster).mode("append").save()
    return time.perf_counter() - t0


def _rate(count: int, seconds: float) -> float:
    return round(count / seconds, 1) if seconds > 0 else 0.0


def run(args: argparse.Namespace) -> dict[str, Any]:
    from pipeline.session import local_session, stop_session
    from streams.sync import SyncNamespace

    stream = f"bench-spark-{int(time.time())}"
    with contextlib.ExitStack() as stack:
        cluster_file = str(stack.enter_context(local_cluster(args)))
        ns = SyncNamespace.from_cluster_file(cluster_file)
        stack.callback(ns.close)
        ns.create_stream(stream)
        load_s = _load(ns, stream, args.records, args.record_size, args.segment_records)
        n_entries, t_entries, c_entries = _core_read_entries(ns, stream)
        n_reader, t_reader = _core_reader(ns, stream, args.records)
        spark = local_session("bookline-bench", cores=args.cores)
        stack.callback(stop_session, spark)
        _spark_read(spark, cluster_file, stream, True)  # warm up: JVM, Python workers
        jvm, bookies = _jvm_pid(), _bookie_pids(cluster_file)
        arrow: list[tuple[int, float, dict[str, float]]] = []
        for _ in range(args.spark_reads):
            before = _cpu_by_kind(jvm, bookies)
            n_arrow, t_arrow, parts = _spark_read(spark, cluster_file, stream, True)
            after = _cpu_by_kind(jvm, bookies)
            arrow.append((n_arrow, t_arrow, {k: after[k] - before[k] for k in after}))
        n_tuples, t_tuples, _parts = _spark_read(spark, cluster_file, stream, False)
        # The core again, after Spark: on a shared machine the load drifts, and the
        # ratio compares Spark with the mean of the two core reads around it.
        n_entries2, t_entries2, c_entries2 = _core_read_entries(ns, stream)
        writes: dict[str, float] = {}
        for case in ("sorted", "interleaved") if args.writes else ():
            prefix = f"{stream}-w{case[0]}"
            writes[case] = _spark_write(spark, cluster_file, prefix, args, case == "interleaved")
            written = sum(
                ns.stream_info(f"{prefix}-{i}").record_count for i in range(args.write_streams)
            )
            if written != args.write_records:
                raise RuntimeError(f"write_{case} wrote {written} of {args.write_records}")
    for name, n in (
        ("core_read_entries", n_entries),
        ("core_read_entries_after", n_entries2),
        ("core_reader", n_reader),
        *(("spark_arrow", n) for n, _t, _c in arrow),
        ("spark_tuples", n_tuples),
    ):
        if n != args.records:
            raise RuntimeError(f"{name} read {n} records, expected {args.records}")
    core_s = (t_entries + t_entries2) / 2
    t_arrow = statistics.median(t for _n, t, _c in arrow)
    per_m = 1e6 / args.records
    report = {
        "bench": "spark",
        "records": args.records,
        "record_bytes": args.record_size,
        "segments": -(-args.records // args.segment_records),
        "spark_cores": args.cores,
        "spark_partitions": parts,
        "load_records_per_s": _rate(args.records, load_s),
        "core_read_entries_records_per_s": _rate(n_entries, t_entries),
        "core_read_entries_after_records_per_s": _rate(n_entries2, t_entries2),
        "core_reader_records_per_s": _rate(n_reader, t_reader),
        "spark_arrow_records_per_s": _rate(n_arrow, t_arrow),
        "spark_tuples_records_per_s": _rate(n_tuples, t_tuples),
        "spark_arrow_vs_core_read_entries": round(core_s / t_arrow, 2) if t_arrow else 0.0,
        "spark_arrow_runs_records_per_s": [_rate(n, t) for n, t, _c in arrow],
        "spark_arrow_runs_vs_core_read_entries": [round(core_s / t, 2) for _n, t, _c in arrow],
        "cpu_s_per_1m_records": {
            "core_read_entries": round((c_entries + c_entries2) / 2 * per_m, 2),
            **{
                f"spark_arrow_{kind}": round(
                    statistics.median(c[kind] for *_x, c in arrow) * per_m, 2
                )
                for kind in arrow[0][2]
            },
        },
    }
    if not args.writes:
        return report
    return report | {
        "write_records": args.write_records,
        "write_streams": args.write_streams,
        "write_partitions": args.write_partitions,
        "write_sorted_s": round(writes["sorted"], 3),
        "write_interleaved_s": round(writes["interleaved"], 3),
        "write_sorted_records_per_s": _rate(args.write_records, writes["sorted"]),
        "write_interleaved_records_per_s": _rate(args.write_records, writes["interleaved"]),
        "write_interleaved_vs_sorted": round(writes["interleaved"] / writes["sorted"], 2),
    }


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--cluster", default=None, help="cluster.json of a running cluster (default: start our own)"
    )
    p.add_argument("--records", type=int, default=1_000_000, help="records to write and read")
    p.add_argument("--record-size", type=int, default=100, help="bytes per record")
    p.add_argument(
        "--segment-records",
        type=int,
        default=250_000,
        help="records per segment (a writer per segment)",
    )
    p.add_argument("--cores", type=int, default=2, help="Spark local[N]")
    p.add_argument("--write-records", type=int, default=500_000, help="rows per write case")
    p.add_argument("--write-streams", type=int, default=4, help="target streams of a write")
    p.add_argument("--write-partitions", type=int, default=4, help="Spark partitions")
    p.add_argument("--dir", default=None, help="state directory (default: a temp dir)")
    p.add_argument(
        "--spark-reads", type=int, default=1, help="Arrow reads to time (the median counts)"
    )
    p.add_argument(
        "--no-writes", dest="writes", action="store_false", help="leave the write cases out"
    )
