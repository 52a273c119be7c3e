"""The sink's exactly-once protocol: record tags, content digests, sink markers, and
the two checks a writer makes before writing (steps 1 and 2 below).

Exactly once, whatever the partitioning of a replay. Every record carries the header
``bookline.spark`` = ``"<query>:<batch>:<run>:<partition>"``: the query id (stable
across restarts from a checkpoint; a batch write uses a fresh id and batch 0, or the
options ``writeId``/``batchId``, which is what ``foreachBatch`` should pass), the batch,
the *run* (a fresh id per driver-side writer: a restart is a new run) and the Spark
partition. Per (query, target stream) one *sink marker* (the subscription
``spark-sink.<query>``) points at the last record of the last batch the driver
committed; before a query's first write to a stream it is set at the stream's end.

1. *Batch done*: the marker's record is tagged with this query and a batch >= ours (the
   driver died after committing the batch to us but before Spark logged it): skip
   every row; no writer is opened.
2. Otherwise, holding the stream's writer lock, the task reads the records after the
   marker tagged with this query and batch, up to the first record of the current run:
   those of *earlier runs* form a multiset W of content digests (key, value, headers
   without the tag); on a retried attempt it also collects its own earlier attempt's
   records (same run and partition), skipped first. A row whose digest is in W is
   skipped (once per copy) and counted in the commit message.
3. The driver's commit adds the counts up per stream: a digest skipped more often than
   W holds it (rows with equal content spread over several tasks of the new layout)
   is written again, copying W's record, so the stream ends with exactly the batch's
   multiset of rows; then it moves the marker to the batch's last record. A driver that
   dies during that leaves a state the next run resolves the same way.

Steps 1 and 2 are :func:`batch_done` and :func:`scan` here, used by a task
(:mod:`pipeline.sink_task`) and by the driver; step 3 is :func:`pipeline.sink.driver_write`
and :func:`pipeline.sink.commit_batch`.

Limits: speculative execution (two live attempts of one task) is not supported; a
zombie task of a dead driver writing after the new run started is not detected.
Costs: a task scans the records written after the marker only up to the first one of
its own run (nothing in steady state), and a retried attempt its partition's records.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from foundation.errors import BooklineError, NotFoundError
from pipeline.schema import TAG_HEADER, Headers, tag_header
from streams.dlsn import DLSN
from streams.records import ReadRecord

if TYPE_CHECKING:
    from streams.sync import SyncNamespace

log = logging.getLogger(__name__)

# Entries per read_entries call while scanning for already-written rows.
SCAN_BATCH_ENTRIES = 256
# Sink marker of a query that started on an empty stream: before every record
# (segment seqnos start at 1), so it never names a record of ours.
BEFORE_ALL = DLSN(0, 0, 0)
MARKER_PREFIX = "spark-sink."


def digest(key: bytes | None, payload: bytes | None, headers: Headers | None) -> bytes:
    """Identity of a row's content: key, value and headers in their order, the tag
    header left out (a null differs from an empty value). The timestamp is not part of
    it: a row without one is stamped when written, so it reads back with one."""
    h = hashlib.blake2b(digest_size=16)
    h.update(_field(b"k", key))
    h.update(_field(b"v", payload))
    for name, value in headers or ():
        if name != TAG_HEADER:
            h.update(_field(b"h", name.encode()) + _field(b"", value))
    return h.digest()


def _field(kind: bytes, data: bytes | None) -> bytes:
    if data is None:
        return kind + b"\xff"
    return kind + b"\x00" + len(data).to_bytes(8, "big") + data


@dataclass(frozen=True, slots=True)
class Tag:
    query: str
    batch: int
    run: str
    partition: int

    def encode(self) -> bytes:
        return f"{self.query}:{self.batch}:{self.run}:{self.partition}".encode()

    @classmethod
    def decode(cls, raw: bytes | None) -> Tag | None:
        if raw is None:
            return None
        try:
            query, batch, run, partition = raw.decode().rsplit(":", 3)
            return cls(query, int(batch), run, int(partition))
        except (UnicodeDecodeError, ValueError):
            return None  # a header somebody else set (or an older format); not ours

    @property
    def marker(self) -> str:
        return marker_name(self.query)


def marker_name(query: str) -> str:
    return f"{MARKER_PREFIX}{query}"


def _tag_of(rec: ReadRecord) -> Tag | None:
    return Tag.decode(tag_header(rec.headers))


def _content(rec: ReadRecord) -> bytes:
    return digest(rec.key, rec.payload, rec.headers)


# -- reading what is there -------------------------------------------------------------


def _records_after(ns: SyncNamespace, stream: str, marker: DLSN) -> Iterator[ReadRecord]:
    """Every readable record after ``marker``, straight from the segments (sealed ones
    up to their last entry, the in-progress one up to its LAC)."""
    for seg in ns.segments(stream):
        if seg.seqno < marker.segment_seqno or seg.truncated or seg.last_entry_id < 0:
            continue
        first = marker.entry_id if seg.seqno == marker.segment_seqno else 0
        if seg.min_active_dlsn is not None:
            first = max(first, seg.min_active_dlsn.entry_id)
        for lo in range(first, seg.last_entry_id + 1, SCAN_BATCH_ENTRIES):
            hi = min(seg.last_entry_id, lo + SCAN_BATCH_ENTRIES - 1)
            for rec in ns.read_entries(stream, seg.seqno, lo, hi):
                if rec.dlsn > marker:
                    yield rec


def _record_at(ns: SyncNamespace, stream: str, dlsn: DLSN) -> ReadRecord | None:
    if dlsn == BEFORE_ALL:
        return None
    try:
        recs = ns.read_entries(stream, dlsn.segment_seqno, dlsn.entry_id, dlsn.entry_id)
    except BooklineError as exc:  # truncated, deleted: then it tells nothing
        log.debug("%s: sink marker %s unreadable: %s", stream, dlsn, exc)
        return None
    return next((r for r in recs if r.dlsn == dlsn), None)


def batch_done(ns: SyncNamespace, stream: str, tag: Tag) -> bool:
    """Step 1: the marker names a record of this query with a batch >= ours."""
    marker = ns.committed(stream, tag.marker)
    if marker is None:
        return False
    rec = _record_at(ns, stream, marker)
    found = _tag_of(rec) if rec is not None else None
    return found is not None and found.query == tag.query and found.batch >= tag.batch


@dataclass
class Found:
    """What step 2 found after the marker: earlier runs' records of our batch (W) and
    our own earlier attempt's."""

    prior: collections.Counter[bytes] = field(default_factory=collections.Counter)
    prior_records: dict[bytes, ReadRecord] = field(default_factory=dict)
    own: collections.Counter[bytes] = field(default_factory=collections.Counter)
    last: DLSN | None = None  # the last record of our batch seen


