"""Compaction of a stream (a topic partition with ``cleanup.policy=compact``): sealed
segments are rewritten into new ledgers holding only what :mod:`streams.compaction_plan`
keeps.

How readers stay correct (Kafka's cleaner and Pulsar's compactor both keep offsets and
swap whole units atomically; this does the same per segment):

* **Positions do not move.** The new ledger has one entry per entry of the old one, at
  the same entry id; an entry that lost records becomes a *sparse* record set
  (:func:`streams.recordset.encode_sparse_set`) holding the survivors at their old
  slots and sequence ids. A DLSN or an offset taken before the compaction names the
  same place after it; one whose record is gone resolves to the next survivor. The
  segment's metadata (start sequence id, record count, last entry and slot) is kept, so
  offsets stay increasing and only become sparse.
* **One swap per segment.** Once the new ledger is closed (every entry acknowledged by
  the ack quorum: durable; a writer that failed after its adds closes it only locally,
  so then recovery closes it), one ZooKeeper transaction points the segment at it, checked
  by the segment's version (a concurrent seal, truncation or compaction makes it fail
  and leaves the old one), checking the new ledger still exists, and bumping the
  stream's max-txid version (the orphan collector deletes an unreferenced ledger only
  if that version is unchanged since it listed the segments). Only then is the old
  ledger deleted.
* **Crash at any point** (kill -9): before the swap the old ledger is referenced and
  whole, the new one an orphan (tagged with the stream and a writer-lock tag no lock
  node ever has, so the orphan collector takes it once old enough); after it, the new
  one is referenced and the old one is either deleted or an orphan. Either way every
  segment names exactly one complete ledger.
* **A reader that started before** may be reading the old ledger when it is deleted:
  it re-reads the segment and continues at the same entry in the new ledger
  (:mod:`streams.reader`). It only ever sees a subset of what it would have seen, never
  an older value after a newer one.

Who runs it: ``bookline topic compact NAME`` (a job through the namespace, no writer
lock needed: it touches sealed segments only); the writer keeps writing meanwhile.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

from foundation.errors import BadRequestError, BooklineError, NoLedgerError, WriterFailedError
from foundation.invariants import invariant
from metadata.segments import TAG_STREAM, TAG_WRITER_LOCK, SegmentMetadata
from streams.compaction_plan import (
    CompactionPolicy,
    cleanable,
    latest_offsets,
    policy_of,
    survivors,
    tombstones_expire,
)
from streams.context import CoreContext
from streams.records import ProducerMarker, ReadRecord
from streams.recordset import RecordSetHeader, decode_internal, encode_sparse_set

log = logging.getLogger(__name__)

__all__ = ["COMPACTOR_LOCK_TAG", "CompactionReport", "compact_stream", "compact_topic"]

# The writer-lock tag of a compactor's ledgers: no lock node is ever called this, so a
# new ledger a killed compactor left unreferenced counts as an orphan (ledger.orphans).
COMPACTOR_LOCK_TAG = b"compactor"
# An entry's internal extras by slot: producer markers and origin tags.
Internal = tuple[dict[int, ProducerMarker], dict[int, bytes]]


@dataclass(slots=True)
class CompactionReport:
    """What one run did (summed over a topic's partitions by the caller)."""

    segments_scanned: int = 0
    segments_rewritten: int = 0
    records_read: int = 0
    records_removed: int = 0  # superseded records and expired tombstones
    tombstones_removed: int = 0
    bytes_before: int = 0  # stored bytes of the rewritten segments' entries
    bytes_after: int = 0

    @property
    def bytes_reclaimed(self) -> int:
        return self.bytes_before - self.bytes_after

    def add(self, other: CompactionReport) -> None:
        for f in dataclasses.fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))


