"""tests.waiting, the one wait helper of the test suite: it returns what the condition
gave, fails naming what it awaited, stops at once on the condition's own error, and
scales its deadlines (BOOKLINE_TEST_TIME_SCALE or the load per core)."""

from __future__ import annotations

import itertools
import re

import pytest

from tests import waiting
from tests.waiting import scaled, time_scale, wait_for, wait_until


async def test_returns_the_first_truthy_value_of_a_plain_or_async_condition() -> None:
    counter = itertools.count()
    assert await wait_for(lambda: next(counter) >= 3 and "ready", interval_s=0.001) == "ready"

    async def later() -> list[int]:
        return [1] if next(counter) > 6 else []

    assert await wait_for(later, interval_s=0.001) == [1]


async def test_a_timeout_names_what_was_awaited_and_the_last_value(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(waiting, "time_scale", lambda: 1.0)
    with pytest.raises(AssertionError, match=re.escape("waiting for the answer (last seen: [])")):
        await wait_for(lambda: [], "the answer", timeout_s=0.05, interval_s=0.01)
    with pytest.raises(AssertionError, match="waiting for log tail: boom"):
        wait_until(lambda: 0, lambda: "log tail: boom", timeout_s=0.05, interval_s=0.01)


async def test_an_error_of_the_condition_ends_the_wait_at_once() -> None:
    def died() -> bool:
        raise RuntimeError("the process exited")

    with pytest.raises(RuntimeError, match="exited"):
        await wait_for(died, timeout_s=3600)


def test_the_scale_comes_from_the_environment_or_the_load(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(waiting.SCALE_ENV, "2.5")
    assert waiting._fixed_scale() == 2.5
    for bad in ("0.5", "fast"):
        monkeypatch.setenv(waiting.SCALE_ENV, bad)
        with pytest.raises(ValueError, match=waiting.SCALE_ENV):
            waiting._fixed_scale()
    monkeypatch.delenv(waiting.SCALE_ENV)
    assert waiting._fixed_scale() is None
    assert 1.0 <= waiting._load_scale() <= waiting.AUTO_SCALE_MAX
    assert time_scale() >= waiting.TIME_SCALE >= 1.0
    assert scaled(2.0) >= 2.0
