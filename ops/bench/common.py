"""What every benchmark shares: percentiles, answer counting, the output contract
(the last stdout line is one JSON object) and the event loop they run on."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import tempfile
import time
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


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


def asyncio_run(coro: Coroutine[Any, Any, T]) -> T:
    """Run on uvloop when installed (as the servers do)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    result: T = uvloop.run(coro)
    return result


@contextlib.contextmanager
def local_cluster(
    args: argparse.Namespace,
    *,
    write_proxies: int = 0,
    read_proxies: int = 0,
    bookies: int = 3,
    kafka: bool = False,
) -> Iterator[Path]:
    """The cluster file a benchmark runs against: ``--cluster`` when given, else a local
    cluster started under ``--dir`` (or a temporary directory) and stopped after
    (``kafka``: its proxies with the Kafka listener on)."""
    from ops.cluster.local import LocalCluster  # a benchmark given --cluster starts none

    if args.cluster:
        yield Path(args.cluster)
        return
    with contextlib.ExitStack() as stack:
        base = args.dir or stack.enter_context(tempfile.TemporaryDirectory(prefix="bl-bench-"))
        cluster = LocalCluster(
            Path(base),
            bookies=bookies,
            write_proxies=write_proxies,
            read_proxies=read_proxies,
            kafka=kafka,
        )
        cluster.start()
        stack.callback(cluster.stop)
        yield cluster.dir / "cluster.json"


async def closed_loop(
    calls: int,
    outstanding: int,
    call: Callable[[int], Awaitable[object]],
    latencies: list[float] | None = None,
) -> float:
    """Make calls ``call(0)`` .. ``call(calls - 1)``, ``outstanding`` of them in flight at
    a time (each worker starts the next as its last is answered); the seconds they took.
    With ``latencies``, each call's duration is appended to it."""
    next_call = 0

    async def worker() -> None:
        nonlocal next_call
        while next_call < calls:
            i = next_call
            next_call += 1
            if latencies is None:
                await call(i)
                continue
            t0 = time.perf_counter()
            await call(i)
            latencies.append(time.perf_counter() - t0)

    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(outstanding)))
    return time.perf_counter() - start
