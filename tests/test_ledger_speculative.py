"""Speculative requests: when a second replica is asked, and when not. Pure asyncio, on
virtual time (exact, and no wall-clock waits): the speculative timeouts and the replicas'
delays all run on the loop's clock, which is also the injected clock."""

from __future__ import annotations

import asyncio
from typing import Any

from ledger.placement import BookieHealth
from ledger.speculative import LATENCY_MULTIPLE, speculative
from tests.virtual_time import loop_clock, virtual_time


def health() -> BookieHealth:
    return BookieHealth(avoid_ms=60_000, clock=loop_clock())


class Replicas:
    """``a`` answers after ``slow_s``; every other replica at once."""

    def __init__(self, slow_s: float) -> None:
        self.slow_s = slow_s
        self.asked: list[tuple[str, float]] = []  # (replica, loop time asked)

    async def attempt(self, bookie: str) -> str:
        self.asked.append((bookie, asyncio.get_running_loop().time()))
        if bookie == "a":
            await asyncio.sleep(self.slow_s)
        return bookie

    @property
    def names(self) -> list[str]:
        return [b for b, _t in self.asked]


async def ask(replicas: Replicas, h: BookieHealth, **kw: Any) -> str:
    return await speculative(
        ["a", "b", "c"],
        replicas.attempt,
        health=h,
        clock=loop_clock(),
        first_timeout_s=0.02,
        max_timeout_s=1.0,
        what="test",
        **kw,
    )


@virtual_time
async def test_a_slow_replica_is_bypassed_after_the_first_timeout() -> None:
    replicas = Replicas(slow_s=1.0)
    assert await ask(replicas, health()) == "b"
    assert replicas.asked == [("a", 0.0), ("b", 0.02)]  # exactly the first timeout later


@virtual_time
async def test_a_read_ahead_is_not_copied_until_somebody_waits_for_it() -> None:
    replicas = Replicas(slow_s=0.3)
    needed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    task = asyncio.ensure_future(ask(replicas, health(), needed=needed))
    await asyncio.sleep(0.1)  # 5x the speculative timeout
    assert replicas.names == ["a"]  # nobody waits yet: no copy
    needed.set_result(None)
    assert await task == "b"  # waited longer than the timeout already: asked at once
    assert replicas.asked == [("a", 0.0), ("b", 0.1)]


@virtual_time
async def test_the_first_timeout_follows_the_replicas_recent_latency() -> None:
    """A replica that answers in ~50 ms is given 4x that before a copy goes out, not
    the configured 20 ms (a catch-up's queued reads are slow, not lost)."""
    h = health()
    for bookie, latency_s in (("a", 0.05), ("b", 0.06), ("c", 0.07)):
        h.record_success(bookie, latency_s)  # "a" is asked first
    replicas = Replicas(slow_s=0.1)
    assert await ask(replicas, h) == "a"
    assert replicas.names == ["a"]
    assert LATENCY_MULTIPLE * 0.05 > 0.1
