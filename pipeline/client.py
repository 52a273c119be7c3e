"""The data source's I/O: namespaces per process, stream snapshots, slice reads.

Everything here runs on the core's sync facade (:class:`streams.sync.SyncNamespace`),
in Spark's Python planner/stream-runner processes on the driver and in Python workers
on the executors. A process keeps one namespace per cluster (:func:`namespace_for`):
Spark reuses Python workers across tasks, so a task does not pay for a ZooKeeper
session and bookie connections; the namespaces are closed at process exit.

:func:`read_slice` reads one planned :class:`~pipeline.planning.Slice` straight from
the bookies with ``read_entries``: it finds the entry holding the slice's first record
(starting at the planner's hint and backing off exponentially when the hint is past
it), then reads entry ranges forward until the slice's last record, checking that
sequence ids are consecutive: a hole is data loss, never silently skipped -- except the
gaps a compacted entry (a *sparse* record set, :mod:`streams.compaction`) declares:
such an entry covers its offsets up to its span's end, kept or not.
"""

from __future__ import annotations

import atexit
import logging
import threading
from bisect import bisect_left
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from foundation.errors import (
    BadRequestError,
    BooklineError,
    NoEntryError,
    NoLedgerError,
    NotFoundError,
    TruncatedError,
)
from foundation.invariants import invariant
from pipeline.options import ConnectionOptions, Selection, namespace_config
from pipeline.planning import SegmentView, Slice, StreamView, TopicPartition
from streams.columns import EntryLayout, read_raw_entries, scan_entry
from streams.records import ReadRecord
from streams.recordset import decode_read_records

if TYPE_CHECKING:
    from pipeline.columns import LayoutPart
    from streams.sync import SyncNamespace

log = logging.getLogger(__name__)

__all__ = [
    "close_all",
    "namespace_for",
    "read_slice",
    "read_slice_columns",
    "select_partitions",
    "sequence_at_timestamp",
    "snapshot",
    "topic_partitions",
]

# One read_entries call asks for about this many records: large enough to amortise the
# round trip to the bookies, small enough to bound a task's memory (~records x size).
READ_CHUNK_RECORDS = 8_192
# ...and never for more entries than this (records per entry may be 1).
READ_CHUNK_ENTRIES_MAX = 2_048

_lock = threading.Lock()
_namespaces: dict[ConnectionOptions, SyncNamespace] = {}


def _open(conn: ConnectionOptions, create: bool) -> SyncNamespace:
    """Open; unless ``create``, without writing anything: a wrong root or namespace is
    a NotFoundError (a reader never writes metadata)."""
    from streams.sync import SyncNamespace

    config = namespace_config(conn)
    if conn.cluster is not None:
        path = Path(conn.cluster)
        if not path.is_file():
            raise NotFoundError(f"cluster file {path} does not exist (option 'cluster')")
        return SyncNamespace.from_cluster_file(
            str(path), namespace=conn.namespace, config=config, create=create, token=conn.token
        )
    assert conn.zk is not None  # ConnectionOptions checks exactly one is given
    return SyncNamespace.open(
        zk=conn.zk,
        root=conn.root,
        namespace=conn.namespace,
        config=config,
        create=create,
        token=conn.token,
    )


def namespace_for(conn: ConnectionOptions, *, create: bool = False) -> SyncNamespace:
    """This process's namespace for ``conn``, opened on first use; ``create``: create the
    namespace when it does not exist yet (writers with createStreams; never readers)."""
    with _lock:
        ns = _namespaces.get(conn)
        if ns is None:
            ns = _open(conn, create)
            _namespaces[conn] = ns
        return ns


def close_all() -> None:
    """Close every namespace of this process (at exit, and when a stream query stops)."""
    with _lock:
        namespaces = list(_namespaces.values())
        _namespaces.clear()
    for ns in namespaces:
        try:
            ns.close()
        except BooklineError as exc:  # closing must not hide what the process was doing
            log.warning("closing a namespace failed: %s", exc)


# Close before interpreter shutdown stops the default executor the core's ZooKeeper
# client needs: threading's exit hooks run before atexit's (private API, so fall back).
_register_exit = getattr(threading, "_register_atexit", atexit.register)
_register_exit(close_all)


def topic_partitions(ns: SyncNamespace, topic: str) -> int | None:
    """The partition count of ``topic``; None when no topic has that name."""
    md = ns.ns.context.md
    try:
        record, _version = ns.runner.call(md.topics.get_topic(ns.ns.name, topic))
    except NotFoundError:
        return None
    return int(record.partitions)


