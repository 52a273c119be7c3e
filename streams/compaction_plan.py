"""Which records a compaction keeps (pure: no I/O, no clock).

Kafka's log cleaner is the model: one pass over the cleanable segments builds a map
*key -> latest offset*; a second pass keeps a keyed record only if it is its key's
latest, and drops a latest record that is a tombstone (a keyed record whose payload is
None) once its segment is older than ``delete.retention.ms``. Records without a key are
never superseded, so they are kept (Kafka refuses them on compacted topics; Bookline
keeps whatever was written). Only sealed segments older than ``min.compaction.lag.ms``
are cleanable; the active (in-progress) segment never is, and keys that appear only in
it or in younger segments do not supersede anything yet (Kafka's "dirty section" ends
at the first uncleanable offset too).

A topic's policy comes from its configs (``cleanup.policy``, ``delete.retention.ms``,
``min.compaction.lag.ms``) through :func:`policy_of`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from metadata.segments import SegmentMetadata, TruncationState
from metadata.topic_configs import compaction_configs
from streams.records import ReadRecord

__all__ = [
    "DELETE_RETENTION_MS_DEFAULT",
    "CompactionPolicy",
    "cleanable",
    "latest_offsets",
    "policy_of",
    "survivors",
    "tombstones_expire",
]

# Kafka's defaults (as metadata.topic_configs has them): tombstones stay a day.
DELETE_RETENTION_MS_DEFAULT: Final = 86_400_000
MIN_COMPACTION_LAG_MS_DEFAULT: Final = 0


@dataclass(frozen=True, slots=True)
class CompactionPolicy:
    compact: bool = False  # cleanup.policy holds "compact"
    delete_retention_ms: int = DELETE_RETENTION_MS_DEFAULT  # how long tombstones stay
    min_compaction_lag_ms: int = MIN_COMPACTION_LAG_MS_DEFAULT  # segments younger stay


def policy_of(configs: Mapping[str, str]) -> CompactionPolicy:
    """A topic's compaction policy from its configs by Kafka's names (its record's
    ``configs``; :mod:`metadata.topic_configs` holds the defaults)."""
    c = compaction_configs(configs)
    return CompactionPolicy(c.compact, c.delete_retention_ms, c.min_compaction_lag_ms)


def cleanable(segment: SegmentMetadata, policy: CompactionPolicy, now_ms: int) -> bool:
    """Sealed, wholly readable, and older than the minimum compaction lag."""
    return (
        segment.is_sealed
        and segment.truncation is TruncationState.ACTIVE
        and segment.sealed_ms + policy.min_compaction_lag_ms <= now_ms
    )


def tombstones_expire(segment: SegmentMetadata, policy: CompactionPolicy, now_ms: int) -> bool:
    """Whether the latest tombstones in ``segment`` may go: it was sealed more than
    ``delete.retention.ms`` ago (a consumer that reads the partition at least that
    often sees every delete, as Kafka promises)."""
    return segment.sealed_ms + policy.delete_retention_ms <= now_ms


def latest_offsets(records: Iterable[ReadRecord], into: dict[bytes, int]) -> None:
    """Fold ``records`` (in offset order) into the map key -> latest offset."""
    for r in records:
        if r.key is not None:
            into[r.key] = r.sequence_id


def survivors(
    records: Sequence[ReadRecord], latest: dict[bytes, int], drop_tombstones: bool
) -> list[ReadRecord]:
    """The records of one set that a compaction keeps, in order."""
    kept: list[ReadRecord] = []
    for r in records:
        if r.key is None or (
            latest.get(r.key, r.sequence_id) == r.sequence_id
            and not (drop_tombstones and r.payload is None)
        ):
            kept.append(r)
    return kept
