"""Resolving a :class:`StartPosition` to the DLSN of the first record at or after it.

Segment metadata narrows the search to one segment (by sequence id range, txid range
or seal time); inside it, a binary search over entries reads only record-set headers,
whose fields are monotonic in entry id: ``first_index`` (user records before the set),
``last_txid`` (the segment's last txid so far) and ``base_ts_ms`` (timestamps never go
back within a writer). A position past the end of what is written resolves to where
the next record will be.
"""

from __future__ import annotations

from collections.abc import Callable

from foundation.errors import TruncatedError
from ledger.reader import LedgerReader
from metadata.segments import SegmentMetadata, TruncationState
from streams.context import CoreContext
from streams.dlsn import DLSN, PositionKind, StartPosition
from streams.recordset import RecordSetHeader, decode_header, decode_read_records

__all__ = ["first_readable", "resolve_start"]


def first_readable(segments: list[SegmentMetadata]) -> DLSN:
    """The first position not truncated (where ``earliest`` starts)."""
    for seg in segments:
        if seg.truncation is TruncationState.TRUNCATED:
            continue
        if seg.truncation is TruncationState.PARTIALLY_TRUNCATED:
            return DLSN(*seg.min_active_dlsn)
        return DLSN(seg.seqno, 0, 0)
    return DLSN(segments[-1].seqno + 1, 0, 0) if segments else DLSN(1, 0, 0)


async def _readable_end(ctx: CoreContext, seg: SegmentMetadata) -> tuple[LedgerReader, int]:
    reader = await ctx.open_segment_reader(seg)
    if seg.is_sealed:
        return reader, seg.last_entry_id
    # Not the bookies' LAC at once: it lags the last acknowledgement a moment, and a
    # position past it would hand acknowledged records before the target out. -1: no
    # bookie has an entry of this new ledger yet.
    return reader, await reader.read_confirmed_end()


async def _after_end(ctx: CoreContext, seg: SegmentMetadata) -> DLSN:
    """Where ``latest`` starts in the in-progress segment: after every record
    acknowledged so far -- the LAC the bookies report may still lag the last
    acknowledgement, so after the last entry an ack quorum may hold instead
    (:meth:`LedgerReader.read_end`; perhaps an entry not acknowledged yet, which a
    reader opened now need not see)."""
    reader = await ctx.open_segment_reader(seg)
    return DLSN(seg.seqno, await reader.read_end() + 1, 0)


async def _search(
    reader: LedgerReader, last: int, before: Callable[[RecordSetHeader], bool]
) -> int:
    """The first entry in [0, last] whose header is not ``before`` the target
    (``last + 1`` if none); ``before`` must be monotonic in entry id."""
    lo, hi = 0, last + 1
    while lo < hi:
        mid = (lo + hi) // 2
        if before(decode_header(await reader.read_entry(mid))):
            lo = mid + 1
        else:
            hi = mid
    return lo


async def _in_segment(
    ctx: CoreContext, stream: str, seg: SegmentMetadata, start: StartPosition
) -> DLSN:
    reader, last = await _readable_end(ctx, seg)
    if last < 0:
        return DLSN(seg.seqno, 0, 0)
    kind, value = start.kind, start.value
    if kind is PositionKind.SEQUENCE:
        k = value - seg.start_sequence_id
        # the last entry whose first index <= k holds record k (if it is written yet)
        entry = await _search(reader, last, lambda h: h.first_index + h.user_count <= k)
        if entry > last:
            return DLSN(seg.seqno, last + 1, 0)
        header = decode_header(await reader.read_entry(entry))
        return DLSN(seg.seqno, entry, max(0, k - header.first_index))
    if kind is PositionKind.TXID:
        entry = await _search(reader, last, lambda h: h.last_txid < value)
        return await _scan(reader, stream, seg, entry, last, lambda r: r.txid >= value)
    # TIMESTAMP: the first record at or after the target is in the first entry whose
    # base timestamp reaches it, or among the later records of the entry before. Not
    # "the entry before the first one past the target": several entries may carry the
    # target's millisecond, and that skipped all but the last of them.
    entry = await _search(reader, last, lambda h: h.base_ts_ms < value)
    return await _scan(reader, stream, seg, max(0, entry - 1), last,
                       lambda r: r.timestamp_ms >= value)  # fmt: skip


async def _scan(  # noqa: PLR0917 - private helper
    reader: LedgerReader,
    stream: str,
    seg: SegmentMetadata,
    entry: int,
    last: int,
    hit: Callable[..., bool],
) -> DLSN:
    """The first record from ``entry`` on that ``hit``s (a few entries at most)."""
    while entry <= last:
        data = await reader.read_entry(entry)
        _h, records, _eos = decode_read_records(data, stream, seg.seqno, entry,
                                                seg.start_sequence_id)  # fmt: skip
        for rec in records:
            if hit(rec):
                return rec.dlsn
        entry += 1
    return DLSN(seg.seqno, last + 1, 0)


def _candidate(segments: list[SegmentMetadata], start: StartPosition) -> SegmentMetadata | None:
    """The segment the position falls into (None: after every segment)."""
    kind, value = start.kind, start.value
    for seg in segments:
        if seg.truncation is TruncationState.TRUNCATED:
            continue
        if not seg.is_sealed:
            return seg
        if kind is PositionKind.SEQUENCE and value < seg.start_sequence_id + seg.record_count:
            return seg
        if kind is PositionKind.TXID and seg.record_count and seg.last_txid >= value:
            return seg
        if kind is PositionKind.TIMESTAMP and seg.record_count and seg.sealed_ms >= value:
            return seg
    return None


async def resolve_start(
    ctx: CoreContext, stream: str, start: StartPosition, *, skip_truncated: bool
) -> DLSN:
    segments = [s for s, _v in await ctx.segments(stream)]
    floor = first_readable(segments)
    kind = start.kind
    if kind is PositionKind.EARLIEST:
        return floor
    if kind is PositionKind.LATEST:
        if not segments or segments[-1].is_sealed:
            return DLSN(segments[-1].seqno + 1 if segments else 1, 0, 0)
        return await _after_end(ctx, segments[-1])
    if kind is PositionKind.DLSN:
        assert start.dlsn_value is not None
        position = start.dlsn_value
    elif kind is PositionKind.SEQUENCE and segments and start.value < _first_sequence(segments):
        position = DLSN(0, 0, 0)  # before everything still kept: truncated
    else:
        seg = _candidate(segments, start)
        if seg is None:
            return DLSN(segments[-1].seqno + 1 if segments else 1, 0, 0)
        position = await _in_segment(ctx, stream, seg, start)
    if position < floor:
        if not skip_truncated:
            raise TruncatedError(
                f"{stream}: position {position} is before the first readable record {floor}"
            )
        return floor
    return position


def _first_sequence(segments: list[SegmentMetadata]) -> int:
    for seg in segments:
        if seg.truncation is not TruncationState.TRUNCATED:
            return seg.start_sequence_id
    return segments[-1].start_sequence_id + segments[-1].record_count
