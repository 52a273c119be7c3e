"""The benchmarks' open-loop pacer: every operation sent once, in order, never before
it is due, from both implementations; a failing send stops the schedule loudly."""

from __future__ import annotations

import asyncio
import itertools
import time

import pytest

from ops.bench import pacing


@pytest.fixture(params=["timerfd", "thread"])
def impl(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    if request.param == "thread":
        monkeypatch.setattr(pacing._TimerFd, "create", classmethod(lambda cls: None))
    elif pacing._TimerFd.create() is None:
        pytest.skip("no timerfd here")
    return str(request.param)


async def test_sends_each_operation_once_on_schedule(impl: str) -> None:
    rate, count = 2_000.0, 300
    sent: list[tuple[float, float]] = []

    def send(scheduled: float) -> None:
        sent.append((scheduled, time.perf_counter()))

    t0 = time.perf_counter()
    start = await pacing.open_loop(rate, count, send)
    elapsed = time.perf_counter() - t0
    assert len(sent) == count
    assert [s for s, _ in sent] == [pytest.approx(start + i / rate) for i in range(count)]
    assert all(at >= scheduled - 1e-4 for scheduled, at in sent), impl  # never early
    assert elapsed >= (count - 1) / rate  # open loop: the schedule, not as fast as possible


async def test_a_tick_sends_what_fell_due_in_batches(impl: str) -> None:
    """With a tick longer than the interval the loop wakes once a tick, yet every
    operation keeps its own scheduled time and none is sent early."""
    rate, count, tick_s = 10_000.0, 400, 0.002
    sent: list[tuple[float, float]] = []

    def send(scheduled: float) -> None:
        sent.append((scheduled, time.perf_counter()))

    start = await pacing.open_loop(rate, count, send, tick_s=tick_s)
    assert [s for s, _ in sent] == [pytest.approx(start + i / rate) for i in range(count)]
    assert all(at >= scheduled - 1e-4 for scheduled, at in sent), impl
    times = [at for _, at in sent]
    wakeups = 1 + sum(b - a > tick_s / 2 for a, b in itertools.pairwise(times))
    assert wakeups <= count / (rate * tick_s) + 5, wakeups  # ~20 batches, not 400 sends


async def test_a_failing_send_is_raised(impl: str) -> None:
    calls = 0

    def send(_scheduled: float) -> None:
        nonlocal calls
        calls += 1
        if calls == 5:
            raise RuntimeError("send failed")

    with pytest.raises(RuntimeError, match="send failed"):
        await pacing.open_loop(1_000.0, 50, send)
    await asyncio.sleep(0.02)  # behaviour: 20 more sends would be due by now
    assert calls == 5  # nothing sent after the failure


async def test_rejects_a_non_positive_rate() -> None:
    with pytest.raises(ValueError, match="rate"):
        await pacing.open_loop(0, 1, lambda _s: None)