def _list_topics(ns: SyncNamespace) -> list[str]:
    md = ns.ns.context.md
    try:
        return sorted(ns.runner.call(md.topics.list_topics(ns.ns.name)))
    except NotFoundError:
        return []


def _topic_or_stream(ns: SyncNamespace, name: str, streams: set[str]) -> list[TopicPartition]:
    from foundation.names import partition_stream

    count = topic_partitions(ns, name)
    if count is not None:
        return [TopicPartition(name, p, partition_stream(name, p)) for p in range(count)]
    if name in streams:
        return [TopicPartition(name, 0, name)]
    raise NotFoundError(f"no topic or stream named {name!r} in namespace {ns.ns.name!r}")


def select_partitions(ns: SyncNamespace, sel: Selection) -> list[TopicPartition]:
    """The partitions a read selects, sorted: every partition of the named topics (a
    plain stream is a one-partition topic), the assigned ones, the named streams, or
    the matches of a pattern (new topics, partitions and streams show up on the next
    call: that is how streaming reads pick them up)."""
    from foundation.names import is_internal

    streams = set(ns.list_streams())
    out: list[TopicPartition] = []
    if sel.kind == "streams":
        missing = [s for s in sel.names if s not in streams]
        if missing:
            raise NotFoundError(f"stream(s) {', '.join(missing)} do not exist")
        out = [TopicPartition.of_stream(s) for s in sel.names]
    elif sel.kind == "stream_pattern":
        out = [TopicPartition.of_stream(s) for s in streams if sel.matches(s)]
    elif sel.kind == "topics":
        out = [tp for name in sel.names for tp in _topic_or_stream(ns, name, streams)]
    elif sel.kind == "topic_pattern":
        names = [t for t in _list_topics(ns) if sel.matches(t)]
        names += [s for s in streams if not is_internal(s) and sel.matches(s)]
        out = [tp for name in names for tp in _topic_or_stream(ns, name, streams)]
    else:
        for topic, parts in sel.assign:
            have = _topic_or_stream(ns, topic, streams)
            unknown = sorted(set(parts) - {tp.partition for tp in have})
            if unknown:
                raise NotFoundError(
                    f"option 'assign': {topic!r} has no partition(s) {unknown} (it has {len(have)})"
                )
            out += [tp for tp in have if tp.partition in parts]
    return sorted(set(out))


def snapshot(ns: SyncNamespace, stream: str) -> StreamView:
    """A planning snapshot of ``stream`` (segments read after the info: never fewer)."""
    tp = TopicPartition.of_stream(stream)
    info = ns.stream_info(stream)
    segments = ns.segments(stream)
    views = tuple(
        SegmentView(
            seqno=s.seqno,
            start_sequence_id=s.start_sequence_id,
            record_count=s.record_count,
            # In progress: the LAC (what may be read now); sealed: the last entry.
            last_entry_id=s.last_entry_id,
            truncated=bool(s.truncated),
        )
        for s in segments
    )
    return StreamView(
        name=stream,
        first_sequence_id=info.first_sequence_id,
        next_sequence_id=info.next_sequence_id,
        segments=views,
        topic=tp.topic,
        partition=tp.partition,
    )


def sequence_at_timestamp(ns: SyncNamespace, stream: str, ts_ms: int) -> int | None:
    """Sequence id of the first record written at or after ``ts_ms``; None if none is
    (up to the stream's end as of now). Raises the bookies' error (retriable) during an
    outage: a planner never takes records not read yet for "none" and skips them."""
    end = ns.stream_info(stream).next_sequence_id
    rec = ns.record_at_time(stream, ts_ms)
    if rec is None or rec.sequence_id >= end:
        return None
    return rec.sequence_id


def _chunk_entries(sl: Slice, records_per_entry: float) -> int:
    wanted = max(1, int(READ_CHUNK_RECORDS / max(records_per_entry, 1.0)))
    return min(READ_CHUNK_ENTRIES_MAX, wanted)


def _read(ns: SyncNamespace, sl: Slice, first: int, last: int) -> list[ReadRecord]:
    return ns.read_entries(sl.stream, sl.seqno, first, last)


def _locate(ns: SyncNamespace, sl: Slice) -> int:
    """An entry at or before the one holding ``sl.seq_lo`` (usually exactly it)."""
    probe, step = max(0, sl.entry_hint), 1
    while probe > 0:
        recs = _read(ns, sl, probe, probe)
        if recs and recs[0].sequence_id <= sl.seq_lo:
            return probe
        probe, step = max(0, probe - step), step * 2
    return 0


