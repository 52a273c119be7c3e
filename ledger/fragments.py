"""Fragments: which entries of a ledger one bookie holds, and the repair plans built
from them (pure: no I/O). The replication worker (:mod:`ledger.replication`) and the
replica check (:mod:`ledger.scrub`) reason with these.

A *fragment* is one bookie's position in one ensemble segment: entry ``i`` of the
segment is on positions ``(i + k) mod E`` for ``k < Qw``, so the fragment holds the
entries whose write set includes its position.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator, Mapping

from foundation.invariants import invariant
from metadata.ledger_metadata import LedgerMetadata, LedgerState, Segment
from metadata.underreplicated import EntryRanges

__all__ = [
    "Fragment",
    "fragment_entries",
    "fragments_to_replace",
    "repair_plan",
    "sealed_segments",
    "segment_last",
    "with_replacement",
    "writer_replaced",
]


@dataclasses.dataclass(frozen=True, slots=True)
class Fragment:
    """The entries one bookie holds in one ensemble segment."""

    segment_index: int
    first_entry_id: int  # the segment's first entry
    last_entry_id: int  # the segment's last entry, inclusive (< first: segment is empty)
    position: int  # the bookie's index in the segment's ensemble
    bookie: str


def segment_last(meta: LedgerMetadata, index: int) -> int:
    """The last entry of segment ``index`` (< its first entry when it holds none)."""
    if index + 1 < len(meta.segments):
        return meta.segments[index + 1].first_entry_id - 1
    return meta.last_entry_id


def sealed_segments(meta: LedgerMetadata) -> int:
    """How many segments, from the first, hold a final set of entries: all of a CLOSED
    ledger's; all but the last of an OPEN one (a writer starts a new segment after its
    last acknowledged entry, so the entries before it are where metadata says and no
    more come: BookKeeper re-replicates them without fencing the writer)."""
    return len(meta.segments) if meta.is_closed else len(meta.segments) - 1


def writer_replaced(meta: LedgerMetadata, lost: Iterable[str]) -> bool:
    """True when an OPEN ledger's writer no longer writes to any bookie of ``lost`` (it
    swapped them out of its last segment itself): only sealed segments need repair."""
    return meta.state is LedgerState.OPEN and not set(lost) & set(meta.last_segment.bookies)


def fragments_to_replace(meta: LedgerMetadata, lost: Iterable[str]) -> list[Fragment]:
    """Every (segment, position) of the sealed segments (:func:`sealed_segments`: all of
    a CLOSED ledger's) held by a bookie in ``lost``."""
    gone = set(lost)
    out: list[Fragment] = []
    for index, seg in enumerate(meta.segments[: sealed_segments(meta)]):
        for position, bookie in enumerate(seg.bookies):
            if bookie in gone:
                out.append(
                    Fragment(index, seg.first_entry_id, segment_last(meta, index), position, bookie)
                )
    return out


def fragment_entries(fragment: Fragment, ensemble_size: int, write_quorum: int) -> Iterator[int]:
    """Entry ids of the fragment's segment whose write set includes its position:
    entry ``i`` is on positions ``(i + k) mod E`` for ``k < Qw``."""
    for entry_id in range(fragment.first_entry_id, fragment.last_entry_id + 1):
        if (fragment.position - entry_id) % ensemble_size < write_quorum:
            yield entry_id


def with_replacement(meta: LedgerMetadata, fragment: Fragment, replacement: str) -> LedgerMetadata:
    """``meta`` with ``replacement`` in the fragment's position of its segment."""
    seg = meta.segments[fragment.segment_index]
    bookies = list(seg.bookies)
    bookies[fragment.position] = replacement
    segments = list(meta.segments)
    segments[fragment.segment_index] = Segment(seg.first_entry_id, tuple(bookies))
    return dataclasses.replace(meta, segments=tuple(segments))


def repair_plan(
    meta: LedgerMetadata, repairs: Mapping[str, EntryRanges], skip: set[str]
) -> dict[int, list[str]]:
    """Entry -> bookies to re-copy it to: the entries of each bookie's ranges whose write
    set includes it in ``meta`` (a CLOSED ledger), bookies in ``skip`` left out."""
    invariant(meta.is_closed, "ledger %d: repair plan of a ledger not closed", meta.ledger_id)
    plan: dict[int, list[str]] = {}
    for bookie, ranges in sorted(repairs.items()):
        if bookie in skip:
            continue
        for index, seg in enumerate(meta.segments):
            if bookie not in seg.bookies:
                continue
            frag = Fragment(
                index,
                seg.first_entry_id,
                segment_last(meta, index),
                seg.bookies.index(bookie),
                bookie,
            )
            for first, last in ranges:
                part = dataclasses.replace(
                    frag,
                    first_entry_id=max(first, frag.first_entry_id),
                    last_entry_id=min(last, frag.last_entry_id),
                )
                for entry_id in fragment_entries(part, meta.ensemble_size, meta.write_quorum):
                    plan.setdefault(entry_id, []).append(bookie)
    return plan
