"""foundation.backoff: the one retry backoff every retry loop uses (issue 23)."""

from __future__ import annotations

import random

import pytest

from foundation.backoff import Backoff, BackoffPolicy, retry


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_doubles_up_to_the_cap_and_resets() -> None:
    backoff = Backoff(BackoffPolicy(delay_s=0.5, max_delay_s=3.0))
    assert [backoff.next_s() for _ in range(5)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert backoff.tries == 5
    backoff.reset()
    assert (backoff.tries, backoff.delay_s, backoff.next_s()) == (0, 0.5, 0.5)


def test_a_first_delay_above_the_cap_comes_down_to_it() -> None:
    backoff = Backoff(BackoffPolicy(delay_s=5.0, max_delay_s=1.0))
    assert [backoff.next_s() for _ in range(3)] == [5.0, 1.0, 1.0]


def test_factor_and_grow() -> None:
    backoff = Backoff(BackoffPolicy(delay_s=1.0, max_delay_s=100.0, factor=3.0))
    backoff.grow()
    assert backoff.delay_s == 3.0
    assert backoff.next_s() == 3.0
    assert backoff.delay_s == 9.0


def test_full_jitter_stays_within_the_delay() -> None:
    rng = random.Random(7)
    backoff = Backoff(BackoffPolicy(delay_s=1.0, max_delay_s=1.0, jitter=1.0), rng=rng)
    draws = [backoff.next_s() for _ in range(200)]
    assert all(0.0 <= d <= 1.0 for d in draws)
    assert min(draws) < 0.1 and max(draws) > 0.9  # spread over the whole range
    again = Backoff(BackoffPolicy(delay_s=1.0, max_delay_s=1.0, jitter=1.0), rng=random.Random(7))
    assert [again.next_s() for _ in range(200)] == draws  # a seed replays the loop


def test_partial_jitter_keeps_the_lower_share() -> None:
    backoff = Backoff(BackoffPolicy(delay_s=2.0, max_delay_s=2.0, jitter=0.25))
    assert all(1.5 <= backoff.next_s() <= 2.0 for _ in range(100))


def test_max_tries_expires() -> None:
    backoff = Backoff(BackoffPolicy(delay_s=0.1, max_delay_s=1.0, max_tries=2))
    assert not backoff.expired()
    backoff.next_s()
    assert not backoff.expired()
    backoff.next_s()
    assert backoff.expired()
    backoff.reset()
    assert not backoff.expired()


def test_deadline_caps_the_delay_and_expires() -> None:
    clock = Clock()
    backoff = Backoff(BackoffPolicy(delay_s=4.0, max_delay_s=8.0, deadline_s=5.0), clock=clock)
    assert backoff.next_s() == 4.0
    clock.now += 4.0
    assert backoff.remaining_s() == 1.0
    assert backoff.next_s() == 1.0  # never sleeps past the deadline
    assert not backoff.expired()
    clock.now += 1.0
    assert backoff.expired()
    assert backoff.remaining_s() == 0.0
    assert Backoff(BackoffPolicy(delay_s=1.0, max_delay_s=1.0)).remaining_s() is None


@pytest.mark.parametrize(
    "fields",
    [
        {"delay_s": -1.0, "max_delay_s": 1.0},
        {"delay_s": 1.0, "max_delay_s": -1.0},
        {"delay_s": 1.0, "max_delay_s": 1.0, "factor": 0.5},
        {"delay_s": 1.0, "max_delay_s": 1.0, "jitter": 1.5},
        {"delay_s": 1.0, "max_delay_s": 1.0, "max_tries": -2},
        {"delay_s": 1.0, "max_delay_s": 1.0, "deadline_s": -1.0},
    ],
)
def test_policy_is_checked(fields: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="backoff"):
        BackoffPolicy(**fields)  # type: ignore[arg-type]


async def test_retry_until_success_reports_each_wait() -> None:
    calls: list[int] = []
    waits: list[tuple[str, float]] = []

    async def op() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionError(f"try {len(calls)}")
        return "done"

    policy = BackoffPolicy(delay_s=0.001, max_delay_s=0.002)
    result = await retry(
        op, policy, retry_on=(ConnectionError,), on_retry=lambda e, d: waits.append((str(e), d))
    )
    assert result == "done"
    assert waits == [("try 1", 0.001), ("try 2", 0.002)]


async def test_retry_raises_the_last_error_once_expired() -> None:
    calls = 0

    async def op() -> None:
        nonlocal calls
        calls += 1
        raise ConnectionError(f"try {calls}")

    policy = BackoffPolicy(delay_s=0.0, max_delay_s=0.0, max_tries=2)
    with pytest.raises(ConnectionError, match="try 3"):
        await retry(op, policy, retry_on=(ConnectionError,))
    assert calls == 3


async def test_retry_lets_other_errors_through() -> None:
    async def op() -> None:
        raise KeyError("not retried")

    with pytest.raises(KeyError):
        await retry(op, BackoffPolicy(delay_s=0.0, max_delay_s=0.0), retry_on=(ConnectionError,))