def _last_entry(sl: Slice, entry: int, chunk: int, expected: int) -> int:
    """The last entry of the chunk starting at ``entry`` (a sealed segment's end bounds it)."""
    last = entry + chunk - 1
    if sl.last_entry_id >= 0:
        if entry > sl.last_entry_id:
            raise TruncatedError(
                f"stream {sl.stream!r} segment {sl.seqno}: records {expected}.."
                f"{sl.seq_hi - 1} are missing after its last entry {sl.last_entry_id}"
            )
        last = min(last, sl.last_entry_id)
    return last


def _read_sets(
    ns: SyncNamespace, sl: Slice, first: int, last: int
) -> list[tuple[int, bool, list[ReadRecord]]]:
    """Entries ``first..last`` as (span end, sparse, records): an entry covers the
    offsets before its span end, whether compaction kept them all (sparse) or not."""
    start, entries = ns.runner.call(read_raw_entries(ns.ns, sl.stream, sl.seqno, first, last))
    out: list[tuple[int, bool, list[ReadRecord]]] = []
    for entry_id, payload in entries:
        h, recs, _eos = decode_read_records(payload, sl.stream, sl.seqno, entry_id, start)
        out.append((start + h.first_index + h.user_count, h.sparse, recs))
    return out


def _sparse_part(recs: list[ReadRecord], sl: Slice, expected: int) -> list[ReadRecord]:
    """:func:`_slice_part` of a compacted entry: its records in [expected, seq_hi)."""
    seqs = [r.sequence_id for r in recs]  # increasing: the decoder adds each gap
    return recs[bisect_left(seqs, expected) : bisect_left(seqs, sl.seq_hi)]


def _slice_part(recs: list[ReadRecord], sl: Slice, expected: int) -> list[ReadRecord]:
    """The records of ``recs`` that belong to the slice from ``expected`` on. Sequence
    ids increase by one within a segment, so the part is one run, checked at its ends."""
    if not recs:
        return []
    first = max(0, expected - recs[0].sequence_id)
    stop = min(len(recs), sl.seq_hi - recs[0].sequence_id)
    run = recs[first:stop] if first < stop else []
    invariant(
        not run
        or (run[0].sequence_id == expected and run[-1].sequence_id == expected + len(run) - 1),
        "stream %r segment %d: read %d records from sequence id %d, expected %d.. (a hole)",
        sl.stream,
        sl.seqno,
        len(run),
        run[0].sequence_id if run else -1,
        expected,
    )
    return run


def _read_slice(ns: SyncNamespace, sl: Slice, batch_rows: int) -> Iterator[list[ReadRecord]]:
    """Chunks of entries read forward until the slice's last record. (A read kept in
    flight ahead of the conversion was tried: the loop thread's decoding and the
    task's Arrow work then fight over the GIL, and it measured no faster.)"""
    entry = _locate(ns, sl)
    expected = sl.seq_lo
    chunk = _chunk_entries(sl, 1.0)
    out: list[ReadRecord] = []
    while expected < sl.seq_hi:
        last = _last_entry(sl, entry, chunk, expected)
        sets = _read_sets(ns, sl, entry, last)
        read = sum(len(recs) for _end, _sparse, recs in sets)
        if read:
            # Adapt the chunk to what an entry really holds (writers batch records).
            chunk = _chunk_entries(sl, read / max(1, last - entry + 1))
        entry = last + 1
        for span_end, sparse, recs in sets:
            if sparse:
                run = _sparse_part(recs, sl, expected)
                expected = max(expected, min(sl.seq_hi, span_end))
            else:
                run = _slice_part(recs, sl, expected)
                expected += len(run)
            while run:
                room = batch_rows - len(out)
                out.extend(run[:room])
                run = run[room:]
                if len(out) >= batch_rows:
                    yield out
                    out = []
    if out:
        yield out


def read_slice(
    ns: SyncNamespace, sl: Slice, batch_rows: int = READ_CHUNK_RECORDS
) -> Iterator[list[ReadRecord]]:
    """The records [sl.seq_lo, sl.seq_hi) of one segment, in lists of <= batch_rows.

    A slice that was truncated or deleted after planning raises TruncatedError when the
    slice says fail_on_data_loss, and yields what could be read otherwise.
    """
    try:
        yield from _read_slice(ns, sl, batch_rows)
    except (TruncatedError, NoLedgerError, NoEntryError, NotFoundError) as exc:
        _data_loss(sl, exc)


