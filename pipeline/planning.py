"""Partition planning for the Spark data source, as pure functions (no pyspark, no I/O).

The driver takes a snapshot of each selected stream (:class:`StreamView`: its readable
sequence-id range and segments), resolves the requested offsets into a half-open
sequence-id range per stream (:func:`resolve_range`, which is where data loss is
detected), and cuts every segment's part of that range into :class:`Slice` objects of
at most ``max_records`` records (:func:`plan_slices`); one Spark partition reads one
slice straight from the bookies.

Sequence ids, not entry ids, delimit a slice, because a ledger entry holds a batch of
records of unknown size. A slice carries an *entry hint* (where its first record should
be if records spread evenly over entries) so the task usually finds its first entry with
one read; see :mod:`pipeline.client` for the search that makes the hint only a hint.

Segment ranges come from the start sequence ids of consecutive segments (the last ends
at the stream's ``next_sequence_id``), so an in-progress segment whose metadata counts
are not final is still planned right.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from foundation.errors import BadRequestError, TruncatedError
from pipeline.options import EARLIEST, LATEST

__all__ = [
    "SegmentView",
    "Slice",
    "StreamView",
    "TopicPartition",
    "cap_end_offsets",
    "decode_offsets",
    "encode_offsets",
    "plan_slices",
    "records_per_slice",
    "resolve_range",
]


@dataclass(frozen=True, slots=True, order=True)
class TopicPartition:
    """One partition a read selected: partition ``p`` of topic ``t`` is the stream
    ``t~p``; a plain stream ``s`` is partition 0 of a topic named ``s``."""

    topic: str
    partition: int
    stream: str

    @classmethod
    def of_stream(cls, stream: str) -> TopicPartition:
        from foundation.names import parse_internal

        parsed = parse_internal(stream)
        if parsed is not None and parsed[0] == "partition" and parsed[2] is not None:
            return cls(parsed[1], parsed[2], stream)
        return cls(stream, 0, stream)

    @property
    def is_topic_partition(self) -> bool:
        return self.topic != self.stream


def encode_offsets(offsets: Mapping[TopicPartition, int]) -> dict[str, Any]:
    """Streaming offsets as Kafka writes them, ``{"t": {"0": 23}}``; a plain stream is
    ``{"s": 23}`` (so the two never collide)."""
    out: dict[str, Any] = {}
    for tp in sorted(offsets):
        if tp.is_topic_partition:
            out.setdefault(tp.topic, {})[str(tp.partition)] = int(offsets[tp])
        else:
            out[tp.stream] = int(offsets[tp])
    return out


def decode_offsets(data: Mapping[str, Any]) -> dict[str, int]:
    """Offsets of :func:`encode_offsets` (or Bookline's earlier flat ``{"s": n}``) as
    ``{stream name: sequence id}``."""
    from foundation.names import partition_stream

    out: dict[str, int] = {}
    for name, value in data.items():
        if isinstance(value, Mapping):
            for p, v in value.items():
                out[partition_stream(name, int(p))] = int(v)
        else:
            out[name] = int(value)
    return out


@dataclass(frozen=True, slots=True)
class SegmentView:
    """What planning needs of one segment (from the core's SegmentInfo)."""

    seqno: int
    start_sequence_id: int
    record_count: int
    last_entry_id: int  # -1: none known yet (an in-progress segment)
    truncated: bool = False


@dataclass(frozen=True, slots=True)
class StreamView:
    """A snapshot of one stream: readable records are [first_sequence_id, next_sequence_id)."""

    name: str
    first_sequence_id: int
    next_sequence_id: int
    segments: tuple[SegmentView, ...]
    # The topic and partition the stream is (a plain stream: itself, partition 0).
    topic: str = ""
    partition: int = 0

    def segment_ranges(self) -> list[tuple[SegmentView, int, int]]:
        """Each segment with the half-open sequence-id range it holds, oldest first."""
        ranges: list[tuple[SegmentView, int, int]] = []
        segs = sorted(self.segments, key=lambda s: s.seqno)
        for i, seg in enumerate(segs):
            end = segs[i + 1].start_sequence_id if i + 1 < len(segs) else self.next_sequence_id
            if end > seg.start_sequence_id:
                ranges.append((seg, seg.start_sequence_id, end))
        return ranges


@dataclass(frozen=True, slots=True)
class Slice:
    """One Spark partition's work: records [seq_lo, seq_hi) of one segment of one stream.

    Picklable and small: it travels from the driver to an executor.
    """

    stream: str
    seqno: int
    seq_lo: int
    seq_hi: int
    # Expected entry of seq_lo (records spread evenly); the reader checks and searches.
    entry_hint: int
    # Last entry of the segment when planned; -1 when unknown (in progress).
    last_entry_id: int
    # Fail (True) or skip (False) when the slice turns out truncated at read time.
    fail_on_data_loss: bool = True
    # The topic and partition of the stream (the rows' topic/partition columns).
    topic: str = ""
    partition: int = 0

    @property
    def record_count(self) -> int:
        return self.seq_hi - self.seq_lo


def resolve_range(
    view: StreamView,
    start: int | None,
    end: int | None,
    *,
    fail_on_data_loss: bool,
) -> tuple[int, int]:
    """Turn requested offsets into a readable half-open range [lo, hi) of ``view``.

    ``start``/``end`` are sequence ids, EARLIEST (-2), LATEST (-1) or None (earliest
    start, latest end). A start before the oldest readable record means records were
    truncated or deleted by retention: TruncatedError when ``fail_on_data_loss``, else
    the range starts at the oldest readable record.
    """
    first, nxt = view.first_sequence_id, view.next_sequence_id
    lo = first if start is None or start == EARLIEST else nxt if start == LATEST else start
    hi = nxt if end is None or end == LATEST else end
    if lo < first:
        if fail_on_data_loss:
            raise TruncatedError(
                f"stream {view.name!r}: records {lo}..{min(first, hi) - 1} were truncated or "
                f"deleted by retention (oldest readable is {first}); set failOnDataLoss=false "
                "to skip them"
            )
        lo = first
    if lo > nxt:
        if fail_on_data_loss:
            raise TruncatedError(
                f"stream {view.name!r}: start {lo} is beyond the end of the stream ({nxt}); "
                "was the stream deleted and re-created? set failOnDataLoss=false to skip"
            )
        lo = nxt
    if hi > nxt:
        raise BadRequestError(
            f"stream {view.name!r}: endingOffsets {hi} is beyond the end of the stream ({nxt})"
        )
    if lo > hi:
        raise BadRequestError(
            f"stream {view.name!r}: the start ({lo}) is after the end ({hi}); check "
            "startingOffsets/endingOffsets (or the timestamps)"
        )
    return lo, hi


def records_per_slice(total_records: int, min_partitions: int | None, max_records: int) -> int:
    """Slice size: at most ``max_records``, small enough to give ``min_partitions``."""
    size = max_records
    if min_partitions is not None and total_records > 0:
        size = min(size, max(1, math.ceil(total_records / min_partitions)))
    return max(1, size)


def _entry_hint(seg: SegmentView, seg_lo: int, seq: int) -> int:
    if seg.last_entry_id < 0 or seg.record_count <= 0:
        return 0
    entries = seg.last_entry_id + 1
    return min(seg.last_entry_id, (seq - seg_lo) * entries // seg.record_count)


def plan_slices(
    ranges: Sequence[tuple[StreamView, int, int]],
    *,
    min_partitions: int | None,
    max_records: int,
    fail_on_data_loss: bool,
) -> list[Slice]:
    """Cut each stream's [lo, hi) into slices: one or more per overlapped segment."""
    total = sum(hi - lo for _view, lo, hi in ranges)
    size = records_per_slice(total, min_partitions, max_records)
    slices: list[Slice] = []
    for view, lo, hi in ranges:
        for seg, seg_lo, seg_hi in view.segment_ranges():
            a, b = max(lo, seg_lo), min(hi, seg_hi)
            if a >= b:
                continue
            if seg.truncated and fail_on_data_loss:
                raise TruncatedError(
                    f"stream {view.name!r}: segment {seg.seqno} (records {seg_lo}..{seg_hi - 1})"
                    " was truncated; set failOnDataLoss=false to skip it"
                )
            if seg.truncated:
                continue
            for piece in range(a, b, size):
                slices.append(
                    Slice(
                        stream=view.name,
                        seqno=seg.seqno,
                        seq_lo=piece,
                        seq_hi=min(b, piece + size),
                        entry_hint=_entry_hint(seg, seg_lo, piece),
                        last_entry_id=seg.last_entry_id,
                        fail_on_data_loss=fail_on_data_loss,
                        topic=view.topic or view.name,
                        partition=view.partition,
                    )
                )
    return slices


def cap_end_offsets(
    start: Mapping[str, int], latest: Mapping[str, int], max_records: int | None
) -> dict[str, int]:
    """Admission control: end offsets at most ``max_records`` records past ``start``.

    The budget is shared fairly (water-filling, smallest backlog first, ties by name), so
    one busy stream cannot starve the others. A stream missing from ``start`` stays at its
    latest offset: the caller gives new streams a start first.
    """
    end = {s: max(start.get(s, latest[s]), latest[s]) for s in latest}
    if max_records is None:
        return end
    backlog = sorted(
        ((end[s] - start.get(s, end[s]), s) for s in end if end[s] > start.get(s, end[s])),
    )
    remaining = max_records
    for i, (avail, stream) in enumerate(backlog):
        share = remaining // (len(backlog) - i)
        take = min(avail, share)
        end[stream] = start[stream] + take
        remaining -= take
    return end
