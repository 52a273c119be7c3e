"""Where entries live: write-set math, ensemble placement and bookie health (pure).

* Entry ``i`` of an ensemble of ``E`` bookies goes to positions ``(i + k) mod E`` for
  ``k < Qw`` (:func:`write_set`, from :mod:`foundation.quorum`). Striping spreads load;
  consecutive positions share entries, so placement puts different racks next to each
  other.
* :func:`choose_ensemble` picks ``E`` writable bookies, preferring ones that have not
  failed recently and spreading them round-robin over rack labels.
* :func:`choose_replacement` picks the bookie that takes over one position in an
  ensemble change: never a current member, preferably healthy, preferably on a rack the
  other members of the affected write sets do not use.
* :class:`BookieHealth` remembers recent failures and latencies; readers use it to order
  replicas (healthy and fast first), writers and placement to avoid failing bookies.

Time and randomness are injected (``now`` arguments, ``random.Random``), so tests replay.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from foundation.errors import NotEnoughBookiesError
from foundation.quorum import write_set

__all__ = [
    "BookieCandidate",
    "BookieHealth",
    "choose_ensemble",
    "choose_replacement",
    "write_set",
    "write_sets_containing",
]

# Weight of the newest latency sample in the moving average (why: reacts within ~5 samples).
_LATENCY_EWMA_ALPHA = 0.2
# Bookies tracked by a health table; the oldest are forgotten past it (bounded memory).
_HEALTH_ENTRIES_MAX = 4_096


def write_sets_containing(position: int, ensemble_size: int, write_quorum: int) -> list[list[int]]:
    """Every distinct write set (as position lists) that includes ``position``."""
    sets: list[list[int]] = []
    seen: set[frozenset[int]] = set()
    for first in range(ensemble_size):
        ws = write_set(first, ensemble_size, write_quorum)
        if position in ws and frozenset(ws) not in seen:
            seen.add(frozenset(ws))
            sets.append(ws)
    return sets


@dataclass(frozen=True, slots=True)
class BookieCandidate:
    """A writable bookie as placement sees it."""

    bookie_id: str
    rack: str = ""


class BookieHealth:
    """Recent failures and latency per bookie, for placement and replica ordering."""

    def __init__(self, avoid_ms: float, clock: Callable[[], float]) -> None:
        self._avoid_s = avoid_ms / 1000.0
        self._clock = clock
        self._failed_at: dict[str, float] = {}
        self._latency_s: dict[str, float] = {}

    def record_failure(self, bookie_id: str) -> None:
        self._failed_at[bookie_id] = self._clock()
        self._bound(self._failed_at)

    def record_success(self, bookie_id: str, latency_s: float) -> None:
        old = self._latency_s.get(bookie_id)
        self._latency_s[bookie_id] = (
            latency_s if old is None else old + _LATENCY_EWMA_ALPHA * (latency_s - old)
        )
        self._bound(self._latency_s)

    @staticmethod
    def _bound(table: dict[str, float]) -> None:
        while len(table) > _HEALTH_ENTRIES_MAX:
            del table[next(iter(table))]

    def latency_s(self, bookie_id: str) -> float | None:
        """The bookie's recent answer latency (an EWMA), None before its first answer."""
        return self._latency_s.get(bookie_id)

    def is_avoided(self, bookie_id: str) -> bool:
        at = self._failed_at.get(bookie_id)
        return at is not None and self._clock() - at < self._avoid_s

    def avoided(self) -> set[str]:
        return {b for b in self._failed_at if self.is_avoided(b)}

    def order(self, bookie_ids: Sequence[str]) -> list[int]:
        """Indexes into ``bookie_ids``: healthy first, then by latency; ties keep order."""

        def key(i: int) -> tuple[bool, float, int]:
            b = bookie_ids[i]
            return (self.is_avoided(b), self._latency_s.get(b, 0.0), i)

        return sorted(range(len(bookie_ids)), key=key)


def _round_robin_by_rack(
    cands: Sequence[BookieCandidate], rng: random.Random
) -> list[BookieCandidate]:
    """Shuffle, then interleave racks so neighbours differ whenever possible."""
    by_rack: dict[str, list[BookieCandidate]] = {}
    shuffled = list(cands)
    rng.shuffle(shuffled)
    for c in shuffled:
        by_rack.setdefault(c.rack, []).append(c)
    # Larger racks first so the tail is not a run of one rack.
    racks = sorted(by_rack.values(), key=len, reverse=True)
    out: list[BookieCandidate] = []
    while any(racks):
        for members in racks:
            if members:
                out.append(members.pop())
    return out


def choose_ensemble(
    candidates: Iterable[BookieCandidate],
    ensemble_size: int,
    *,
    avoid: set[str],
    rng: random.Random,
) -> list[str]:
    """``ensemble_size`` distinct bookie ids; recently failing ones only if needed."""
    unique = {c.bookie_id: c for c in candidates}
    if len(unique) < ensemble_size:
        raise NotEnoughBookiesError(
            f"ensemble of {ensemble_size} needs as many writable bookies, {len(unique)} available"
        )
    healthy = [c for c in unique.values() if c.bookie_id not in avoid]
    sick = [c for c in unique.values() if c.bookie_id in avoid]
    # Round-robin over racks: a prefix of the interleaving takes one bookie per rack first.
    chosen = (_round_robin_by_rack(healthy, rng) + _round_robin_by_rack(sick, rng))[:ensemble_size]
    return [c.bookie_id for c in chosen]


def choose_replacement(
    candidates: Iterable[BookieCandidate],
    ensemble: Sequence[str],
    position: int,
    write_quorum: int,
    *,
    avoid: set[str],
    racks: dict[str, str],
    rng: random.Random,
) -> str:
    """A bookie to take over ``ensemble[position]``.

    Never a current member (two replicas of an entry on one bookie would count twice
    toward the ack quorum). Prefers healthy bookies, then racks that no other member
    of the write sets containing ``position`` uses. ``racks`` maps bookie id -> rack.
    """
    members = set(ensemble)
    pool = [c for c in {c.bookie_id: c for c in candidates}.values() if c.bookie_id not in members]
    if not pool:
        raise NotEnoughBookiesError(
            f"no writable bookie outside the ensemble {list(ensemble)} to replace "
            f"{ensemble[position]}"
        )
    neighbours: set[int] = set()
    for ws in write_sets_containing(position, len(ensemble), write_quorum):
        neighbours.update(p for p in ws if p != position)
    used_racks = {racks.get(ensemble[p], "") for p in neighbours}
    rng.shuffle(pool)

    def score(c: BookieCandidate) -> tuple[bool, bool]:
        return (c.bookie_id in avoid, bool(c.rack) and c.rack in used_racks)

    return min(pool, key=score).bookie_id