def _data_loss(sl: Slice, exc: BooklineError) -> None:
    """A slice that can no longer be read: raise (failOnDataLoss) or log and go on."""
    if sl.fail_on_data_loss:
        raise TruncatedError(
            f"stream {sl.stream!r}: records {sl.seq_lo}..{sl.seq_hi - 1} of segment "
            f"{sl.seqno} can no longer be read (truncated or deleted by retention?): "
            f"{exc}; set failOnDataLoss=false to skip them"
        ) from exc
    log.warning(
        "skipping stream %r records %d..%d of segment %d (failOnDataLoss=false): %s",
        sl.stream,
        sl.seq_lo,
        sl.seq_hi - 1,
        sl.seqno,
        exc,
    )


def _read_layouts(ns: SyncNamespace, sl: Slice, first: int, last: int) -> list[EntryLayout]:
    start, entries = ns.runner.call(read_raw_entries(ns.ns, sl.stream, sl.seqno, first, last))
    return [scan_entry(payload, entry_id, start) for entry_id, payload in entries]


def _locate_layout(ns: SyncNamespace, sl: Slice) -> int:
    """:func:`_locate` on scanned entries (no records built)."""
    probe, step = max(0, sl.entry_hint), 1
    while probe > 0:
        lays = _read_layouts(ns, sl, probe, probe)
        if lays and lays[0].count and lays[0].first_sequence_id <= sl.seq_lo:
            return probe
        probe, step = max(0, probe - step), step * 2
    return 0


def _entry_part(lay: EntryLayout, sl: Slice, expected: int) -> LayoutPart:
    """The user records of ``lay`` that belong to the slice from ``expected`` on, as
    :func:`_slice_part` cuts a chunk: an entry whose records start past ``expected``
    is a hole."""
    from pipeline.columns import LayoutPart

    if lay.offsets is not None:  # compacted: the records kept in [expected, seq_hi)
        return LayoutPart(
            lay, bisect_left(lay.offsets, expected), bisect_left(lay.offsets, sl.seq_hi)
        )
    first = max(0, expected - lay.first_sequence_id)
    stop = min(lay.count, sl.seq_hi - lay.first_sequence_id)
    if first >= stop:
        return LayoutPart(lay, 0, 0)
    invariant(
        lay.first_sequence_id + first == expected,
        "stream %r segment %d: entry %d starts at sequence id %d, expected %d.. (a hole)",
        sl.stream,
        sl.seqno,
        lay.entry_id,
        lay.first_sequence_id + first,
        expected,
    )
    return LayoutPart(lay, first, stop)


def _read_slice_columns(
    ns: SyncNamespace, sl: Slice, batch_rows: int
) -> Iterator[list[LayoutPart]]:
    """:func:`_read_slice` on scanned entries: the same chunks, checks and batches."""
    from pipeline.columns import LayoutPart

    entry = _locate_layout(ns, sl)
    expected = sl.seq_lo
    chunk = _chunk_entries(sl, 1.0)
    out: list[LayoutPart] = []
    rows = 0
    while expected < sl.seq_hi:
        last = _last_entry(sl, entry, chunk, expected)
        lays = _read_layouts(ns, sl, entry, last)
        users = sum(lay.count for lay in lays)
        if users:
            chunk = _chunk_entries(sl, users / max(1, last - entry + 1))
        entry = last + 1
        for lay in lays:
            lay_part = _entry_part(lay, sl, expected)
            if lay.offsets is None:
                expected += lay_part.hi - lay_part.lo
            else:  # a compacted entry covers its span, kept or not
                expected = max(expected, min(sl.seq_hi, lay.span_end))
            lo = lay_part.lo
            while lo < lay_part.hi:
                hi = min(lay_part.hi, lo + batch_rows - rows)
                out.append(LayoutPart(lay, lo, hi))
                rows += hi - lo
                lo = hi
                if rows >= batch_rows:
                    yield out
                    out, rows = [], 0
    if out:
        yield out


def read_slice_columns(
    ns: SyncNamespace, sl: Slice, batch_rows: int = READ_CHUNK_RECORDS
) -> Iterator[list[LayoutPart]]:
    """:func:`read_slice` for the Arrow path: the records [sl.seq_lo, sl.seq_hi) of one
    segment as runs of scanned entries (:class:`pipeline.columns.LayoutPart`), <=
    batch_rows records per list, for :func:`pipeline.columns.layout_batch`. Same reads,
    checks and data-loss handling as :func:`read_slice`; no ReadRecord is built."""
    try:
        yield from _read_slice_columns(ns, sl, batch_rows)
    except (TruncatedError, NoLedgerError, NoEntryError, NotFoundError) as exc:
        _data_loss(sl, exc)


def check_stream_name(name: object) -> str:
    """A stream name from a DataFrame column, validated by the core's rules."""
    from foundation.names import validate_name

    if not isinstance(name, str):
        raise BadRequestError(f"stream name must be a string, got {name!r}")
    return validate_name(name, "stream")
