"""Bookline in ``bookline bench compare``: through the core library and through the
thin client (write proxy, read proxy), on a local cluster of 3 bookies (E=Qw=3, Qa=2,
every journal group fsynced before the ack: the defaults).

Best batching for Python users: the core's ``write_many`` (10,000 records a call, 4
calls outstanding, as ``bench write``) and the thin client's ``write_many`` (1,000 a
call, 8 outstanding, as ``bench proxy``). Single records: ``write_nowait`` with a
window. Catch-up: a core ``LogReader`` (``read_many``), and the thin client's
``catch_up`` through one read proxy (record sets handed through as stored; tails --
the e2e workload -- use the WebSocket).
"""

from __future__ import annotations

import asyncio
import collections
import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from foundation.gctune import settle_heap
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
from ops.bench.compare.hops import HopWindow

if TYPE_CHECKING:
    from streams.namespace import Namespace
    from streams.writer.writer import LogWriter
    from thinclient.client import ProxyClient

#: Records per ``write_many`` call of the core (bench write's default) and outstanding.
CORE_BATCH_RECORDS: Final = 10_000
CORE_BATCHES_IN_FLIGHT: Final = 4
#: The thin client's (bench proxy's defaults).
THIN_BATCH_RECORDS: Final = 1_000
THIN_BATCHES_IN_FLIGHT: Final = 8
#: A batch of large records holds about this many bytes.
BATCH_BYTES: Final = 1 << 20
#: Single records outstanding in the pipelined workload.
PIPELINE_WINDOW: Final = 5_000
#: Records a catch-up ``read_many`` asks for.
READ_MANY: Final = 10_000


#: Pids and ``/metrics`` URLs per process role of the cluster (hops.services_of).
Services = tuple[dict[str, list[int]], dict[str, list[str]]]


def _window(services: Services | None, reader_pid: int | None, *, in_process: bool) -> HopWindow:
    """The hop split around a latency workload: the cluster's roles, this process (the
    client; the core's writer too) and the tail's process."""
    from ledger.metrics import PROCESS_LEDGER_METRICS

    pids, urls = services if services is not None else ({}, {})
    pids = {**pids, "client": [os.getpid()]}
    if reader_pid is not None:
        pids["reader"] = [reader_pid]
    if not in_process:
        return HopWindow(pids, urls)
    adds = PROCESS_LEDGER_METRICS.add_seconds
    core_pids = {r: p for r, p in pids.items() if r not in ("write_proxy", "read_proxy")}
    return HopWindow(core_pids, urls, lambda: (adds.sum, float(adds.count)))


def with_hops(result: dict[str, Any]) -> dict[str, Any]:
    """The workload's own medians join its hop split: the acknowledgement and, for a
    tail, e2e - ack at p50."""
    hops = result.setdefault("hops_ms", {})
    if "ack_p50_ms" in result:
        hops["ack_ms"] = result["ack_p50_ms"]
        hops["ack_to_reader_ms"] = round(result["p50_ms"] - result["ack_p50_ms"], 3)
    elif "p50_ms" in result:
        hops["ack_ms"] = result["p50_ms"]
    return result


