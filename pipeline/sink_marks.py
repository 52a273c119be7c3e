"""The sink's exactly-once protocol: record tags, content digests, sink markers, and
the two checks a writer makes before writing (steps 1 and 2 below).

Exactly once, whatever the partitioning of a replay. Every record carries the *tag*
``"<query>:<batch>:<run>:<partition>"`` as its origin tag (internal metadata in the
record framing, ``RecordColumns.tag``, :mod:`streams.recordset_layout`, that no reader
returns, so a copy of a Spark-written stream copies none). It names the query id (stable
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
   those of *earlier runs* form a multiset W of content digests (key, value,
   headers); on a retried attempt it also collects its own earlier attempt's
   records (same run and partition), skipped first. A row whose digest is in W is
   skipped (once per copy) and counted in the commit message.
3. The driver's commit adds the counts up per stream: a digest skipped more often than
   W holds it (rows with equal content spread over several tasks of the new layout)
   is written again, copying W's record, so the stream ends with exactly the batch's
   multiset of rows; then it moves the marker to the batch's last record. A driver that
   dies during that leaves a state the next run resolves the same way.

Records written before record set format v3 carry the tag as the header
``bookline.spark``: the core decoder turns that header into the record's origin tag
(and out of its headers), so their scan is the same.

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
from pipeline.schema import Headers
from streams.columns import read_raw_entries
from streams.dlsn import DLSN
from streams.records import ReadRecord
from streams.recordset import decode_internal

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
    """Identity of a row's content: key, value and headers in their order (a null
    differs from an empty value; no headers and an empty list are the same). The
    timestamp is not part of it: a row without one is stamped when written, so it
    reads back with one."""
    h = hashlib.blake2b(digest_size=16)
    h.update(_field(b"k", key))
    h.update(_field(b"v", payload))
    for name, value in headers or ():
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


def _content(rec: ReadRecord) -> bytes:
    return digest(rec.key, rec.payload, rec.headers)


# -- reading what is there -------------------------------------------------------------


def _tagged(
    ns: SyncNamespace, stream: str, seqno: int, first: int, last: int
) -> Iterator[tuple[ReadRecord, Tag | None]]:
    """The records of entries ``first..last`` of a segment, each with the sink tag it
    carries (None: none, or not a sink's): ``read_entries`` with the origin tags."""
    start, entries = ns.runner.call(read_raw_entries(ns.ns, stream, seqno, first, last))
    for entry_id, payload in entries:
        _h, records, _markers, tags = decode_internal(payload, stream, seqno, entry_id, start)
        for rec in records:
            yield rec, Tag.decode(tags.get(rec.slot_id))


def _records_after(
    ns: SyncNamespace, stream: str, marker: DLSN
) -> Iterator[tuple[ReadRecord, Tag | None]]:
    """Every readable record after ``marker`` with its tag, straight from the segments
    (sealed ones up to their last entry, the in-progress one up to its LAC)."""
    for seg in ns.segments(stream):
        if seg.seqno < marker.segment_seqno or seg.truncated or seg.last_entry_id < 0:
            continue
        first = marker.entry_id if seg.seqno == marker.segment_seqno else 0
        if seg.min_active_dlsn is not None:
            first = max(first, seg.min_active_dlsn.entry_id)
        for lo in range(first, seg.last_entry_id + 1, SCAN_BATCH_ENTRIES):
            hi = min(seg.last_entry_id, lo + SCAN_BATCH_ENTRIES - 1)
            for rec, tag in _tagged(ns, stream, seg.seqno, lo, hi):
                if rec.dlsn > marker:
                    yield rec, tag


def _tag_at(ns: SyncNamespace, stream: str, dlsn: DLSN) -> Tag | None:
    """The tag of the record at ``dlsn`` (None: no such record, or untagged)."""
    if dlsn == BEFORE_ALL:
        return None
    try:
        recs = list(_tagged(ns, stream, dlsn.segment_seqno, dlsn.entry_id, dlsn.entry_id))
    except BooklineError as exc:  # truncated, deleted: then it tells nothing
        log.debug("%s: sink marker %s unreadable: %s", stream, dlsn, exc)
        return None
    return next((t for r, t in recs if r.dlsn == dlsn), None)


def batch_done(ns: SyncNamespace, stream: str, tag: Tag) -> bool:
    """Step 1: the marker names a record of this query with a batch >= ours."""
    marker = ns.committed(stream, tag.marker)
    if marker is None:
        return False
    found = _tag_at(ns, stream, marker)
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
    for rec, t in _records_after(ns, stream, marker):
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
