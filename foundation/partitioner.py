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

__all__ = ["StickyPartitioner", "key_hash", "murmur2", "partition_for_key", "to_positive"]

_SEED: Final = 0x9747B28C
_M: Final = 0x5BD1E995
_R: Final = 24
_MASK32: Final = 0xFFFFFFFF


# Unpackers of n little-endian 32-bit words, made once: the per-key hot path then costs
# one C call for all of a key's words (keys longer than this unpack with a new format).
_WORDS_CACHED = 64
_UNPACK_WORDS = [struct.Struct(f"<{n}I").unpack_from for n in range(_WORDS_CACHED + 1)]


def _murmur2_u32(data: bytes) -> int:
    """Kafka's ``Utils.murmur2`` as an unsigned 32-bit value. Masking once per step is
    enough: the low 32 bits of ``a * M ^ b * M`` depend only on those of ``a`` and
    ``b``."""
    length = len(data)
    m, mask = _M, _MASK32
    h = _SEED ^ length
    blocks = length >> 2
    if blocks:
        if blocks <= _WORDS_CACHED:
            words = _UNPACK_WORDS[blocks](data)
        else:
            words = struct.unpack_from(f"<{blocks}I", data)
        for word in words:
            k = (word * m) & mask
            h = ((h * m) ^ ((k ^ (k >> _R)) * m)) & mask
    rest = length & 3
    if rest:
        base = blocks << 2
        # Java's switch falls through: 3 bytes mix in byte 2, then 1, then 0.
        if rest == 3:
            h ^= data[base + 2] << 16
        if rest >= 2:
            h ^= data[base + 1] << 8
        h = ((h ^ data[base]) * m) & mask
    h ^= h >> 13
    h = (h * m) & mask
    return h ^ (h >> 15)


def murmur2(data: bytes) -> int:
    """Kafka's ``Utils.murmur2``: a signed 32-bit MurmurHash2 of ``data``."""
    h = _murmur2_u32(data)
    return h - (1 << 32) if h & 0x80000000 else h


def to_positive(number: int) -> int:
    """Kafka's ``Utils.toPositive``: clear the sign bit (not ``abs``)."""
    return number & 0x7FFFFFFF


def key_hash(key: bytes) -> int:
    """``toPositive(murmur2(key))``: the key's partition is this modulo the count (a
    producer may keep it per key: it does not depend on the partition count)."""
    return _murmur2_u32(key) & 0x7FFFFFFF


def partition_for_key(key: bytes, partitions: int) -> int:
    """The partition Kafka's default partitioner picks for ``key``."""
    if partitions <= 0:
        raise BadRequestError(f"a topic has at least one partition, not {partitions}")
    return (_murmur2_u32(key) & 0x7FFFFFFF) % partitions


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
