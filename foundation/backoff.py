"""The one retry backoff (a leaf: imports nothing of ours), after kazoo's ``KazooRetry``.

A :class:`BackoffPolicy` says how a retry loop waits: the first delay, the factor it
grows by after each wait, its cap, how much of it is random (jitter), and when the
loop gives up (tries, deadline). A :class:`Backoff` is one loop's state under a policy:
``next_s()`` hands out the delay to wait now and grows the next one, ``reset()`` goes
back to the first delay after a success, ``expired()`` says when to stop retrying.
:func:`retry` is the whole loop for an awaitable operation.

Time and randomness are injectable (``clock``, ``rng``) so tests can replay a loop.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class BackoffPolicy:
    """How a retry loop waits; every field is checked (``ValueError``: a programming
    error, not user input)."""

    # The first delay, in seconds.
    delay_s: float
    # The largest delay, in seconds: growth stops here.
    max_delay_s: float
    # Each delay is the previous one times this (2: doubling).
    factor: float = 2.0
    # The random share of each delay: the wait is uniform in [delay * (1 - jitter),
    # delay]. 0 waits exactly the delay; 1 is "full jitter" (uniform in [0, delay]),
    # which spreads clients that failed together.
    jitter: float = 0.0
    # Delays handed out before expired() says stop; -1: no limit.
    max_tries: int = -1
    # Seconds from the Backoff's start after which expired() says stop, and no delay
    # runs past; None: no deadline.
    deadline_s: float | None = None

    def __post_init__(self) -> None:
        # A first delay above the cap is allowed (the next ones are the cap).
        if self.delay_s < 0 or self.max_delay_s < 0:
            raise ValueError(f"backoff delays {self.delay_s}, {self.max_delay_s} s: negative")
        if self.factor < 1:
            raise ValueError(f"backoff factor {self.factor} below 1")
        if not 0 <= self.jitter <= 1:
            raise ValueError(f"backoff jitter {self.jitter} not in [0, 1]")
        if self.max_tries < -1:
            raise ValueError(f"backoff max_tries {self.max_tries} below -1")
        if self.deadline_s is not None and self.deadline_s < 0:
            raise ValueError(f"backoff deadline {self.deadline_s} s is negative")


class Backoff:
    """One retry loop's waiting state under a :class:`BackoffPolicy`."""

    __slots__ = ("_clock", "_deadline", "_delay_s", "_rng", "policy", "tries")

    def __init__(
        self,
        policy: BackoffPolicy,
        *,
        rng: random.Random | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.policy = policy
        self._rng = rng if rng is not None else random.Random()
        self._clock = clock
        self._deadline = None if policy.deadline_s is None else clock() + policy.deadline_s
        self._delay_s = policy.delay_s
        self.tries = 0  # delays handed out since the start or the last reset()

    @property
    def delay_s(self) -> float:
        """The current delay, before jitter (what ``next_s()`` draws from)."""
        return self._delay_s

    def remaining_s(self) -> float | None:
        """Seconds left before the deadline (never negative); None without one."""
        if self._deadline is None:
            return None
        return max(0.0, self._deadline - self._clock())

    def expired(self) -> bool:
        """True once the loop should stop retrying: ``max_tries`` delays were handed
        out, or the deadline passed."""
        if 0 <= self.policy.max_tries <= self.tries:
            return True
        return self._deadline is not None and self._clock() >= self._deadline

    def grow(self) -> None:
        """Make the current delay the next one (times ``factor``, capped)."""
        self._delay_s = min(self._delay_s * self.policy.factor, self.policy.max_delay_s)

    def next_s(self) -> float:
        """The delay to wait now (jittered, never past the deadline); the next one
        grows."""
        delay = self._delay_s
        if self.policy.jitter:
            delay = self._rng.uniform(delay * (1 - self.policy.jitter), delay)
        remaining = self.remaining_s()
        if remaining is not None:
            delay = min(delay, remaining)
        self.tries += 1
        self.grow()
        return delay

    def reset(self) -> None:
        """Back to the first delay and no tries (after a success); the deadline stays."""
        self._delay_s = self.policy.delay_s
        self.tries = 0

    async def sleep(self) -> None:
        """Wait ``next_s()``."""
        await asyncio.sleep(self.next_s())


async def retry(
    op: Callable[[], Awaitable[T]],
    policy: BackoffPolicy,
    *,
    retry_on: tuple[type[BaseException], ...],
    on_retry: Callable[[BaseException, float], None] | None = None,
    rng: random.Random | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> T:
    """``op()`` until it returns, retrying the errors in ``retry_on`` with ``policy``'s
    waits; the last error is raised once the policy expires. ``on_retry(error,
    delay_s)`` is told before each wait (to log it)."""
    backoff = Backoff(policy, rng=rng, clock=clock)
    while True:
        try:
            return await op()
        except retry_on as exc:
            if backoff.expired():
                raise
            delay = backoff.next_s()
            if on_retry is not None:
                on_retry(exc, delay)
            await asyncio.sleep(delay)