def scan(ns: SyncNamespace, stream: str, tag: Tag, *, whole: bool, keep: bool = False) -> Found:
    """Step 2 (the caller holds the writer lock). ``whole``: do not stop at the first
    record of the current run (a retried attempt looks for its own records)."""
    found = Found()
    marker = ns.committed(stream, tag.marker)
    if marker is None:
        # The query's first write here: nothing of it can be there yet. Later scans
        # start at today's end (BEFORE_ALL on an empty stream).
        end = ns.stream_info(stream).last_dlsn
        ns.commit(stream, tag.marker, end if end is not None else BEFORE_ALL)
        return found
    for rec in _records_after(ns, stream, marker):
        t = _tag_of(rec)
        if t is None or t.query != tag.query or t.batch != tag.batch:
            continue
        found.last = rec.dlsn
        if t.run != tag.run:
            d = _content(rec)
            found.prior[d] += 1
            if keep:
                found.prior_records.setdefault(d, rec)
        elif t.partition == tag.partition:
            found.own[_content(rec)] += 1
        elif not whole:
            break  # the current run's records follow; earlier runs' come before them
    return found


def drop_marker(ns: SyncNamespace, stream: str, query: str) -> None:
    with contextlib.suppress(NotFoundError):
        ns.runner.call(ns.ns.delete_subscriber(stream, marker_name(query)))