def _batch_records(cap: int, record_bytes: int) -> int:
    return max(1, min(cap, BATCH_BYTES // record_bytes))


def _name(tag: str) -> str:
    return f"cmp-{tag}-{uuid.uuid4().hex[:8]}"


class BooklineCore:
    """The core library against the cluster's bookies (``zk`` + ``root``)."""

    key = "bookline"
    label = "Bookline (core)"

    def __init__(self, zk: str, root: str, services: Services | None = None) -> None:
        self._zk, self._root = zk, root
        self._services = services  # pids and /metrics per role: the hop split
        self._ns: Namespace | None = None
        self._written: tuple[str, int] | None = None  # the batched run's stream, records

    @property
    def ns(self) -> Namespace:
        assert self._ns is not None, "start() first"
        return self._ns

    async def start(self) -> None:
        from streams.config import NamespaceConfig
        from streams.namespace import Namespace

        self._ns = await Namespace.open(self._zk, self._root, "compare", NamespaceConfig())

    async def close(self) -> None:
        if self._ns is not None:
            await self._ns.close()

    async def _writer(self, tag: str) -> tuple[str, LogWriter]:
        name = _name(tag)
        await self.ns.create_stream(name)
        return name, await self.ns.open_writer(name)

    async def _drop(self, name: str) -> None:
        await self.ns.delete_stream(name)

    async def batched(self, records: int, record_bytes: int) -> dict[str, Any]:
        from streams.records import LogRecord

        per_call = _batch_records(CORE_BATCH_RECORDS, record_bytes)
        batch = [LogRecord(os.urandom(record_bytes)) for _ in range(per_call)]
        calls = max(1, records // per_call)
        name, w = await self._writer("batched")
        try:
            await w.write_many(batch[:10])  # warm up connections and code paths
            settle_heap()
            inflight: set[asyncio.Future[Any]] = set()
            t0 = time.perf_counter()
            for _ in range(calls):
                task = asyncio.ensure_future(w.write_many(batch))
                inflight.add(task)
                task.add_done_callback(inflight.discard)
                if len(inflight) >= CORE_BATCHES_IN_FLIGHT:
                    await asyncio.wait(inflight, return_when=asyncio.FIRST_COMPLETED)
            await asyncio.gather(*inflight)
            elapsed = time.perf_counter() - t0
        finally:
            await w.close()
        if self._written is not None:
            await self._drop(self._written[0])
        self._written = (name, calls * per_call + 10)
        return throughput(calls * per_call, record_bytes, elapsed)

    async def drop(self) -> None:
        if self._written is not None:
            await self._drop(self._written[0])
            self._written = None

    async def catchup(self) -> dict[str, Any]:
        assert self._written is not None, "batched() first"
        name, total = self._written
        reader = await self.ns.open_reader(name, "earliest")
        got = 0
        settle_heap()
        t0 = time.perf_counter()
        try:
            while got < total:
                got += len(await reader.read_many(READ_MANY, timeout_s=30))
            elapsed = time.perf_counter() - t0
        finally:
            await reader.close()
            await self._drop(name)
            self._written = None
        return throughput(got, 0, elapsed) | {"mb_per_s": None}

    async def pipelined(self, records: int, record_bytes: int) -> dict[str, Any]:
        from streams.records import LogRecord

        payload = os.urandom(record_bytes)
        name, w = await self._writer("pipelined")
        try:
            await w.write(LogRecord(payload))
            window: collections.deque[asyncio.Future[Any]] = collections.deque()
            settle_heap()
            t0 = time.perf_counter()
            for _ in range(records):
                if len(window) >= PIPELINE_WINDOW:
                    await window.popleft()
                window.append(w.write_nowait(LogRecord(payload)))
            while window:
                await window.popleft()
            elapsed = time.perf_counter() - t0
        finally:
            await w.close()
            await self._drop(name)
        return throughput(records, record_bytes, elapsed)

    def _sender(self, w: LogWriter, filler: bytes) -> Sender:
        from streams.records import LogRecord

        return future_sender(lambda payload: w.write_nowait(LogRecord(payload)), filler)

    async def ack_latency(self, rate: float, seconds: float, record_bytes: int) -> dict[str, Any]:
        from streams.records import LogRecord

        name, w = await self._writer("ack")
        try:
            await w.write(LogRecord(b"warm-up"))
            filler = os.urandom(max(0, record_bytes - 8))
            window = _window(self._services, None, in_process=True)
            return with_hops(await paced_acks(rate, seconds, self._sender(w, filler), window))
        finally:
            await w.close()
            await self._drop(name)

    async def e2e(self, rate: float, seconds: float, record_bytes: int) -> dict[str, Any]:
        from streams.records import LogRecord

        name, w = await self._writer("e2e")
        total = max(1, int(rate * seconds))
        params = {"zk": self._zk, "root": self._root, "stream": name}
        try:
            reader = TailProcess(tail_core, params, total)
            filler = os.urandom(max(0, record_bytes - 8))

            async def warm_up() -> None:
                await w.write(LogRecord(b"warm-up"))

            window = _window(self._services, reader.pid, in_process=True)
            return with_hops(
                await e2e_with_reader(
                    rate, seconds, reader, warm_up, self._sender(w, filler), window=window
                )
            )
        finally:
            await w.close()
            await self._drop(name)


async def tail_core(params: dict[str, Any], total: int, ready: Callable[[], None]) -> Latencies:
    """The core library's tailing reader (in the reader process)."""
    from streams.config import NamespaceConfig
    from streams.namespace import Namespace

    ns = await Namespace.open(params["zk"], params["root"], "compare", NamespaceConfig())
    try:
        reader = await ns.open_reader(params["stream"], "earliest")
        try:
            await reader.read_next(30)  # the warm-up record
            settle_heap()
            ready()
            lat = Latencies()
            add, perf = lat.add_s, time.perf_counter
            got = 0
            while got < total:
                for rec in await reader.read_many(READ_MANY):
                    add(perf() - stamp_of(rec.payload))
                    got += 1
            return lat
        finally:
            await reader.close()
    finally:
        await ns.close()


class BooklineThin:
    """The thin client through the cluster's write proxy and read proxy."""

    key = "bookline_thin"
    label = "Bookline (thin client)"

    def __init__(self, cluster_file: Path, services: Services | None = None) -> None:
        self._cluster_file = cluster_file
        self._services = services
        self._client: ProxyClient | None = None
        self._written: tuple[str, int] | None = None

    @property
    def client(self) -> ProxyClient:
        assert self._client is not None, "start() first"
        return self._client

    async def start(self) -> None:
        from thinclient.client import ClientConfig, ProxyClient

        config = ClientConfig(request_timeout_ms=30_000, retry_deadline_ms=60_000)
        self._client = await ProxyClient.from_cluster_file(
            self._cluster_file, config=config
        ).start()

    async def close(self) -> None:
        if self._client is not None:
            await self._client.close()

    async def _drop(self, name: str) -> None:
        await self.client.delete_stream(name)

    async def batched(self, records: int, record_bytes: int) -> dict[str, Any]:
        client = self.client
        per_call = _batch_records(THIN_BATCH_RECORDS, record_bytes)
        batch = [os.urandom(record_bytes)] * per_call
        calls = max(1, records // per_call)
        name = _name("thin-batched")
        await client.write(name, b"warm-up")  # creates the stream, takes ownership
        settle_heap()
        elapsed = await closed_loop(
            calls, THIN_BATCHES_IN_FLIGHT, lambda _i: client.write_many(name, batch)
        )
        if self._written is not None:
            await self._drop(self._written[0])
        self._written = (name, calls * per_call + 1)
        return throughput(calls * per_call, record_bytes, elapsed)

    async def drop(self) -> None:
        if self._written is not None:
            await self._drop(self._written[0])
            self._written = None

    async def catchup(self) -> dict[str, Any]:
        """Record sets through the read proxy (``catch_up``), handed through as stored."""
        assert self._written is not None, "batched() first"
        name, total = self._written
        got = 0
        settle_heap()
        t0 = time.perf_counter()
        batches = self.client.catch_up(name, "earliest")
        try:
            async for batch in batches:
                got += len(batch)
                if got >= total:
                    break
            elapsed = time.perf_counter() - t0
        finally:
            await batches.aclose()
            await self._drop(name)
            self._written = None
        return throughput(got, 0, elapsed) | {"mb_per_s": None, "method": "record sets"}

    async def pipelined(self, records: int, record_bytes: int) -> dict[str, Any]:
        client = self.client
        payload = os.urandom(record_bytes)
        name = _name("thin-pipelined")
        await client.write(name, payload)
        window: collections.deque[asyncio.Future[Any]] = collections.deque()
        settle_heap()
        t0 = time.perf_counter()
        for _ in range(records):
            if len(window) >= PIPELINE_WINDOW:
                await window.popleft()
            window.append(client.write_nowait(name, payload))
        while window:
            await window.popleft()
        elapsed = time.perf_counter() - t0
        await self._drop(name)
        return throughput(records, record_bytes, elapsed)

    def _sender(self, name: str, filler: bytes) -> Sender:
        client = self.client
        return future_sender(lambda payload: client.write_nowait(name, payload), filler)

    async def ack_latency(self, rate: float, seconds: float, record_bytes: int) -> dict[str, Any]:
        name = _name("thin-ack")
        await self.client.write(name, b"warm-up")
        try:
            filler = os.urandom(max(0, record_bytes - 8))
            window = _window(self._services, None, in_process=False)
            return with_hops(await paced_acks(rate, seconds, self._sender(name, filler), window))
        finally:
            await self._drop(name)

    async def e2e(self, rate: float, seconds: float, record_bytes: int) -> dict[str, Any]:
        name = _name("thin-e2e")
        total = max(1, int(rate * seconds))
        await self.client.write(name, b"warm-up")
        try:
            reader = TailProcess(
                tail_thin, {"cluster": str(self._cluster_file), "stream": name}, total
            )
            filler = os.urandom(max(0, record_bytes - 8))

            async def warm_up() -> None:
                return None  # written before the reader started

            window = _window(self._services, reader.pid, in_process=False)
            return with_hops(
                await e2e_with_reader(
                    rate, seconds, reader, warm_up, self._sender(name, filler), window=window
                )
            )
        finally:
            await self._drop(name)


async def tail_thin(params: dict[str, Any], total: int, ready: Callable[[], None]) -> Latencies:
    """The thin client's WebSocket tail through the read proxy (in the reader process)."""
    from thinclient.client import ProxyClient

    async with ProxyClient.from_cluster_file(params["cluster"]) as client:
        tail = client.tail(params["stream"], "earliest")
        try:
            await tail.__anext__()  # the warm-up record
            settle_heap()
            ready()
            lat = Latencies()
            add, perf = lat.add_s, time.perf_counter
            got = 0
            async for rec in tail:
                add(perf() - stamp_of(rec.payload))
                got += 1
                if got >= total:
                    break
            return lat
        finally:
            await tail.aclose()
