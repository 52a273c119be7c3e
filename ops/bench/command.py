"""``bookline bench …``: benchmarks that print one JSON object as the last stdout line.

Each benchmark lives in its own module (``ops/bench/*.py``) and is registered here;
what they share (percentiles, answer counting, output, the event loop) is in
:mod:`ops.bench.common`.
Throughput and latency targets are checked by running these, never by timing
assertions in tests; figures go to ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from ops.bench.common import emit

Runner = Callable[[argparse.Namespace], dict[str, Any]]


def _run_machine(_args: argparse.Namespace) -> dict[str, Any]:
    from ops.bench import machine

    return machine.measure()


def _run_disk(args: argparse.Namespace) -> dict[str, Any]:
    from pathlib import Path

    from ops.bench import disk

    return disk.measure(Path(args.dir) if args.dir else None)


def _run_bookie(args: argparse.Namespace) -> dict[str, Any]:
    from ops.bench import bookie

    return bookie.run(args)


def _run_ledger(args: argparse.Namespace) -> dict[str, Any]:
    from ops.bench import ledger

    return ledger.run(args)


def _run_spark(args: argparse.Namespace) -> dict[str, Any]:
    from ops.bench import spark

    return spark.run(args)


def _run_proxy(args: argparse.Namespace) -> dict[str, Any]:
    from ops.bench import proxy

    return proxy.run(args)


def _run_compact(args: argparse.Namespace) -> dict[str, Any]:
    from ops.bench import compact

    return compact.run(args)


def _run_produce(args: argparse.Namespace) -> dict[str, Any]:
    from ops.bench import produce

    return produce.run(args)


def _run_consume(args: argparse.Namespace) -> dict[str, Any]:
    from ops.bench import consume

    return consume.run(args)


def _run_compare(args: argparse.Namespace) -> dict[str, Any]:
    from ops.bench.compare import run as compare

    return compare.run(args)


def _run_scale(args: argparse.Namespace) -> dict[str, Any]:
    from ops.bench import scale

    return scale.run(args)


def _run_core(args: argparse.Namespace) -> dict[str, Any]:
    from ops.bench import core

    return core.run(args)


def _run_kafka(args: argparse.Namespace) -> dict[str, Any]:
    from ops.bench import kafka

    return kafka.run(args)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    bench = sub.add_parser("bench", help="benchmarks (last stdout line: one JSON object)")
    kinds = bench.add_subparsers(dest="bench", metavar="KIND", required=True)

    def add(name: str, runner: Runner, help_text: str) -> argparse.ArgumentParser:
        p = kinds.add_parser(name, help=help_text)
        p.add_argument("--json", action="store_true", help="print only the JSON line")
        p.set_defaults(handler=lambda args: _main(runner, args))
        return p

    add("machine", _run_machine, "CPU yardsticks: Python loop, system call, process round trip")
    p_disk = add("disk", _run_disk, "raw disk limits: fsync'd sequential write, fsync latency")
    p_disk.add_argument("--dir", default=None, help="directory on the disk to measure")

    p_spark = add(
        "spark", _run_spark, "batch read through Spark local[N] vs the core library single-threaded"
    )
    from ops.bench.spark import add_arguments as spark_arguments

    spark_arguments(p_spark)

    from ops.bench.proxy import add_arguments as proxy_arguments

    proxy_arguments(add("proxy", _run_proxy, "thin client through one write proxy + read proxy"))
    from ops.bench.consume import add_arguments as consume_arguments

    consume_arguments(add("consume", _run_consume, "consumer groups: core, read proxy, rebalance"))
    from ops.bench.compare.run import add_arguments as compare_arguments

    compare_arguments(
        add("compare", _run_compare, "Bookline vs NATS JetStream vs Redis Streams, one run")
    )
    from ops.bench.scale import add_arguments as scale_arguments

    scale_arguments(add("scale", _run_scale, "curves: data stored 100 MB -> 10 GB, readers"))
    from ops.bench.compact import add_arguments as compact_arguments

    compact_arguments(
        add("compact", _run_compact, "compaction: records per second, bytes reclaimed")
    )
    from ops.bench.produce import add_arguments as produce_arguments

    produce_arguments(
        add("produce", _run_produce, "keyed sends to a topic through the thin client")
    )

    from ops.bench.kafka import add_arguments as kafka_arguments

    kafka_arguments(
        add("kafka", _run_kafka, "librdkafka through the Kafka listener: produce, consume, latency")
    )

    for name, runner, what in (
        ("bookie", _run_bookie, "adds to one bookie from one pipelined client"),
        ("ledger", _run_ledger, "adds through the ledger client, E=Qw=3 Qa=2"),
    ):
        p = add(name, runner, what)
        p.add_argument(
            "--cluster",
            default=None,
            help="cluster.json of a running cluster (default: start our own)",
        )
        p.add_argument("--entries", type=int, default=100_000, help="entries to add")
        p.add_argument("--entry-size", type=int, default=100, help="bytes per entry")
        p.add_argument("--inflight", type=int, default=1000, help="adds in flight")
        p.add_argument(
            "--rate", type=float, default=0.0, help="open-loop adds/s (0 = as fast as possible)"
        )
        p.add_argument("--dir", default=None, help="state directory (default: a temp dir)")

    # The core library (log streams): write, e2e, read.
    from ops.bench.core import add_arguments as add_core_arguments

    for name, what in (
        ("write", "stream writes: write_many batches (or --per-record)"),
        ("e2e", "write -> tailing reader latency at a fixed rate"),
        ("read", "catch-up read of a stream from the bookies"),
    ):
        add_core_arguments(add(name, _run_core, what), name)


def _main(runner: Runner, args: argparse.Namespace) -> int:
    from ops.progress import progress

    # A spinner with the elapsed time on a terminal (stderr), nothing otherwise: the
    # longer benchmarks say nothing for minutes.
    with progress(f"bench {args.bench}"):
        result = runner(args)
    emit(result, as_json=bool(args.json))
    return 0
