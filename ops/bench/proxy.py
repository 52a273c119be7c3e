"""``bookline bench proxy``: the thin client through one write proxy (and a read proxy).

Starts its own cluster (ZooKeeper, 3 bookies, one write proxy, one read proxy, each a
process) in a temporary directory unless ``--cluster`` names a running one. Modes:

* ``many`` (default): ``write_many`` of ``--batch`` records, ``--concurrency`` calls
  outstanding; latency is per call;
* ``single``: pipelined single ``write``s, ``--inflight`` outstanding; per record;
* ``rate``: open-loop single writes at ``--rate``/s; latency from the *scheduled*
  start, so a stall is charged to every write it delays;
* ``e2e``: a WebSocket tail through the read proxy while ``many`` writes; latency from
  the write's start to the record's arrival at the reader;
* ``cpu``: open-loop single writes at ``--rate`` for ``--seconds`` while a WebSocket
  tail in the same process reads them back: end-to-end latency, and the CPU each role
  (client, write proxy, read proxy, bookies) used per record (``--profile DIR``: py-spy
  of each process meanwhile, :mod:`ops.bench.profiling`);
* ``all``: every mode but ``cpu``; the last line carries ``many``'s figures plus each
  mode's.

Records are ``--record-size`` bytes (100 by default). The last stdout line is one JSON
object with ``records_per_s``, ``p50_ms`` and ``p99_ms``.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ops.bench.common import Answers, asyncio_run, closed_loop, latency_summary, local_cluster
from ops.bench.pacing import open_loop

if TYPE_CHECKING:
    from thinclient.client import ProxyClient


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--cluster", default=None, help="cluster.json of a running cluster")
    p.add_argument("--dir", default=None, help="state directory (default: a temp dir)")
    p.add_argument("--mode", default="many",
                   choices=["many", "single", "rate", "e2e", "cpu", "all"])  # fmt: skip
    p.add_argument("--profile", default=None, help="cpu mode: py-spy raw stacks go here")
    p.add_argument("--records", type=int, default=300_000, help="records to write (many)")
    p.add_argument("--record-size", type=int, default=100, help="bytes per record")
    p.add_argument("--batch", type=int, default=1_000, help="records per write_many call")
    p.add_argument("--concurrency", type=int, default=8, help="write_many calls outstanding")
    p.add_argument("--inflight", type=int, default=5_000, help="single writes outstanding")
    p.add_argument("--single-records", type=int, default=100_000, help="records (single)")
    p.add_argument("--rate", type=float, default=2_000.0, help="writes/s (rate mode)")
    p.add_argument("--seconds", type=float, default=10.0, help="duration of rate mode")
    p.add_argument("--streams", type=int, default=1, help="streams written round-robin")
    p.add_argument("--requests-in-flight", type=int, default=None,
                   help="write requests in flight per stream (default: the client's)")  # fmt: skip


def _streams(args: argparse.Namespace, tag: str) -> list[str]:
    run = uuid.uuid4().hex[:8]
    return [f"bench-{tag}-{run}-{i}" for i in range(args.streams)]


async def _many(client: ProxyClient, args: argparse.Namespace) -> dict[str, Any]:
    payload = b"x" * args.record_size
    streams = _streams(args, "many")
    batch = [payload] * args.batch
    calls = max(1, args.records // args.batch)
    for s in streams:  # acquire ownership before timing
        await client.write(s, payload)
    latencies: list[float] = []
    elapsed = await closed_loop(
        calls,
        args.concurrency,
        lambda i: client.write_many(streams[i % len(streams)], batch),
        latencies,
    )
    return {
        "records": calls * args.batch,
        "seconds": round(elapsed, 3),
        "records_per_s": round(calls * args.batch / elapsed),
        **latency_summary(latencies),
    }


async def _single(client: ProxyClient, args: argparse.Namespace) -> dict[str, Any]:
    payload = b"x" * args.record_size
    streams = _streams(args, "single")
    for s in streams:
        await client.write(s, payload)
    latencies: list[float] = []
    sem = asyncio.Semaphore(args.inflight)

    async def one(i: int) -> None:
        t0 = time.perf_counter()
        try:
            await client.write(streams[i % len(streams)], payload)
        finally:
            sem.release()
        latencies.append(time.perf_counter() - t0)

    tasks = []
    start = time.perf_counter()
    for i in range(args.single_records):
        await sem.acquire()
        tasks.append(asyncio.ensure_future(one(i)))
    await asyncio.gather(*tasks)
    elapsed = time.perf_counter() - start
    n = args.single_records
    return {
        "records": n,
        "seconds": round(elapsed, 3),
        "records_per_s": round(n / elapsed),
        **latency_summary(latencies),
    }


async def _rate(client: ProxyClient, args: argparse.Namespace) -> dict[str, Any]:
    payload = b"x" * args.record_size
    stream = _streams(args, "rate")[0]
    await client.write(stream, payload)
    count = int(args.rate * args.seconds)
    answers = Answers(count)

    def send(scheduled: float) -> None:
        fut = client.write_nowait(stream, payload)
        fut.add_done_callback(functools.partial(answers.record, started=scheduled))

    start = await open_loop(args.rate, count, send)
    if count:
        await answers.finished
    latencies = answers.latencies
    elapsed = time.perf_counter() - start
    return {
        "records": count,
        "rate": args.rate,
        "records_per_s": round(count / elapsed),
        **latency_summary(latencies),
    }


async def _e2e(client: ProxyClient, args: argparse.Namespace) -> dict[str, Any]:
    stream = _streams(args, "e2e")[0]
    await client.write(stream, b"start")
    total = max(args.batch, args.records // 3 // args.batch * args.batch)
    sent: dict[bytes, float] = {}
    latencies: list[float] = []
    got = 0
    ready = asyncio.Event()

    async def reader() -> None:
        nonlocal got
        tail = client.tail(stream, "latest")
        first = asyncio.ensure_future(tail.__anext__())
        await asyncio.sleep(0.5)
        ready.set()
        rec = await first
        while True:
            t = sent.get((rec.payload or b"")[:16])
            if t is not None:
                latencies.append(time.perf_counter() - t)
                got += 1
                if got >= total:
                    break
            rec = await tail.__anext__()
        await tail.aclose()

    async def writer() -> None:
        await ready.wait()
        filler = b"x" * max(0, args.record_size - 16)
        for b in range(total // args.batch):
            now = time.perf_counter()
            batch = []
            for i in range(args.batch):
                key = f"{b:07d}-{i:08d}".encode()[:16].ljust(16, b".")
                sent[key] = now
                batch.append(key + filler)
            await client.write_many(stream, batch)

    start = time.perf_counter()
    await asyncio.wait_for(asyncio.gather(reader(), writer()), timeout=300)
    elapsed = time.perf_counter() - start
    return {"records": total, "records_per_s": round(total / elapsed), **latency_summary(latencies)}


async def _cpu(client: ProxyClient, args: argparse.Namespace, cluster_file: Path) -> dict[str, Any]:
    from foundation.cluster_file import read_cluster_file
    from ops.bench.compare.common import Latencies, stamp_of, stamped
    from ops.bench.cpu import CpuWindow

    raw = read_cluster_file(cluster_file).raw
    roles = {
        "client": [os.getpid()],
        "write_proxy": [p["pid"] for p in raw.get("write_proxies", [])],
        "read_proxy": [p["pid"] for p in raw.get("read_proxies", [])],
        "bookies": [b["pid"] for b in raw.get("bookies", [])],
    }
    stream = _streams(args, "cpu")[0]
    await client.write(stream, b"warm-up")
    count = int(args.rate * args.seconds)
    filler = b"x" * max(0, args.record_size - 8)
    e2e = Latencies()
    tail = client.tail(stream, "earliest")
    await tail.__anext__()  # the warm-up record: the tail is live

    async def read() -> None:
        got = 0
        async for rec in tail:
            e2e.since(stamp_of(rec.payload))
            got += 1
            if got >= count:
                return

    reader = asyncio.ensure_future(read())
    answers = Answers(count)

    def send(scheduled: float) -> None:
        fut = client.write_nowait(stream, stamped(scheduled, filler))
        fut.add_done_callback(functools.partial(answers.record, started=scheduled))

    cpu = CpuWindow(roles)
    profiles = None
    if args.profile:
        from ops.bench.profiling import Profiles

        profiles = Profiles(roles, args.seconds * 0.8, Path(args.profile))
    cpu.start()
    if profiles is not None:
        profiles.start()
    try:
        start = await open_loop(args.rate, count, send, tick_s=0.0005)
        await answers.finished
        await asyncio.wait_for(reader, timeout=120)
        elapsed = time.perf_counter() - start
        cpu_pct = cpu.stop()
    finally:
        if profiles is not None:
            profiles.stop()
        reader.cancel()
        await tail.aclose()
    per_record = {role: round(pct * 1e4 / args.rate, 1) for role, pct in cpu_pct.items()}
    summary = e2e.summary()
    summary.pop("hist", None)
    ack = {f"ack_{k}": v for k, v in latency_summary(answers.latencies).items()}
    return {"records": count, "rate": args.rate, "records_per_s": round(count / elapsed),
            **summary, **ack, "cpu_pct": cpu_pct, "cpu_us_per_record": per_record,
            **({"profile": profiles.summary()} if profiles is not None else {})}  # fmt: skip


async def _measure(cluster_file: Path, args: argparse.Namespace) -> dict[str, Any]:
    from thinclient.client import ClientConfig, ProxyClient  # aiohttp: only when measuring

    inflight = args.requests_in_flight or ClientConfig().requests_in_flight_per_stream
    config = ClientConfig(request_timeout_ms=30_000, retry_deadline_ms=60_000,
                          requests_in_flight_per_stream=inflight)  # fmt: skip
    async with ProxyClient.from_cluster_file(cluster_file, config=config) as client:
        # The latency mode first: after the throughput modes the bookies are still
        # checkpointing their 400,000 records for seconds, which is not the steady
        # state a 2,000 records/s producer sees.
        modes = ["rate", "many", "single", "e2e"] if args.mode == "all" else [args.mode]
        runners = {"many": _many, "single": _single, "rate": _rate, "e2e": _e2e}
        results = {
            m: await (_cpu(client, args, cluster_file) if m == "cpu" else runners[m](client, args))
            for m in modes
        }
    head = results["many"] if "many" in results else results[modes[0]]
    out: dict[str, Any] = {
        "bench": "proxy",
        "mode": args.mode,
        "record_size": args.record_size,
        **head,
    }
    if len(modes) > 1:
        out["modes"] = results
    return out


def run(args: argparse.Namespace) -> dict[str, Any]:
    with local_cluster(args, write_proxies=1, read_proxies=1) as cluster_file:
        return asyncio_run(_measure(cluster_file, args))