async def compact_stream(
    ctx: CoreContext, stream: str, policy: CompactionPolicy, now_ms: int | None = None
) -> CompactionReport:
    """Compact ``stream``'s cleanable segments now (two passes, as Kafka's cleaner)."""
    now = ctx.clock_ms() if now_ms is None else now_ms
    report = CompactionReport()
    todo = [(s, v) for s, v in await ctx.segments(stream) if cleanable(s, policy, now)]
    latest: dict[bytes, int] = {}
    for seg, _v in todo:
        async for _h, _data, records, _m in _entries(ctx, stream, seg):
            latest_offsets(records, latest)
    for seg, version in todo:
        report.segments_scanned += 1
        await _compact_segment(ctx, stream, seg, version, latest,
                               tombstones_expire(seg, policy, now), report)  # fmt: skip
    log.info(
        "%s: compacted %d of %d segment(s): %d of %d records removed, %d bytes reclaimed",
        stream, report.segments_rewritten, report.segments_scanned, report.records_removed,
        report.records_read, report.bytes_reclaimed,
    )  # fmt: skip
    return report


async def compact_topic(
    ctx: CoreContext, topic: str, now_ms: int | None = None
) -> tuple[CompactionPolicy, CompactionReport]:
    """Compact every partition of ``topic`` by its configs; BadRequestError unless its
    ``cleanup.policy`` has ``compact``."""
    record, _v = await ctx.md.topics.get_topic(ctx.namespace, topic)
    policy = policy_of(record.configs)
    if not policy.compact:
        raise BadRequestError(
            f"topic {topic} has cleanup.policy={record.configs.get('cleanup.policy', 'delete')}"
            "; only a topic with cleanup.policy compact is compacted"
        )
    total = CompactionReport()
    for stream in record.partition_names():
        total.add(await compact_stream(ctx, stream, policy, now_ms))
    return policy, total


async def _entries(
    ctx: CoreContext, stream: str, seg: SegmentMetadata
) -> AsyncIterator[tuple[RecordSetHeader, bytes, list[ReadRecord], Internal]]:
    """(header, stored bytes, records, internal extras by slot) of every entry of a
    sealed segment."""
    reader = await ctx.open_segment_reader(seg)
    async for e in reader.iter_entries(0, seg.last_entry_id):
        header, records, markers, tags = decode_internal(
            e.payload, stream, seg.seqno, e.entry_id, seg.start_sequence_id
        )
        yield header, e.payload, records, (markers, tags)


async def _compact_segment(  # noqa: PLR0917 - private; one segment's inputs
    ctx: CoreContext,
    stream: str,
    seg: SegmentMetadata,
    version: int,
    latest: dict[bytes, int],
    drop_tombstones: bool,
    report: CompactionReport,
) -> None:
    """Rewrite one segment if it loses any record: new ledger, swap, delete the old."""
    entries: list[bytes] = []
    changed = False
    mine = CompactionReport()
    async for header, data, records, (markers, tags) in _entries(ctx, stream, seg):
        mine.records_read += len(records)
        kept = survivors(records, latest, drop_tombstones)
        mine.bytes_before += len(data)
        if len(kept) == len(records):
            entries.append(data)  # nothing dropped (or a control set): the same bytes
        else:
            changed = True
            mine.records_removed += len(records) - len(kept)
            mine.tombstones_removed += _tombstones(records) - _tombstones(kept)
            first = seg.start_sequence_id + header.first_index
            # A kept record keeps its producer marker (the takeover scan reads them)
            # and its origin tag (the Spark sink's exactly-once scan does).
            entries.append(encode_sparse_set(header, first, kept, markers, tags))
        mine.bytes_after += len(entries[-1])
    report.records_read += mine.records_read
    if not changed:
        return
    new_id = await _write_ledger(ctx, stream, seg, entries)
    size = seg.size_bytes - (mine.bytes_before - mine.bytes_after)
    swapped = dataclasses.replace(seg, ledger_id=new_id, size_bytes=max(0, size))
    try:
        await ctx.md.segments.replace_ledger(ctx.namespace, stream, swapped, version)
    except BaseException:
        # Not referenced (the segment changed meanwhile), or the outcome is unknown
        # (ZooKeeper's answer lost after the transaction committed): the new ledger goes
        # only once the stream's metadata, read again, shows it unreferenced.
        await _discard_unreferenced(ctx, stream, new_id)
        raise
    log.info("%s: segment %d swapped to ledger %d (was %d)", stream, seg.seqno, new_id,
             seg.ledger_id)  # fmt: skip
    ctx.forget_ledger(seg.ledger_id)
    try:
        await ctx.ledgers.delete_ledger(seg.ledger_id)
    except NoLedgerError:
        log.debug("old ledger %d of segment %d already deleted", seg.ledger_id, seg.seqno)
    mine.records_read = 0  # counted above
    mine.segments_rewritten = 1
    report.add(mine)


