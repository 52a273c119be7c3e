"""Open-loop pacing for the latency benchmarks, without busy-waiting.

An open-loop benchmark starts operation *i* at ``start + i / rate`` whatever the
answers do, and charges each operation from that *scheduled* time, so a stall is
counted against every operation it delays (no coordinated omission).

Pacing inside the event loop does not work at these rates: uvloop keeps timers in whole
milliseconds and rounds, so ``asyncio.sleep(0.0004)`` returns on the next loop iteration
and a pacer with sub-millisecond gaps spins a whole core -- on a 2-core machine, half of
the CPU the bookies being measured need. Here a timing thread sleeps until each
operation is due (``time.sleep`` is ``clock_nanosleep``: tens of microseconds late at
worst, no CPU while waiting) and hands every due batch to the loop with
``call_soon_threadsafe``.
"""

from __future__ import annotations

import asyncio
import math
import sys
import threading
import time
from collections.abc import Callable

from bookline.gctune import settle_heap

#: Lead before the first operation, so the thread starts before anything is due.
_LEAD_S = 0.002
_SWITCH_INTERVAL_S = 0.0002


async def open_loop(rate: float, count: int, send: Callable[[float], None]) -> float:
    """Call ``send(scheduled)`` on the loop thread for ``count`` operations at ``rate``
    per second; return once every ``send`` returned. Returns the scheduled start, so
    callers can compute elapsed time. ``send`` must not block; an exception it raises
    stops the schedule and is raised here."""
    if rate <= 0:
        raise ValueError(f"rate must be positive, got {rate}")
    # As a latency-sensitive client would once set up (the servers do the same): keep
    # full collections of the set-up heap out of the measured window.
    settle_heap()
    loop = asyncio.get_running_loop()
    finished: asyncio.Future[None] = loop.create_future()
    stop = threading.Event()
    interval = 1.0 / rate
    start = time.perf_counter() + _LEAD_S

    def fire(first: int, last: int) -> None:  # on the loop thread
        if finished.done():
            return
        try:
            for i in range(first, last):
                send(start + i * interval)
        except BaseException as exc:  # handed to the awaiting caller, not swallowed
            stop.set()
            finished.set_exception(exc)
            return
        if last == count:
            finished.set_result(None)

    def pace() -> None:  # on the timing thread
        sent = 0
        while sent < count and not stop.is_set():
            now = time.perf_counter()
            due = min(count, math.floor((now - start) / interval) + 1)
            if due > sent:
                try:
                    loop.call_soon_threadsafe(fire, sent, due)
                except RuntimeError:  # the loop closed under us: the caller is gone
                    return
                sent = due
            else:
                time.sleep(start + sent * interval - now)

    # The timing thread needs the GIL for a moment at each operation; with the default
    # 5 ms switch interval it could wait that long behind the loop thread's callbacks
    # (the bookie runs with 0.5 ms for the same reason).
    switch_interval = sys.getswitchinterval()
    sys.setswitchinterval(min(switch_interval, _SWITCH_INTERVAL_S))
    thread = threading.Thread(target=pace, name="bench-pacer", daemon=True)
    thread.start()
    try:
        if count > 0:
            await finished
    finally:
        stop.set()
        await asyncio.to_thread(thread.join)
        sys.setswitchinterval(switch_interval)
    return start
