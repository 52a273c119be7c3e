"""Redis Streams in ``bookline bench compare``: one ``redis-server`` (Debian's) with
``appendonly yes`` and ``appendfsync always`` -- every write is in the fsynced
append-only file before its reply -- and no snapshots: what an unreplicated durable
log costs. Driven by redis-py's asyncio client; started through
:func:`ops.cluster.procs.spawn`, stopped by pid. A run's records go to a key of their own,
deleted after.

Best batching a Python user has: a non-transactional pipeline of ``XADD``s (1,000 a
round trip, 4 pipelines outstanding on their own connections); Redis fsyncs the AOF once
per event-loop turn, before it answers, so a pipeline shares one fsync. Single
records: concurrent ``XADD``s, one per connection from a pool. Readers: ``XREAD
BLOCK`` (tail) and ``XRANGE`` pages (catch-up).
"""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from ops.bench.common import closed_loop
from ops.bench.compare.common import (
    Latencies,
    Sender,
    TailProcess,
    e2e_with_reader,
    future_sender,
    paced_acks,
    stamp_of,
    throughput,
)
from ops.cluster import procs

if TYPE_CHECKING:
    import subprocess

    from redis.asyncio import Redis

START_TIMEOUT_S: Final = 30.0
#: XADDs per pipeline round trip, and pipelines outstanding.
PIPELINE_RECORDS: Final = 1_000
PIPELINES_IN_FLIGHT: Final = 4
BATCH_BYTES: Final = 1 << 20
#: Single XADDs outstanding (each needs a connection of its own in redis-py).
SINGLE_WINDOW: Final = 64
#: Records per XRANGE / XREAD page.
READ_PAGE: Final = 10_000


def available() -> str | None:
    if shutil.which("redis-server") is None:
        return "redis-server not found: apt-get install redis-server (ops/setup.sh does)"
    try:
        import redis  # noqa: F401
    except ImportError as exc:
        return str(exc)
    return None


