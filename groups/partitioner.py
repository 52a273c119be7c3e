"""Kafka's default partitioner: the code is :mod:`foundation.partitioner` (pure), where
the thin client can use it too; the names stay importable from here."""

from foundation.partitioner import (
    StickyPartitioner,
    key_hash,
    murmur2,
    partition_for_key,
    to_positive,
)

__all__ = ["StickyPartitioner", "key_hash", "murmur2", "partition_for_key", "to_positive"]
