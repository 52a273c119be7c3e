"""Open-loop pacing for the latency benchmarks, without busy-waiting.

An open-loop benchmark starts operation *i* at ``start + i / rate`` whatever the
answers do, and charges each operation from that *scheduled* time, so a stall is
counted against every operation it delays (no coordinated omission).

Pacing with ``asyncio.sleep`` does not work at these rates: uvloop keeps timers in whole
milliseconds and rounds, so ``asyncio.sleep(0.0004)`` returns on the next loop iteration
and a pacer with sub-millisecond gaps spins a whole core -- on a 2-core machine, half of
the CPU the bookies being measured need.

On Linux a periodic ``timerfd`` (CLOCK_MONOTONIC, the clock of ``time.perf_counter``)
is registered with the event loop: the kernel wakes the loop's epoll at each period,
nanosecond-accurate, and the loop thread sends every operation that fell due -- no
thread, no spinning, no GIL hand-over. Elsewhere a timing thread sleeps until each
operation is due and hands it to the loop with ``call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
import ctypes
import math
import os
import struct
import sys
import threading
import time
from collections.abc import Callable

from foundation.gctune import settle_heap

#: Lead before the first operation, so the timer is armed before anything is due.
_LEAD_S = 0.002
#: The thread pacer's GIL switch interval while it runs (the default 5 ms would let the
#: loop thread's callbacks hold back a due operation that long).
_SWITCH_INTERVAL_S = 0.0002
_CLOCK_MONOTONIC = 1
_EXPIRATIONS = struct.Struct("=Q")

Send = Callable[[float], None]


async def open_loop(rate: float, count: int, send: Send, tick_s: float = 0.0) -> float:
    """Call ``send(scheduled)`` on the loop thread for ``count`` operations at ``rate``
    per second; return once every ``send`` returned, with the scheduled start (for the
    caller's elapsed time). ``send`` must not block; an exception it raises stops the
    schedule and is raised here.

    ``tick_s`` > ``1 / rate`` wakes the loop only every ``tick_s`` to send what fell
    due: fewer wake-ups of a load generator that shares the cores with the system it
    measures, each operation still charged from its own scheduled time (so the
    lateness the tick adds, ``tick_s / 2`` on average, counts against the result)."""
    if rate <= 0:
        raise ValueError(f"rate must be positive, got {rate}")
    # As a latency-sensitive client would once set up (the servers do the same): keep
    # full collections of the set-up heap out of the measured window.
    settle_heap()
    if count <= 0:
        return time.perf_counter()
    timerfd = _TimerFd.create()
    if timerfd is None:
        return await _thread_paced(rate, count, send, tick_s)
    with timerfd:
        return await _timerfd_paced(timerfd, rate, count, send, tick_s)


class _Schedule:
    """Operation *i* is due at ``start + i * interval``; :meth:`fire` sends a due batch
    on the loop thread and resolves ``finished`` after the last one, or with the first
    exception ``send`` raises (nothing is sent after it)."""

    def __init__(self, rate: float, count: int, send: Send) -> None:
        self.count = count
        self.interval = 1.0 / rate
        self.start = time.perf_counter() + _LEAD_S
        self.sent = 0
        self.finished: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._send = send

    def due(self, now: float) -> int:
        """How many operations are due at ``now`` (never more than ``count``)."""
        return min(self.count, math.floor((now - self.start) / self.interval) + 1)

    def fire(self, last: int) -> None:
        """Send operations ``sent .. last - 1``."""
        if self.finished.done():
            return
        try:
            while self.sent < last:
                scheduled = self.start + self.sent * self.interval
                self.sent += 1
                self._send(scheduled)
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting caller
            self.finished.set_exception(exc)
            return
        if self.sent == self.count:
            self.finished.set_result(None)


async def _timerfd_paced(
    timerfd: _TimerFd, rate: float, count: int, send: Send, tick_s: float
) -> float:
    loop = asyncio.get_running_loop()
    plan = _Schedule(rate, count, send)
    perf = time.perf_counter

    def on_tick() -> None:
        if timerfd.expirations():
            plan.fire(plan.due(perf()))

    loop.add_reader(timerfd.fd, on_tick)
    try:
        # Operation 0 is due at the first expiry; each expiry sends what fell due.
        timerfd.arm(first_s=plan.start - perf(), interval_s=max(plan.interval, tick_s))
        await plan.finished
    finally:
        loop.remove_reader(timerfd.fd)
    return plan.start


async def _thread_paced(rate: float, count: int, send: Send, tick_s: float) -> float:
    loop = asyncio.get_running_loop()
    plan = _Schedule(rate, count, send)
    stop = threading.Event()
    plan.finished.add_done_callback(lambda _f: stop.set())  # also when a send failed

    def pace() -> None:  # on the timing thread; plan.sent belongs to the loop thread
        handed = 0
        while handed < count and not stop.is_set():
            now = time.perf_counter()
            due = plan.due(now)
            if due > handed:
                try:
                    loop.call_soon_threadsafe(plan.fire, due)
                except RuntimeError:  # the loop closed under us: the caller is gone
                    return
                handed = due
            else:
                time.sleep(max(plan.start + handed * plan.interval - now, tick_s))

    switch_interval = sys.getswitchinterval()
    sys.setswitchinterval(min(switch_interval, _SWITCH_INTERVAL_S))
    thread = threading.Thread(target=pace, name="bench-pacer", daemon=True)
    thread.start()
    try:
        await plan.finished
    finally:
        stop.set()
        await asyncio.to_thread(thread.join)
        sys.setswitchinterval(switch_interval)
    return plan.start


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


def _timespec(seconds: float) -> _Timespec:
    ns = max(1, round(seconds * 1e9))  # 0 would disarm the timer
    return _Timespec(ns // 1_000_000_000, ns % 1_000_000_000)


class _TimerFd:
    """A periodic Linux timerfd through libc (``os.timerfd_*`` needs Python 3.13)."""

    def __init__(self, libc: ctypes.CDLL, fd: int) -> None:
        self._libc = libc
        self.fd = fd

    @classmethod
    def create(cls) -> _TimerFd | None:
        if not sys.platform.startswith("linux"):
            return None
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            create = libc.timerfd_create
        except (OSError, AttributeError):
            return None
        create.argtypes = [ctypes.c_int, ctypes.c_int]
        libc.timerfd_settime.argtypes = [
            ctypes.c_int, ctypes.c_int, ctypes.POINTER(_Itimerspec), ctypes.c_void_p
        ]  # fmt: skip
        fd = create(_CLOCK_MONOTONIC, os.O_NONBLOCK | os.O_CLOEXEC)
        if fd < 0:
            return None
        return cls(libc, fd)

    def arm(self, *, first_s: float, interval_s: float) -> None:
        spec = _Itimerspec(_timespec(interval_s), _timespec(first_s))
        if self._libc.timerfd_settime(self.fd, 0, ctypes.byref(spec), None) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"timerfd_settime: {os.strerror(err)}")

    def expirations(self) -> int:
        """Periods elapsed since the last call (0 when woken spuriously)."""
        try:
            return int(_EXPIRATIONS.unpack(os.read(self.fd, 8))[0])
        except BlockingIOError:
            return 0

    def __enter__(self) -> _TimerFd:
        return self

    def __exit__(self, *exc_info: object) -> None:
        os.close(self.fd)