class RedisServer:
    """One durable ``redis-server`` under ``directory``."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.port = procs.free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def pids(self) -> list[int]:
        return [self.proc.pid] if self.proc is not None else []

    def start(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        argv = [
            shutil.which("redis-server") or "redis-server",
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--protected-mode",
            "yes",
            "--dir",
            str(self.dir),
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
            "--save",
            "",
            "--daemonize",
            "no",
            "--logfile",
            "",
        ]
        self.proc = procs.spawn(argv, log_path=self.dir / "redis.log")
        proc = self.proc
        try:
            procs.wait_for(lambda: _ping(self.port, proc), START_TIMEOUT_S, "redis-server")
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        if self.proc is not None:
            procs.stop(self.proc)
            self.proc = None


def _ping(port: int, proc: subprocess.Popen[bytes]) -> bool:
    if proc.poll() is not None:
        raise RuntimeError(f"redis-server exited with {proc.returncode}")
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as s:
            s.sendall(b"PING\r\n")
            return s.recv(16).startswith(b"+PONG")
    except OSError:
        return False


def _client(port: int, connections: int) -> Redis:
    from redis.asyncio import BlockingConnectionPool, Redis

    pool = BlockingConnectionPool(
        host="127.0.0.1", port=port, max_connections=connections, timeout=60
    )
    return Redis(connection_pool=pool)


def _key(tag: str) -> str:
    return f"cmp:{tag}:{uuid.uuid4().hex[:8]}"


class RedisStreams:
    """The workloads against a :class:`RedisServer`."""

    key = "redis"
    label = "Redis Streams (1 node)"

    def __init__(self, port: int) -> None:
        self._port = port
        self._r: Redis | None = None
        self._written: tuple[str, int] | None = None

    @property
    def r(self) -> Redis:
        assert self._r is not None, "start() first"
        return self._r

    async def start(self) -> None:
        self._r = _client(self._port, max(SINGLE_WINDOW, PIPELINES_IN_FLIGHT) + 2)
        await self.r.ping()

    async def close(self) -> None:
        if self._r is not None:
            await self._r.aclose()

    async def batched(self, records: int, record_bytes: int) -> dict[str, Any]:
        key = _key("batched")
        payload = os.urandom(record_bytes)
        per_call = max(1, min(PIPELINE_RECORDS, BATCH_BYTES // record_bytes))
        calls = max(1, records // per_call)
        await self.r.xadd(key, {"v": payload})

        async def pipeline(_i: int) -> object:
            pipe = self.r.pipeline(transaction=False)
            for _ in range(per_call):
                pipe.xadd(key, {"v": payload})
            return await pipe.execute()

        elapsed = await closed_loop(calls, PIPELINES_IN_FLIGHT, pipeline)
        if self._written is not None:
            await self.r.delete(self._written[0])
        self._written = (key, calls * per_call + 1)
        return throughput(calls * per_call, record_bytes, elapsed)

    async def drop(self) -> None:
        if self._written is not None:
            await self.r.delete(self._written[0])
            self._written = None

    async def catchup(self) -> dict[str, Any]:
        assert self._written is not None, "batched() first"
        key, total = self._written
        got = 0
        start = "-"
        t0 = time.perf_counter()
        try:
            while got < total:
                page: Any = await self.r.xrange(key, min=start, max="+", count=READ_PAGE)
                if not page:
                    break
                got += len(page)
                start = "(" + page[-1][0].decode()
            elapsed = time.perf_counter() - t0
        finally:
            await self.r.delete(key)
            self._written = None
        return throughput(got, 0, elapsed) | {"mb_per_s": None}

    async def pipelined(self, records: int, record_bytes: int) -> dict[str, Any]:
        key = _key("pipelined")
        payload = os.urandom(record_bytes)
        r = self.r
        await r.xadd(key, {"v": payload})
        sem = asyncio.Semaphore(SINGLE_WINDOW)

        async def one() -> None:
            try:
                await r.xadd(key, {"v": payload})
            finally:
                sem.release()

        tasks: set[asyncio.Task[None]] = set()
        t0 = time.perf_counter()
        for _ in range(records):
            await sem.acquire()
            task = asyncio.ensure_future(one())
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        await asyncio.gather(*tasks)
        elapsed = time.perf_counter() - t0
        await r.delete(key)
        return throughput(records, record_bytes, elapsed)

    def _sender(self, key: str, filler: bytes) -> Sender:
        r = self.r
        loop = asyncio.get_running_loop()

        async def one(payload: bytes) -> None:
            await r.xadd(key, {"v": payload})

        return future_sender(lambda payload: loop.create_task(one(payload)), filler)

    async def ack_latency(self, rate: float, seconds: float, record_bytes: int) -> dict[str, Any]:
        key = _key("ack")
        try:
            await self.r.xadd(key, {"v": b"warm-up"})
            filler = os.urandom(max(0, record_bytes - 8))
            return await paced_acks(rate, seconds, self._sender(key, filler))
        finally:
            await self.r.delete(key)

    async def e2e(self, rate: float, seconds: float, record_bytes: int) -> dict[str, Any]:
        key = _key("e2e")
        total = max(1, int(rate * seconds))
        try:
            reader = TailProcess(tail_redis, {"port": self._port, "key": key}, total)
            filler = os.urandom(max(0, record_bytes - 8))

            async def warm_up() -> None:
                await self.r.xadd(key, {"v": b"warm-up"})

            return await e2e_with_reader(rate, seconds, reader, warm_up, self._sender(key, filler))
        finally:
            await self.r.delete(key)


async def tail_redis(params: dict[str, Any], total: int, ready: Callable[[], None]) -> Latencies:
    """``XREAD BLOCK`` from the stream's start (in the reader process)."""
    from foundation.gctune import settle_heap

    r = _client(int(params["port"]), 2)
    key = params["key"]
    try:
        last = "0"
        while True:  # the warm-up record
            got: Any = await r.xread({key: last}, count=1, block=1_000)
            if got:
                last = got[0][1][0][0].decode()
                break
        settle_heap()
        ready()
        lat = Latencies()
        add, perf = lat.add_s, time.perf_counter
        n = 0
        while n < total:
            answer: Any = await r.xread({key: last}, count=READ_PAGE, block=1_000)
            if not answer:
                continue
            entries = answer[0][1]
            for _id, fields in entries:
                add(perf() - stamp_of(fields[b"v"]))
            n += len(entries)
            last = entries[-1][0].decode()
        return lat
    finally:
        await r.aclose()
