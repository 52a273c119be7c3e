"""What ``bookline bench compare``'s systems share: the workload sizes, latency
histograms, stamped payloads, the open loop and the tailing reader's own process.

Every system (Bookline through the core library and through the thin client, NATS
JetStream, Redis Streams) is driven by an object with the same six coroutines, one per
workload of issue 17; each returns a plain dict (``records_per_s``, ``mb_per_s``,
latency percentiles and, for the latency workloads, the encoded histogram the plots
are drawn from). Latencies are recorded in HdrHistogram (microseconds, 3 significant
digits) so percentiles do not depend on keeping every sample, and a histogram crosses
from the reader's process to ours as a few hundred bytes.

An e2e payload starts with the ``perf_counter`` time the record was *scheduled* to be
written (8 bytes, big-endian double): CLOCK_MONOTONIC is one clock for every process of
the machine, so the reader charges each record from its schedule, as ``bench e2e`` does.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import struct
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any, Final, Protocol

from hdrh.histogram import HdrHistogram

from ops.bench.pacing import open_loop

#: Histogram range: 1 µs .. 120 s, 3 significant digits.
_LOWEST_US: Final = 1
_HIGHEST_US: Final = 120_000_000
_DIGITS: Final = 3
STAMP: Final = struct.Struct(">d")
#: How long the tailing reader process may say nothing before the run is failed.
READER_SILENCE_S: Final = 120.0
#: The e2e pacer's tick (as ``bench e2e``: fewer wake-ups of the load generator; each
#: record still charged from its own scheduled time).
PACER_TICK_S: Final = 0.0005


@dataclass(frozen=True, slots=True)
class Sizes:
    """How much each workload does; ``full()`` is the issue's, ``smoke()`` seconds."""

    batched_records: int  # (a) and the catch-up (e) reads the same records back
    pipelined_records: int  # (b)
    ack_rate: float  # (c) records/s
    ack_seconds: float
    e2e_rates: tuple[float, ...]  # (d) records/s
    e2e_seconds: float
    large_records: int  # (f)
    large_bytes: int
    record_bytes: int  # every workload but (f)
    repeats: int  # runs of each workload per system, alternating systems

    @classmethod
    def full(cls) -> Sizes:
        return cls(
            batched_records=1_000_000,
            pipelined_records=100_000,
            ack_rate=1_000.0,
            ack_seconds=10.0,
            e2e_rates=(1_000.0, 10_000.0),
            e2e_seconds=10.0,
            large_records=2_000,
            large_bytes=64 << 10,
            record_bytes=100,
            repeats=3,
        )

    @classmethod
    def smoke(cls) -> Sizes:
        return cls(
            batched_records=2_000,
            pipelined_records=300,
            ack_rate=200.0,
            ack_seconds=0.5,
            e2e_rates=(200.0,),
            e2e_seconds=0.5,
            large_records=20,
            large_bytes=64 << 10,
            record_bytes=100,
            repeats=1,
        )


class Latencies:
    """A latency histogram in microseconds."""

    def __init__(self, hist: HdrHistogram | None = None) -> None:
        self.hist = hist if hist is not None else HdrHistogram(_LOWEST_US, _HIGHEST_US, _DIGITS)

    def add_s(self, seconds: float) -> None:
        self.hist.record_value(min(_HIGHEST_US, max(_LOWEST_US, int(seconds * 1e6))))

    def since(self, started: float) -> None:
        """Record the time from ``started`` (perf_counter) to now."""
        self.add_s(time.perf_counter() - started)

    @property
    def count(self) -> int:
        return int(self.hist.get_total_count())

    def ms_at(self, percentile: float) -> float:
        return round(float(self.hist.get_value_at_percentile(percentile)) / 1000.0, 3)

    def summary(self) -> dict[str, Any]:
        return {
            "p50_ms": self.ms_at(50.0),
            "p99_ms": self.ms_at(99.0),
            "p999_ms": self.ms_at(99.9),
            "max_ms": round(self.hist.get_max_value() / 1000.0, 3),
            "samples": self.count,
            "hist": self.encode(),
        }

    def encode(self) -> str:
        encoded: bytes = self.hist.encode()
        return encoded.decode("ascii")

    @classmethod
    def decode(cls, text: str) -> Latencies:
        return cls(HdrHistogram.decode(text.encode("ascii")))


def stamped(scheduled: float, filler: bytes) -> bytes:
    return STAMP.pack(scheduled) + filler


def stamp_of(payload: bytes | None) -> float:
    """The send time a benchmark record carries (its payload's first bytes); the
    benchmarks write no null value, so one is a broken run."""
    if payload is None:
        raise ValueError("a benchmark record with a null value")
    return float(STAMP.unpack_from(payload)[0])


def throughput(records: int, record_bytes: int, elapsed_s: float) -> dict[str, Any]:
    return {
        "records": records,
        "elapsed_s": round(elapsed_s, 3),
        "records_per_s": round(records / elapsed_s, 1),
        "mb_per_s": round(records * record_bytes / elapsed_s / 1e6, 2),
    }


class System(Protocol):
    """One system under comparison; ``key`` names it in the JSON."""

    key: str
    label: str

    async def start(self) -> None: ...
    async def close(self) -> None: ...
    async def batched(self, records: int, record_bytes: int) -> dict[str, Any]: ...
    async def catchup(self) -> dict[str, Any]: ...
    async def drop(self) -> None: ...  # delete what batched() wrote, unread
    async def pipelined(self, records: int, record_bytes: int) -> dict[str, Any]: ...
    async def ack_latency(
        self, rate: float, seconds: float, record_bytes: int
    ) -> dict[str, Any]: ...
    async def e2e(self, rate: float, seconds: float, record_bytes: int) -> dict[str, Any]: ...


