"""``bookline bench …``: benchmarks that print one JSON object as the last stdout line.

Each benchmark lives in its own module (``ops/bench_*.py``) and is registered here.
Throughput and latency targets are checked by running these, never by timing
assertions in tests; figures go to ``docs/benchmarks.md``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

Runner = Callable[[argparse.Namespace], dict[str, Any]]


def percentile_ms(sorted_seconds: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of sorted durations in seconds, returned in ms."""
    if not sorted_seconds:
        return 0.0
    rank = max(1, math.ceil(q * len(sorted_seconds)))
    return round(sorted_seconds[rank - 1] * 1000.0, 3)


def latency_summary(latencies_s: list[float]) -> dict[str, float]:
    latencies_s.sort()
    return {
        "p50_ms": percentile_ms(latencies_s, 0.50),
        "p99_ms": percentile_ms(latencies_s, 0.99),
        "p999_ms": percentile_ms(latencies_s, 0.999),
        "max_ms": round(latencies_s[-1] * 1000.0, 3) if latencies_s else 0.0,
    }


class Answers:
    """Latencies of ``count`` operations; ``finished`` resolves once all are answered,
    or with the first error (later answers are then ignored). Counts instead of keeping
    every future: 100,000 live futures made the benchmark's own garbage collections
    stall its event loop for ~300 ms (charged to the system under test)."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.answered = 0
        self.latencies: list[float] = []
        self.finished: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def record(self, fut: asyncio.Future[Any], started: float) -> bool:
        """Count one answer (an add's done-callback); True while more are awaited."""
        if self.finished.done():
            return False
        exc = fut.exception()
        if exc is not None:
            self.finished.set_exception(exc)
            return False
        self.latencies.append(time.perf_counter() - started)
        self.answered += 1
        if self.answered == self.count:
            self.finished.set_result(None)
            return False
        return True


def emit(result: dict[str, Any], as_json: bool) -> None:
    if not as_json:
        for key, value in result.items():
            print(f"{key:>28}: {value}")
    # The contract: the last line of stdout is one JSON object.
    print(json.dumps(result, sort_keys=True), flush=True)


def _run_machine(_args: argparse.Namespace) -> dict[str, Any]:
    from ops import bench_machine

    return bench_machine.measure()


def _run_disk(args: argparse.Namespace) -> dict[str, Any]:
    from pathlib import Path

    from ops import bench_disk

    return bench_disk.measure(Path(args.dir) if args.dir else None)


def _run_bookie(args: argparse.Namespace) -> dict[str, Any]:
    from ops import bench_bookie

    return bench_bookie.run(args)


def _run_ledger(args: argparse.Namespace) -> dict[str, Any]:
    from ops import bench_ledger

    return bench_ledger.run(args)


def _run_spark(args: argparse.Namespace) -> dict[str, Any]:
    from ops import bench_spark

    return bench_spark.run(args)


def _run_proxy(args: argparse.Namespace) -> dict[str, Any]:
    from ops import bench_proxy

    return bench_proxy.run(args)


def _run_core(args: argparse.Namespace) -> dict[str, Any]:
    from ops import bench_core

    return bench_core.run(args)


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
    from ops.bench_spark import add_arguments as spark_arguments

    spark_arguments(p_spark)

    from ops.bench_proxy import add_arguments as proxy_arguments

    proxy_arguments(add("proxy", _run_proxy, "thin client through one write proxy + read proxy"))

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
    from ops.bench_core import add_arguments as add_core_arguments

    for name, what in (
        ("write", "stream writes: write_many batches (or --per-record)"),
        ("e2e", "write -> tailing reader latency at a fixed rate"),
        ("read", "catch-up read of a stream from the bookies"),
    ):
        add_core_arguments(add(name, _run_core, what), name)


def _main(runner: Runner, args: argparse.Namespace) -> int:
    emit(runner(args), as_json=bool(args.json))
    return 0
