"""Truncation and retention: dropping whole old segments so bookie GC reclaims disk.

Two steps, each safe to repeat after a crash between them:

1. **mark** -- one ZooKeeper transaction (every segment compare-and-set by version)
   marks the segments wholly before the truncation point TRUNCATED and the one holding
   it PARTIALLY_TRUNCATED with ``min_active_dlsn``; from then on readers treat those
   positions as gone;
2. **purge** -- delete the ledgers of TRUNCATED segments (bookies' GC then drops their
   entries from disk), then delete those segment znodes in one transaction. The newest
   segment znode is never deleted, even when truncated: it carries the stream's next
   seqno and start sequence id, which a new writer continues from.

Only the stream's writer truncates (it serialises this with segment rolls), so the
compare-and-sets do not race with sealing. Retention (age, size) only ever picks
sealed segments, oldest first.
"""

from __future__ import annotations

import logging

from foundation.errors import NoLedgerError
from foundation.invariants import invariant
from metadata.segments import SegmentMetadata, TruncationState
from metadata.streams import StreamOptions
from streams.context import CoreContext
from streams.dlsn import DLSN

log = logging.getLogger(__name__)

__all__ = ["apply_retention", "purge_truncated", "retention_point", "truncate_before"]

Versioned = tuple[SegmentMetadata, int]


def _marks(segments: list[Versioned], dlsn: DLSN, end: DLSN) -> list[Versioned]:
    """New states for the segments that ``dlsn`` truncates (pure). ``end`` is the
    stream's durable end: a point past it would hide records written later."""
    invariant(dlsn <= end, "truncation point %s is past the durable end %s", dlsn, end)
    updates: list[Versioned] = []
    for seg, version in segments:
        if seg.truncation is TruncationState.TRUNCATED:
            continue
        if seg.seqno < dlsn.segment_seqno and seg.is_sealed:
            updates.append((seg.with_truncation(TruncationState.TRUNCATED, (0, 0, 0)), version))
        elif seg.seqno == dlsn.segment_seqno and tuple(dlsn) > (seg.seqno, 0, 0):
            current = DLSN(*seg.min_active_dlsn)
            if current >= dlsn:
                continue
            if seg.is_sealed and dlsn > DLSN(seg.seqno, seg.last_entry_id, seg.last_slot_id):
                new = seg.with_truncation(TruncationState.TRUNCATED, (0, 0, 0))
            else:
                point = (dlsn.segment_seqno, dlsn.entry_id, dlsn.slot_id)
                new = seg.with_truncation(TruncationState.PARTIALLY_TRUNCATED, point)
            updates.append((new, version))
    return updates


async def truncate_before(ctx: CoreContext, stream: str, dlsn: DLSN, end: DLSN) -> bool:
    """Mark everything before ``dlsn`` truncated (one transaction), then purge.
    Segments still in progress are only ever partially truncated. The caller (the
    stream's writer) refuses points past ``end``, its durable end."""
    segments = await ctx.segments(stream)
    updates = _marks(segments, dlsn, end)
    await ctx.md.segments.mark_truncated(ctx.namespace, stream, updates)
    if updates:
        log.info("%s: truncated before %s (%d segment(s) marked)", stream, dlsn, len(updates))
    deleted = await purge_truncated(ctx, stream)
    return bool(updates) or deleted > 0


async def purge_truncated(ctx: CoreContext, stream: str) -> int:
    """Delete TRUNCATED segments' ledgers and znodes (keeping the newest znode)."""
    segments = await ctx.segments(stream)
    if not segments:
        return 0
    newest = segments[-1][0].seqno
    doomed = [(s, v) for s, v in segments if s.truncation is TruncationState.TRUNCATED]
    for seg, _v in doomed:
        ctx.forget_ledger(seg.ledger_id)
        try:
            await ctx.ledgers.delete_ledger(seg.ledger_id)
        except NoLedgerError:
            log.debug("ledger %d of segment %d already deleted", seg.ledger_id, seg.seqno)
    znodes = [(s.seqno, v) for s, v in doomed if s.seqno != newest]
    await ctx.md.segments.delete_segments(ctx.namespace, stream, znodes)
    if doomed:
        log.info("%s: deleted %d truncated segment(s) and their ledgers", stream, len(doomed))
    return len(doomed)


def retention_point(
    segments: list[SegmentMetadata], options: StreamOptions, now_ms: int
) -> DLSN | None:
    """The DLSN before which retention drops sealed segments, or None (pure)."""
    live = [s for s in segments if s.truncation is not TruncationState.TRUNCATED]
    sealed = [s for s in live if s.is_sealed]
    drop = 0  # number of oldest sealed segments to drop
    if options.retention_ms is not None:
        while drop < len(sealed) and sealed[drop].sealed_ms < now_ms - options.retention_ms:
            drop += 1
    if options.retention_bytes is not None:
        kept = sum(s.size_bytes for s in sealed[drop:])
        while drop < len(sealed) and kept > options.retention_bytes:
            kept -= sealed[drop].size_bytes
            drop += 1
    # Never skip over a segment that is still in progress (keep stream order).
    cut = 0
    for seg in live:
        if cut < drop and seg.is_sealed and seg is sealed[cut]:
            cut += 1
        else:
            break
    if cut == 0:
        return None
    return DLSN(sealed[cut - 1].seqno + 1, 0, 0)


async def apply_retention(
    ctx: CoreContext, stream: str, options: StreamOptions, end: DLSN | None = None
) -> bool:
    """Drop what the stream's retention (age, size) no longer keeps. ``end`` is the
    writer's durable end when a writer runs this; a retention point only ever names
    a sealed segment's end, which is durable whoever asks."""
    segments = [s for s, _v in await ctx.segments(stream)]
    point = retention_point(segments, options, ctx.clock_ms())
    if point is None:
        return await purge_truncated(ctx, stream) > 0
    log.info("%s: retention drops segments before %s", stream, point)
    return await truncate_before(ctx, stream, point, point if end is None else end)