class Window(Protocol):
    """Measures taken around the timed records (:class:`ops.bench.compare.hops.HopWindow`)."""

    async def start(self) -> None: ...
    async def stop(self, records: int) -> dict[str, Any]: ...


async def paced_acks(
    rate: float,
    seconds: float,
    send: Callable[[float, Latencies, Callable[[], None]], None],
    window: Window | None = None,
) -> dict[str, Any]:
    """Open loop at ``rate`` for ``seconds``: ``send(scheduled, latencies, done)`` writes
    one record and, once it is acknowledged, records the time since ``scheduled`` and
    calls ``done()`` (with the exception instead when it failed). ``window``'s figures
    (taken around the timed records) join the result."""
    total = max(1, int(rate * seconds))
    if window is not None:
        await window.start()
    lat = Latencies()
    finished: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    answered = 0

    def done(exc: BaseException | None = None) -> None:
        nonlocal answered
        if finished.done():
            return
        if exc is not None:
            finished.set_exception(exc)
            return
        answered += 1
        if answered == total:
            finished.set_result(None)

    start = await open_loop(rate, total, lambda s: send(s, lat, done), tick_s=PACER_TICK_S)
    await asyncio.wait_for(finished, timeout=seconds * 10 + 60)
    elapsed = time.perf_counter() - start
    return {
        "rate": rate,
        "records": total,
        "records_per_s": round(total / elapsed, 1),
        "sustained": elapsed <= seconds * 1.1 + 0.5,
        **lat.summary(),
        **(await window.stop(total) if window is not None else {}),
    }


Sender = Callable[[float, "Latencies", Callable[..., None]], None]


def future_sender(submit: Callable[[bytes], asyncio.Future[Any]], filler: bytes) -> Sender:
    """:func:`paced_acks`'s ``send`` around ``submit(payload) -> future`` (a writer's
    ``write_nowait``, or a task for clients without one): the payload is stamped with
    its scheduled time; when the future resolves the latency is recorded and ``done``
    is told, with the exception when it failed."""

    def send(scheduled: float, lat: Latencies, done: Callable[..., None]) -> None:
        fut = submit(stamped(scheduled, filler))

        def answered(f: asyncio.Future[Any]) -> None:
            exc = f.exception()
            if exc is None:
                lat.since(scheduled)
            done(exc)

        fut.add_done_callback(answered)

    return send


TailMain = Callable[[dict[str, Any], int, Callable[[], None]], Coroutine[Any, Any, Latencies]]


class TailProcess:
    """A tailing reader in its own process (as a consumer runs): ``target(params,
    total, ready)`` reads a warm-up record, calls ``ready()``, then returns the
    latencies of ``total`` stamped records. ``target`` is a module-level coroutine
    function (pickled by reference for the spawned process)."""

    def __init__(self, target: TailMain, params: dict[str, Any], total: int) -> None:
        ctx = multiprocessing.get_context("spawn")
        self._conn, child = ctx.Pipe()
        self._proc = ctx.Process(
            target=_tail_process_main,
            args=(target, params, total, child),
            name="bench-compare-reader",
            daemon=True,
        )
        self._proc.start()
        child.close()
        assert self._proc.pid is not None
        self.pid: int = self._proc.pid

    async def _recv(self, timeout_s: float) -> Any:
        if not await asyncio.to_thread(self._conn.poll, timeout_s):
            raise TimeoutError(f"the reader process said nothing for {timeout_s} s")
        msg = self._conn.recv()
        if isinstance(msg, BaseException):
            raise msg
        return msg

    async def ready(self) -> None:
        msg = await self._recv(READER_SILENCE_S)
        if msg != "ready":
            raise RuntimeError(f"reader process: expected 'ready', got {msg!r}")

    async def result(self, timeout_s: float = READER_SILENCE_S) -> Latencies:
        return Latencies.decode(await self._recv(timeout_s))

    async def stop(self) -> None:
        """Stopped by pid, also when the run failed."""
        await asyncio.to_thread(self._proc.join, 5)
        if self._proc.is_alive():
            self._proc.kill()
            await asyncio.to_thread(self._proc.join, 5)
        self._conn.close()


def _tail_process_main(
    target: TailMain, params: dict[str, Any], total: int, conn: Connection
) -> None:
    from ops.bench.common import asyncio_run

    try:
        lat = asyncio_run(target(params, total, lambda: conn.send("ready")))
        conn.send(lat.encode())
    except BaseException as exc:  # reported to the parent, which raises it
        conn.send(RuntimeError(f"reader process failed: {exc!r}"))
        raise
    finally:
        conn.close()


async def e2e_with_reader(
    rate: float,
    seconds: float,
    reader: TailProcess,
    warm_up: Callable[[], Awaitable[None]],
    send: Callable[[float, Latencies, Callable[[], None]], None],
    *,
    result_timeout_s: float = READER_SILENCE_S,
    window: Window | None = None,
) -> dict[str, Any]:
    """The e2e workload around a system's ``send`` (as in :func:`paced_acks`): a
    warm-up record the reader skips, the reader's 'ready', the open loop; the reader's
    latencies are the result, the writer's acknowledgements come as ``ack_*``.
    ``window`` measures from the reader's 'ready' to its last record."""
    try:
        await warm_up()
        await reader.ready()
        if window is not None:
            await window.start()
        acks = await paced_acks(rate, seconds, send)
        lat = await reader.result(result_timeout_s)
        measured = await window.stop(acks["records"]) if window is not None else {}
    finally:
        await reader.stop()
    ack = {f"ack_{k}": v for k, v in acks.items() if k.endswith("_ms")}
    return {
        "rate": rate,
        "records": acks["records"],
        "sustained": acks["sustained"],
        **lat.summary(),
        **ack,
        **measured,
    }
