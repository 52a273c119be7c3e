"""Which partition a record goes to: Kafka's default partitioner, exactly (pure; the
thin client and the core producer both use it).

Keyed records go to ``toPositive(murmur2(key)) % partitions``, bit for bit what
Kafka's Java client computes (``Utils.murmur2`` with seed ``0x9747b28c``, then
``& 0x7fffffff``), so a user moving from Kafka keeps every key in the partition it was
in. Unkeyed records are *sticky*: they all go to one partition until a batch is cut
(by size or a linger), then the next batch picks another partition, spreading load
over all partitions without splitting every batch (KIP-480).
"""

from __future__ import annotations

import random
import struct
from typing import Final

from foundation.errors import BadRequestError

__all__ = ["StickyPartitioner", "murmur2", "partition_for_key", "to_positive"]

_SEED: Final = 0x9747B28C
_M: Final = 0x5BD1E995
_R: Final = 24
_MASK32: Final = 0xFFFFFFFF


def _signed32(x: int) -> int:
    x &= _MASK32
    return x - (1 << 32) if x & 0x80000000 else x


def murmur2(data: bytes) -> int:
    """Kafka's ``Utils.murmur2``: a signed 32-bit MurmurHash2 of ``data``."""
    length = len(data)
    h = (_SEED ^ length) & _MASK32
    blocks = length // 4
    for (word,) in struct.iter_unpack("<I", data[: blocks * 4]):
        k = (word * _M) & _MASK32
        k ^= k >> _R
        k = (k * _M) & _MASK32
        h = (h * _M) & _MASK32
        h ^= k
    tail = data[blocks * 4 :]
    rest = len(tail)
    # Java's switch falls through: 3 bytes mix in byte 2, then 1, then 0.
    if rest == 3:
        h ^= tail[2] << 16
    if rest >= 2:
        h ^= tail[1] << 8
    if rest >= 1:
        h ^= tail[0]
        h = (h * _M) & _MASK32
    h ^= h >> 13
    h = (h * _M) & _MASK32
    h ^= h >> 15
    return _signed32(h)


def to_positive(number: int) -> int:
    """Kafka's ``Utils.toPositive``: clear the sign bit (not ``abs``)."""
    return number & 0x7FFFFFFF


def partition_for_key(key: bytes, partitions: int) -> int:
    """The partition Kafka's default partitioner picks for ``key``."""
    if partitions <= 0:
        raise BadRequestError(f"a topic has at least one partition, not {partitions}")
    return to_positive(murmur2(key)) % partitions


class StickyPartitioner:
    """Partitions for unkeyed records: the same one until :meth:`next_batch`, then
    another at random (never the same one twice in a row when there is a choice)."""

    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng if rng is not None else random.Random()
        self._current: dict[str, int] = {}

    def partition(self, topic: str, partitions: int) -> int:
        current = self._current.get(topic)
        if current is None or current >= partitions:
            current = self._current[topic] = self._rng.randrange(partitions)
        return current

    def next_batch(self, topic: str, partitions: int) -> None:
        """The batch for ``topic`` was cut: the next unkeyed record starts a new one."""
        old = self._current.get(topic)
        if partitions <= 1:
            self._current[topic] = 0
            return
        pick = self._rng.randrange(partitions - 1 if old is not None else partitions)
        if old is not None and pick >= old:
            pick += 1
        self._current[topic] = pick
