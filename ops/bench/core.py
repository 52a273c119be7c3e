"""``bookline bench write|e2e|read``: the core library (log streams) end to end.

Each starts ZooKeeper + 3 bookies (real processes, fsync'd journals) in a temporary
directory unless ``--cluster`` names a running cluster's ``cluster.json``; streams use
E=Qw=3, Qa=2 and 100-byte records by default. The writer and reader run in this
process, on uvloop when installed.

* ``write``: ``write_many`` batches of ``--batch`` records (default), or per-record
  ``write_nowait`` with ``--inflight`` records outstanding (``--per-record``). Latency:
  per batch call, or per record from the call to its DLSN; ``writer_cpu_s_per_million``:
  this (the writer's) process's CPU seconds per million records while timed.
* ``e2e``: an open loop of ``--rate`` records/s, sent every ``--pacer-tick-ms`` (the
  records that fell due); a tailing reader in its own process (``--same-process``: in
  the writer's) measures from the record's *scheduled* write time to its arrival (a
  stall, and the tick's lateness, are charged to every record they delay); the
  writer's acknowledgement latency is reported too (``ack_*``), and the CPU each role's
  processes used while records were timed (``cpu_pct``, % of one core; per record in
  ``cpu_us_per_record``) and how long their threads waited for a core meanwhile
  (``run_queue_us_per_record``); ``--profile DIR`` samples each process with py-spy meanwhile
  (:mod:`ops.bench.profiling`).
* ``read``: writes ``--records`` records first, then times a catch-up reader from the
  earliest position.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import contextvars
import functools
import multiprocessing
import os
import struct
import time
from collections.abc import Callable, Iterator, Sequence
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any, Protocol

from foundation.gctune import settle_heap
from ops.bench.common import Answers, latency_summary
from ops.bench.cpu import CpuWindow, bookie_requests
from ops.bench.pacing import open_loop

if TYPE_CHECKING:
    from streams.config import NamespaceConfig
    from streams.dlsn import DLSN
    from streams.namespace import Namespace
    from streams.reader import LogReader


_STAMP = struct.Struct(">d")


@contextlib.contextmanager
def cluster_layout(args: argparse.Namespace) -> Iterator[dict[str, Any]]:
    """``{"zk", "root"}`` of the cluster to use: --cluster, or 3 bookies we start."""
    from ops.cluster.local import bench_cluster

    with bench_cluster(args, bookies=3, prefix="bl-core-") as layout:
        yield layout


def _timer(latencies: list[float], started: float) -> Callable[[object], None]:
    """A done-callback recording the time since ``started``. One small object per call
    (a partial; a closure costs a function, two cells and a tuple): the per-record
    benchmark keeps 20,000 of them alive, and the cyclic GC walks each on every pass."""
    return functools.partial(_record_since, latencies, started)


def _record_since(latencies: list[float], started: float, _fut: object) -> None:
    latencies.append(time.perf_counter() - started)


# The benchmarks' done-callbacks run in one shared context: without ``context=``,
# add_done_callback copies the current context for every record (another object
# the GC walks while the record is in flight).
_CALLBACK_CONTEXT = contextvars.copy_context()


def _config(args: argparse.Namespace) -> NamespaceConfig:
    from streams.config import NamespaceConfig

    return NamespaceConfig(
        compression=args.compression,
        flush_interval_ms=args.flush_interval_ms,
        control_interval_ms=args.control_interval_ms,
        idle_pipe_entries=args.idle_pipe_entries,
    )


async def _open(layout: dict[str, Any], args: argparse.Namespace) -> tuple[Namespace, str]:
    from streams.namespace import Namespace

    ns = await Namespace.open(layout["zk"], layout["root"], "bench", _config(args))
    stream = f"{args.bench}-{os.getpid()}-{int(time.time() * 1000)}"
    await ns.create_stream(stream)
    return ns, stream


async def _write_many(ns: Namespace, stream: str, args: argparse.Namespace) -> dict[str, Any]:
    from streams.records import LogRecord

    payload = os.urandom(args.record_size)
    records = [LogRecord(payload) for _ in range(args.batch)]
    latencies: list[float] = []
    w = await ns.open_writer(stream)
    try:
        await w.write_many(records[:1000])  # warm up connections and code paths
        inflight: set[asyncio.Task[Sequence[DLSN]]] = set()
        settle_heap()  # as the other benchmarks do before they measure
        t0, cpu0 = time.perf_counter(), time.process_time()
        for _ in range(args.records // args.batch):
            started = time.perf_counter()
            task = asyncio.ensure_future(w.write_many(records))
            task.add_done_callback(_timer(latencies, started), context=_CALLBACK_CONTEXT)
            inflight.add(task)
            task.add_done_callback(inflight.discard)
            if len(inflight) >= args.batches_in_flight:
                await asyncio.wait(inflight, return_when=asyncio.FIRST_COMPLETED)
        await asyncio.gather(*inflight)
        elapsed, cpu_s = time.perf_counter() - t0, time.process_time() - cpu0
    finally:
        await w.close()
    n = (args.records // args.batch) * args.batch
    return {"records": n, "elapsed_s": round(elapsed, 3), "records_per_s": round(n / elapsed, 1),
            **_writer_cpu(cpu_s, n), **latency_summary(latencies)}  # fmt: skip


async def _write_each(ns: Namespace, stream: str, args: argparse.Namespace) -> dict[str, Any]:
    from streams.records import LogRecord

    payload = os.urandom(args.record_size)
    latencies: list[float] = []
    w = await ns.open_writer(stream)
    try:
        await w.write(LogRecord(payload))
        # The window: at most --inflight records outstanding (a deque, not an
        # asyncio.Queue, whose bookkeeping cost more than the write being measured).
        window: collections.deque[asyncio.Future[DLSN]] = collections.deque()
        settle_heap()  # as the other benchmarks do before they measure
        t0, cpu0 = time.perf_counter(), time.process_time()
        for _ in range(args.records):
            if len(window) >= args.inflight:
                await window.popleft()
            started = time.perf_counter()
            fut = w.write_nowait(LogRecord(payload))
            fut.add_done_callback(_timer(latencies, started), context=_CALLBACK_CONTEXT)
            window.append(fut)
        while window:
            await window.popleft()
        elapsed, cpu_s = time.perf_counter() - t0, time.process_time() - cpu0
    finally:
        await w.close()
    return {"records": args.records, "elapsed_s": round(elapsed, 3),
            "records_per_s": round(args.records / elapsed, 1),
            **_writer_cpu(cpu_s, args.records), **latency_summary(latencies)}  # fmt: skip


def _writer_cpu(cpu_s: float, records: int) -> dict[str, float]:
    """CPU (user + system, every thread) of this process -- the writer -- over the timed
    window: less sensitive than records/s to neighbours sharing the cores, which stretch
    the wall time but not the work per record."""
    return {"writer_cpu_s": round(cpu_s, 3),
            "writer_cpu_s_per_million": round(cpu_s / records * 1e6, 3)}  # fmt: skip


async def _e2e(ns: Namespace, stream: str, args: argparse.Namespace,
               layout: dict[str, Any]) -> dict[str, Any]:  # fmt: skip
    from streams.records import LogRecord

    w = await ns.open_writer(stream)
    filler = os.urandom(max(0, args.record_size - _STAMP.size))
    total = int(args.rate * args.duration_s)
    await w.write(LogRecord(b"warm-up"))
    if args.same_process:
        consumer: _Consumer = _InProcessConsumer(ns, stream, total)
    else:
        consumer = _ReaderProcess(layout, stream, total, args)
    acks = Answers(total)  # the writer's acknowledgements: durable on the ack quorum
    roles = {
        "writer": [os.getpid()],
        "reader": consumer.pids,
        "bookies": [b["pid"] for b in layout.get("bookies", []) if "pid" in b],
        "zookeeper": [layout["zookeeper"]["pid"]] if "pid" in layout.get("zookeeper", {}) else [],
    }  # fmt: skip
    cpu = CpuWindow(roles)
    metrics = [b["metrics"] for b in layout.get("bookies", []) if "metrics" in b]
    requests_before: dict[str, float] = {}
    profiles = None
    if args.profile:
        from pathlib import Path

        from ops.bench.profiling import Profiles

        del roles["zookeeper"]
        profiles = Profiles(roles, args.duration_s * 0.8, Path(args.profile))

    def send(scheduled: float) -> None:
        fut = w.write_nowait(LogRecord(_STAMP.pack(scheduled) + filler))
        fut.add_done_callback(functools.partial(acks.record, started=scheduled))

    try:
        await consumer.ready()
        requests_before = bookie_requests(metrics)
        cpu.start()
        if profiles is not None:
            profiles.start()
        start = await open_loop(args.rate, total, send, tick_s=args.pacer_tick_ms / 1000.0)
        await acks.finished
        latency = await consumer.result(timeout_s=60)
        elapsed = time.perf_counter() - start
        cpu_pct = cpu.stop()
        requests = bookie_requests(metrics)
    finally:
        if profiles is not None:
            profiles.stop()
        await consumer.stop()
        await w.close()
    ack = {f"ack_{k}": v for k, v in latency_summary(acks.latencies).items()}
    # CPU per record: % of a core is centiseconds per second, over records per second.
    per_record = {role: round(pct * 1e4 / args.rate, 1) for role, pct in cpu_pct.items()}
    # ... and the time each role's threads were ready but waited for a core.
    queued = {role: round(pct * 1e4 / args.rate, 1) for role, pct in cpu.waited.items()}
    # What the bookies answered meanwhile: ADDs (3 per entry: E=Qw=3), long polls, LACs.
    answered: dict[str, float] = {op: round(n - requests_before.get(op, 0.0))
                                  for op, n in requests.items()
                if n - requests_before.get(op, 0.0) > 0}  # fmt: skip
    adds = answered.get("ADD", 0)
    if adds:
        per_record["bookie_per_add"] = round(cpu_pct.get("bookies", 0.0) / 100 * elapsed
                                             / adds * 1e6, 1)  # fmt: skip
        answered["records_per_entry"] = round(total / (adds / 3), 2)
    return {"records": total, "rate": args.rate, "elapsed_s": round(elapsed, 3),
            "records_per_s": round(total / elapsed, 1),
            "reader": "same process" if args.same_process else "own process",
            **latency, **ack, "cpu_pct": cpu_pct, "cpu_us_per_record": per_record,
            "run_queue_us_per_record": queued,
            "bookie_requests": answered,
            **({"profile": profiles.summary()} if profiles is not None else {})}  # fmt: skip


async def _tail_latencies(reader: LogReader, total: int, ready: Callable[[], None]) -> list[float]:
    """Skip the warm-up record, say ready, then time ``total`` records from their
    scheduled write time (the stamp) to their arrival here."""
    await reader.read_next(30)
    settle_heap()  # as the writer's side does before its open loop
    ready()
    latencies: list[float] = []
    perf, unpack = time.perf_counter, _STAMP.unpack_from
    while len(latencies) < total:
        for rec in await reader.read_many(10_000):
            latencies.append(perf() - unpack(rec.payload or b"")[0])
    return latencies


class _Consumer(Protocol):
    pids: list[int]  # its own processes (none when it runs in the writer's)

    async def ready(self) -> None: ...
    async def result(self, timeout_s: float) -> dict[str, float]: ...
    async def stop(self) -> None: ...


class _InProcessConsumer:
    """The tailing reader on this event loop (``--same-process``)."""

    def __init__(self, ns: Namespace, stream: str, total: int) -> None:
        self._ns, self._stream, self._total = ns, stream, total
        self.pids: list[int] = []
        self._ready = asyncio.Event()
        self._task: asyncio.Task[list[float]] | None = None

    async def ready(self) -> None:
        reader = await self._ns.open_reader(self._stream, "earliest")

        async def run() -> list[float]:
            try:
                return await _tail_latencies(reader, self._total, self._ready.set)
            finally:
                await reader.close()

        self._task = asyncio.ensure_future(run())
        await asyncio.wait_for(self._ready.wait(), 30)

    async def result(self, timeout_s: float) -> dict[str, float]:
        assert self._task is not None
        return latency_summary(await asyncio.wait_for(self._task, timeout_s))

    async def stop(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)


class _ReaderProcess:
    """The tailing reader in a process of its own, as a consumer usually runs: the
    writer's and the reader's event loops then use both cores instead of sharing one.
    Both processes read CLOCK_MONOTONIC (``perf_counter``), so stamps compare."""

    def __init__(self, layout: dict[str, Any], stream: str, total: int,
                 args: argparse.Namespace) -> None:  # fmt: skip
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(
            target=_reader_process_main,
            args=(layout["zk"], layout["root"], stream, total, child),
            name="bench-e2e-reader",
            daemon=True,
        )
        self._proc.start()
        child.close()
        assert self._proc.pid is not None
        self.pids = [self._proc.pid]

    async def _recv(self, timeout_s: float) -> Any:
        if not await asyncio.to_thread(self._conn.poll, timeout_s):
            raise TimeoutError(f"the reader process said nothing for {timeout_s} s")
        msg = self._conn.recv()
        if isinstance(msg, BaseException):
            raise msg
        return msg

    async def ready(self) -> None:
        assert await self._recv(60) == "ready"

    async def result(self, timeout_s: float) -> dict[str, float]:
        summary: dict[str, float] = await self._recv(timeout_s)
        return summary

    async def stop(self) -> None:
        """Stopped by pid, also when the benchmark failed."""
        await asyncio.to_thread(self._proc.join, 5)
        if self._proc.is_alive():
            self._proc.kill()
            await asyncio.to_thread(self._proc.join, 5)
        self._conn.close()


def _reader_process_main(zk: str, root: str, stream: str, total: int, conn: Connection) -> None:
    from ops.bench.common import asyncio_run

    async def main() -> dict[str, float]:
        from streams.config import NamespaceConfig
        from streams.namespace import Namespace

        ns = await Namespace.open(zk, root, "bench", NamespaceConfig())
        try:
            reader = await ns.open_reader(stream, "earliest")
            try:
                latencies = await _tail_latencies(reader, total, lambda: conn.send("ready"))
            finally:
                await reader.close()
        finally:
            await ns.close()
        return latency_summary(latencies)

    try:
        conn.send(asyncio_run(main()))
    except BaseException as exc:  # reported to the parent, which raises it
        conn.send(RuntimeError(f"reader process failed: {exc!r}"))
        raise
    finally:
        conn.close()


async def _read(ns: Namespace, stream: str, args: argparse.Namespace) -> dict[str, Any]:
    from streams.records import LogRecord

    payload = os.urandom(args.record_size)
    w = await ns.open_writer(stream)
    batch = [LogRecord(payload) for _ in range(10_000)]
    for _ in range(args.records // len(batch)):
        await w.write_many(batch)
    await w.close()
    n = (args.records // len(batch)) * len(batch)
    reader = await ns.open_reader(stream, "earliest")
    latencies: list[float] = []
    got = 0
    settle_heap()  # as the other benchmarks do before they measure
    t0 = time.perf_counter()
    try:
        while got < n:
            started = time.perf_counter()
            got += len(await reader.read_many(10_000, timeout_s=30))
            latencies.append(time.perf_counter() - started)
        elapsed = time.perf_counter() - t0
    finally:
        await reader.close()
    return {"records": n, "elapsed_s": round(elapsed, 3), "records_per_s": round(n / elapsed, 1),
            **latency_summary(latencies)}  # fmt: skip


async def _bench(layout: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    ns, stream = await _open(layout, args)
    try:
        if args.bench == "write":
            result = await (_write_each if args.per_record else _write_many)(ns, stream, args)
        elif args.bench == "e2e":
            result = await _e2e(ns, stream, args, layout)
        else:
            result = await _read(ns, stream, args)
        await ns.delete_stream(stream)
    finally:
        await ns.close()
    mode = "per-record" if getattr(args, "per_record", False) else "write_many"
    return {"bench": args.bench, "record_size": args.record_size,
            **({"mode": mode} if args.bench == "write" else {}), **result}  # fmt: skip


def run(args: argparse.Namespace) -> dict[str, Any]:
    from ops.bench.common import asyncio_run

    with cluster_layout(args) as layout:
        return asyncio_run(_bench(layout, args))


def add_arguments(p: argparse.ArgumentParser, kind: str) -> None:
    p.add_argument("--cluster", default=None,
                   help="cluster.json of a running cluster (default: start our own)")  # fmt: skip
    p.add_argument("--dir", default=None, help="state directory (default: a temp dir)")
    p.add_argument("--record-size", type=int, default=100, help="bytes per record")
    p.add_argument("--compression", default="none", choices=("none", "lz4", "zstd"))
    p.add_argument("--flush-interval-ms", type=int, default=1, help="writer buffer timer")
    p.add_argument("--idle-pipe-entries", type=int, default=2,
                   help="entries in flight below which a write is sent at once")  # fmt: skip
    p.add_argument("--control-interval-ms", type=int, default=2,
                   help="idle time before a control record advances the LAC")  # fmt: skip
    if kind == "write":
        p.add_argument("--records", type=int, default=1_000_000, help="records to write")
        p.add_argument("--per-record", action="store_true",
                       help="single-record writes (write_nowait), not write_many")  # fmt: skip
        p.add_argument("--batch", type=int, default=10_000, help="records per write_many")
        p.add_argument("--batches-in-flight", type=int, default=4, help="write_many calls")
        p.add_argument("--inflight", type=int, default=20_000,
                       help="per-record mode: records outstanding")  # fmt: skip
    elif kind == "e2e":
        p.add_argument("--rate", type=float, default=10_000.0, help="records/s (open loop)")
        p.add_argument("--same-process", action="store_true",
                       help="tail in the writer's process (default: a reader process)")  # fmt: skip
        p.add_argument("--duration-s", type=float, default=10.0, help="how long to write")
        p.add_argument("--profile", default=None,
                       help="py-spy each process while timing; raw stacks go to this "
                            "directory, a per-role summary into the JSON")  # fmt: skip
        p.add_argument("--pacer-tick-ms", type=float, default=0.5,
                       help="send what fell due every this often; latency still counts "
                            "from each record's own scheduled time")  # fmt: skip
    else:
        p.add_argument("--records", type=int, default=1_000_000, help="records to read")
