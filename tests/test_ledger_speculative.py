"""Speculative requests: when a second replica is asked, and when not. Pure asyncio."""

from __future__ import annotations

import asyncio
import time

from ledger.placement import BookieHealth
from ledger.speculative import LATENCY_MULTIPLE, speculative


def health() -> BookieHealth:
    return BookieHealth(avoid_ms=60_000, clock=time.monotonic)


class Replicas:
    """``a`` answers after ``slow_s``; every other replica at once."""

    def __init__(self, slow_s: float) -> None:
        self.slow_s = slow_s
        self.asked: list[str] = []

    async def attempt(self, bookie: str) -> str:
        self.asked.append(bookie)
        if bookie == "a":
            await asyncio.sleep(self.slow_s)
        return bookie


async def ask(replicas: Replicas, h: BookieHealth, **kw: object) -> str:
    return await speculative(
        ["a", "b", "c"],
        replicas.attempt,
        health=h,
        clock=time.monotonic,
        first_timeout_s=0.02,
        max_timeout_s=1.0,
        what="test",
        **kw,
    )  # type: ignore[arg-type]


async def test_a_slow_replica_is_bypassed_after_the_first_timeout() -> None:
    replicas = Replicas(slow_s=1.0)
    started = time.monotonic()
    assert await ask(replicas, health()) == "b"
    assert replicas.asked == ["a", "b"]
    assert time.monotonic() - started < 0.5


async def test_a_read_ahead_is_not_copied_until_somebody_waits_for_it() -> None:
    replicas = Replicas(slow_s=0.3)
    needed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    task = asyncio.ensure_future(ask(replicas, health(), needed=needed))
    await asyncio.sleep(0.1)  # 5x the speculative timeout
    assert replicas.asked == ["a"]  # nobody waits yet: no copy
    needed.set_result(None)
    assert await task == "b"  # waited longer than the timeout already: asked at once
    assert replicas.asked == ["a", "b"]


async def test_the_first_timeout_follows_the_replicas_recent_latency() -> None:
    """A replica that answers in ~50 ms is given 4x that before a copy goes out, not
    the configured 20 ms (a catch-up's queued reads are slow, not lost)."""
    h = health()
    for bookie, latency_s in (("a", 0.05), ("b", 0.06), ("c", 0.07)):
        h.record_success(bookie, latency_s)  # "a" is asked first
    replicas = Replicas(slow_s=0.1)
    assert await ask(replicas, h) == "a"
    assert replicas.asked == ["a"]
    assert LATENCY_MULTIPLE * 0.05 > 0.1