def _tombstones(records: list[ReadRecord]) -> int:
    return sum(1 for r in records if r.key is not None and r.payload is None)


async def _discard_unreferenced(ctx: CoreContext, stream: str, ledger_id: int) -> None:
    """Delete ``ledger_id`` unless a segment of ``stream`` references it. When the
    metadata cannot be read either, it stays: the orphan collector deletes it if it is
    unreferenced, and deleting a referenced ledger would lose its segment's records."""
    try:
        segments = await ctx.segments(stream)
    except BooklineError as exc:
        log.warning("compacted ledger %d of %s left to the orphan collector: %s",
                    ledger_id, stream, exc)  # fmt: skip
        return
    if any(seg.ledger_id == ledger_id for seg, _version in segments):
        log.warning("%s: the swap to ledger %d committed although its answer failed",
                    stream, ledger_id)  # fmt: skip
        return
    await _discard(ctx, ledger_id)


async def _discard(ctx: CoreContext, ledger_id: int) -> None:
    try:
        await ctx.ledgers.delete_ledger(ledger_id)
    except BooklineError as exc:  # the swap's error is the one to report
        log.warning("could not delete unreferenced compacted ledger %d: %s", ledger_id, exc)


async def _write_ledger(
    ctx: CoreContext, stream: str, seg: SegmentMetadata, entries: list[bytes]
) -> int:
    """A new closed ledger holding ``entries`` at entry ids 0.. (the old one's quorums)."""
    old = (await ctx.open_segment_reader(seg)).metadata
    tags = {TAG_STREAM: f"{ctx.namespace}/{stream}".encode(), TAG_WRITER_LOCK: COMPACTOR_LOCK_TAG}
    ledger = await ctx.ledgers.create_ledger(
        ensemble_size=old.ensemble_size,
        write_quorum=old.write_quorum,
        ack_quorum=old.ack_quorum,
        digest_type=ctx.config.ledger_digest,
        custom=tags,
    )
    try:
        futures = [await ledger.submit(data) for data in entries]
        ids = await asyncio.gather(*futures)
        invariant(list(ids) == list(range(len(entries))), "compacted entries kept their ids")
        await ledger.close()
        if not ledger.metadata.is_closed:
            await _close_by_recovery(ctx, ledger.ledger_id, len(entries) - 1, ledger.error)
    except BaseException:
        await _discard(ctx, ledger.ledger_id)
        raise
    return ledger.ledger_id


async def _close_by_recovery(
    ctx: CoreContext, ledger_id: int, last: int, error: BooklineError | None
) -> None:
    """Close a new ledger whose writer failed after every add was acknowledged (an add
    that timed out on one bookie starts an ensemble change, which with no spare bookie
    fails): its ``close()`` closes locally only and leaves the ledger OPEN, and a
    segment swapped to it would have no readable end (non-recovering readers stop at
    the LAC the bookies know, -1 when every entry went out before an acknowledgement).
    Recovery fences it and closes it at its true end, which holds every acknowledged
    entry; anything else is an error and the ledger is not swapped in."""
    log.warning("compacted ledger %d: the writer failed after its adds (%s); recovering it",
                ledger_id, error)  # fmt: skip
    reader = await ctx.ledgers.open_ledger(ledger_id, ctx.config.password_bytes, recover=True)
    if not reader.is_closed or reader.metadata.last_entry_id != last:
        raise WriterFailedError(
            f"compacted ledger {ledger_id}: recovery closed it at entry "
            f"{reader.metadata.last_entry_id}, not at {last} (writer: {error})"
        )
