"""Periodic checkpoints are jittered so bookies started together drift apart.

The schedule is a pure function of the interval, the jitter fraction and a seeded RNG
(tested exactly); the engine test only checks behaviour that survives a loaded machine:
two engines started together with different seeds do not checkpoint together.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from itertools import islice
from pathlib import Path

import pytest

from bookie.config import BookieConfig
from bookie.storage.checkpoint import FIRST_CHECKPOINT_SPREAD, checkpoint_delays_s
from bookie.storage.engine import BookieStorage
from foundation.errors import ConfigError
from tests.waiting import wait_for

KEY = b"jitter-key"


def test_zero_jitter_is_the_fixed_schedule() -> None:
    delays = checkpoint_delays_s(10.0, 0.0, random.Random(1))
    assert list(islice(delays, 5)) == [10.0] * 5


@pytest.mark.parametrize("seed", [1, 2, 3, 12345])
def test_jittered_delays_stay_in_bounds_and_average_to_the_interval(seed: int) -> None:
    delays = list(islice(checkpoint_delays_s(10.0, 0.2, random.Random(seed)), 2001))
    low, high = FIRST_CHECKPOINT_SPREAD
    assert 10.0 * low <= delays[0] <= 10.0 * high, f"seed {seed}"
    assert all(8.0 <= d <= 12.0 for d in delays[1:]), f"seed {seed}"
    # Mean of 2000 uniform(8, 12) draws: standard error ~0.026 s.
    assert statistics.fmean(delays[1:]) == pytest.approx(10.0, abs=0.15), f"seed {seed}"
    assert len(set(delays)) == len(delays), f"seed {seed}: delays repeat"


def test_schedule_replays_from_its_seed() -> None:
    def schedule(seed: int) -> list[float]:
        return list(islice(checkpoint_delays_s(10.0, 0.2, random.Random(seed)), 50))

    assert schedule(7) == schedule(7)
    assert schedule(7) != schedule(8)


@pytest.mark.parametrize("fraction", [-0.1, 0.51, 1.0])
def test_config_rejects_jitter_out_of_range(fraction: float) -> None:
    with pytest.raises(ConfigError):
        BookieConfig(checkpoint_jitter_fraction=fraction)


def _config(tmp_path: Path, name: str, interval_ms: int) -> BookieConfig:
    return BookieConfig(
        journal_dir=str(tmp_path / name / "journal"),
        ledgers_dir=str(tmp_path / name / "ledgers"),
        index_dir=str(tmp_path / name / "index"),
        journal_prealloc_bytes=64 << 10,
        checkpoint_interval_ms=interval_ms,
        checkpoint_jitter_fraction=0.2,
        gc_interval_ms=600_000,
    )


async def test_engines_started_together_with_different_seeds_checkpoint_apart(
    tmp_path: Path,
) -> None:
    interval_ms = 300
    seeds = (1, 2)
    # Their schedules (first delay: 191 ms vs 437 ms) are far apart by construction, so
    # a generous tolerance still fails if the seed were ignored.
    firsts = [next(checkpoint_delays_s(interval_ms / 1000, 0.2, random.Random(s))) for s in seeds]
    assert abs(firsts[0] - firsts[1]) > 0.2, firsts
    engines = [
        BookieStorage(_config(tmp_path, f"b{s}", interval_ms), rng=random.Random(s)) for s in seeds
    ]
    times: list[list[float]] = [[], []]
    t0 = time.monotonic()

    def recorder(engine: BookieStorage, out: list[float]) -> None:
        real = engine.checkpoint

        async def checkpoint() -> None:
            out.append(time.monotonic() - t0)
            await real()

        engine.checkpoint = checkpoint  # type: ignore[method-assign]

    for engine, out in zip(engines, times, strict=True):
        recorder(engine, out)
    await asyncio.gather(*(e.start() for e in engines))
    try:
        for engine in engines:  # something to flush, so the checkpoints do real work
            await engine.add_entry(1, 0, -1, KEY, b"x" * 100)
        await wait_for(
            lambda: min(len(t) for t in times) >= 2,
            lambda: f"seeds {seeds}: two periodic checkpoints each, seen {times}",
            timeout_s=10.0, interval_s=0.02,
        )  # fmt: skip
        seen = [list(t) for t in times]
    finally:
        await asyncio.gather(*(e.close() for e in engines))
    assert min(len(t) for t in seen) >= 2, f"seeds {seeds}: periodic checkpoints {seen}"
    assert all(e.counters.checkpoints >= 1 for e in engines), seen
    # Started together, yet their first periodic checkpoints are well apart.
    assert abs(seen[0][0] - seen[1][0]) > 0.1, f"seeds {seeds}: checkpoint times {seen}"


def test_default_config_jitters() -> None:
    assert 0.0 < BookieConfig().checkpoint_jitter_fraction <= 0.5
