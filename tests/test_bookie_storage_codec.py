"""Pure codec tests of the bookie's on-disk formats: journal records, the journal mark,
entry-log records. Property-based: round trips, and every truncation or bit flip is
detected (replay returns an exact prefix of what was written, never garbage). Also: the
checkpoint's batch writer produces exactly the files of the one-record-at-a-time one."""

from __future__ import annotations

import io
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bookie.storage import entrylog, journal, journal_format
from bookie.storage.journal import ADD, FENCE, MASTER_KEY, JournalMark, JournalRecord
from foundation.errors import ChecksumError, InvariantViolation

U64 = st.integers(0, (1 << 64) - 1)
ENTRY = st.integers(0, (1 << 63) - 1)
LAC = st.integers(-1, (1 << 63) - 1)

records = st.one_of(
    st.builds(
        lambda lid, eid, lac, p: JournalRecord(ADD, lid, eid, lac, p),
        U64,
        ENTRY,
        LAC,
        st.binary(max_size=300),
    ),
    st.builds(
        lambda lid, k: JournalRecord(MASTER_KEY, lid, -1, -1, k), U64, st.binary(max_size=40)
    ),
    st.builds(lambda lid: JournalRecord(FENCE, lid, -1, -1, b""), U64),
)


def _file(recs: list[JournalRecord]) -> tuple[bytes, list[int]]:
    """A journal file image and the end offset of each record."""
    data = bytearray(journal.encode_file_header(7))
    ends = []
    for rec in recs:
        data += journal.encode_record(rec)
        ends.append(len(data))
    return bytes(data), ends


def _scan(data: bytes) -> tuple[list[JournalRecord], bool]:
    out: list[tuple[JournalRecord, int]] = []
    scan = journal.iter_records(io.BytesIO(data), journal.FILE_HEADER_BYTES, len(data), out)
    return [r for r, _ in out], scan.clean


@given(st.lists(records, max_size=20))
def test_journal_round_trip(recs: list[JournalRecord]) -> None:
    data, _ends = _file(recs)
    assert journal.decode_file_header(data) == 7
    got, clean = _scan(data)
    assert got == recs
    assert clean
    # Preallocated zeros after the data end replay cleanly.
    got, clean = _scan(data + bytes(4096))
    assert got == recs
    assert clean


@given(st.lists(records, min_size=1, max_size=10), st.data())
def test_journal_truncation_yields_prefix(recs: list[JournalRecord], data: st.DataObject) -> None:
    image, ends = _file(recs)
    cut = data.draw(st.integers(journal.FILE_HEADER_BYTES, len(image)))
    got, _clean = _scan(image[:cut])
    complete = sum(1 for e in ends if e <= cut)
    assert got == recs[:complete]


@given(st.lists(records, min_size=1, max_size=10), st.data())
@settings(max_examples=300)
def test_journal_bit_flip_detected(recs: list[JournalRecord], data: st.DataObject) -> None:
    image, ends = _file(recs)
    pos = data.draw(st.integers(journal.FILE_HEADER_BYTES, len(image) - 1))
    bit = data.draw(st.integers(0, 7))
    flipped = bytearray(image)
    flipped[pos] ^= 1 << bit
    got, clean = _scan(bytes(flipped))
    damaged = next(i for i, e in enumerate(ends) if pos < e)
    assert got == recs[:damaged]
    assert not clean


@given(st.binary(min_size=1, max_size=200))
def test_journal_junk_tail_never_decodes(junk: bytes) -> None:
    recs = [JournalRecord(ADD, 1, 0, -1, b"payload")]
    image, _ends = _file(recs)
    got, _clean = _scan(image + junk)
    # Random junk passing a CRC32C and the structure checks is ~2^-32: treat as never.
    assert got == recs


def test_journal_file_header_rejects_damage() -> None:
    header = bytearray(journal.encode_file_header(3))
    assert journal.decode_file_header(bytes(header)) == 3
    header[5] ^= 1
    assert journal.decode_file_header(bytes(header)) is None
    assert journal.decode_file_header(b"\0" * journal.FILE_HEADER_BYTES) is None


@given(U64, st.integers(0, (1 << 64) - 1))
def test_mark_round_trip(file_id: int, offset: int) -> None:
    mark = JournalMark(file_id, offset)
    data = journal.encode_mark(mark)
    assert journal.decode_mark(data) == mark
    with pytest.raises(ChecksumError):
        journal.decode_mark(data[:-1] + bytes([data[-1] ^ 0x40]))


@given(U64, ENTRY, st.binary(max_size=500), st.data())
def test_entrylog_record_round_trip_and_flip(
    ledger_id: int, entry_id: int, payload: bytes, data: st.DataObject
) -> None:
    buf = bytearray()
    n = entrylog.encode_into(buf, ledger_id, entry_id, payload)
    assert n == len(buf)
    assert entrylog.decode_record(bytes(buf)) == (ledger_id, entry_id, payload)
    pos = data.draw(st.integers(0, len(buf) - 1))
    buf[pos] ^= 1 << data.draw(st.integers(0, 7))
    with pytest.raises(ChecksumError):
        entrylog.decode_record(bytes(buf))


def test_group_runs_merges_adjacent_records() -> None:
    loc = entrylog.Location
    runs = entrylog.group_runs(
        [
            (1, loc(5, 100, 10)),
            (2, loc(5, 110, 20)),
            (3, loc(6, 130, 5)),
            (4, loc(6, 135, 5)),
            (5, loc(6, 500, 5)),
        ]
    )
    assert runs == [(loc(5, 100, 30), [1, 2]), (loc(6, 130, 10), [3, 4]), (loc(6, 500, 5), [5])]


# One ledger's flush input: ascending distinct entry ids and their payloads.
ledger_runs = st.lists(
    st.tuples(U64, st.lists(ENTRY, unique=True, max_size=12).map(sorted)).flatmap(
        lambda run: st.tuples(
            st.just(run[0]),
            st.just(run[1]),
            st.lists(st.binary(max_size=200), min_size=len(run[1]), max_size=len(run[1])),
        )
    ),
    max_size=5,
)


def _write_logs(
    directory: Path,
    bytes_max: int,
    first: tuple[int, int, bytes] | None,
    runs: list[tuple[int, list[int], list[bytes]]],
    batch: bool,
) -> tuple[list[tuple[int, int, entrylog.Location]], dict[int, int]]:
    """Write ``first`` with append(), then ``runs`` with append_run() or append();
    return every (ledger, entry, location) and the bytes per log that sync() reports."""
    writer = entrylog.EntryLogWriter(directory, entrylog.LogIds(1), bytes_max, lambda fd: None)
    try:
        placed = []
        if first is not None:
            placed.append((first[0], first[1], writer.append(*first)))
        for ledger_id, entry_ids, payloads in runs:
            if batch:
                for run in writer.append_run(ledger_id, entry_ids, payloads):
                    placed += [(ledger_id, e, loc) for e, loc in run.locations()]
            else:
                placed += [
                    (ledger_id, e, writer.append(ledger_id, e, p))
                    for e, p in zip(entry_ids, payloads, strict=True)
                ]
        return placed, writer.sync()
    finally:
        writer.close()


@settings(max_examples=60, deadline=None)
@given(
    st.integers(1, 1500), st.none() | st.tuples(U64, ENTRY, st.binary(max_size=100)), ledger_runs
)
def test_append_run_writes_what_append_writes(
    bytes_max: int,
    first: tuple[int, int, bytes] | None,
    runs: list[tuple[int, list[int], list[bytes]]],
) -> None:
    with tempfile.TemporaryDirectory() as one, tempfile.TemporaryDirectory() as other:
        ref_dir, batch_dir = Path(one), Path(other)
        expected = _write_logs(ref_dir, bytes_max, first, runs, batch=False)
        assert _write_logs(batch_dir, bytes_max, first, runs, batch=True) == expected
        logs = entrylog.list_logs(ref_dir)
        assert entrylog.list_logs(batch_dir) == logs
        for log_id in logs:
            name = entrylog.file_name(log_id)
            assert (batch_dir / name).read_bytes() == (ref_dir / name).read_bytes()
        scanned = [
            (lid, eid, loc)
            for log_id in logs
            for lid, eid, loc, _rec in entrylog.scan(batch_dir, log_id)
        ]
        assert scanned == expected[0]


def test_append_run_rolls_exactly_where_append_does(tmp_path: Path) -> None:
    """Long runs: several pwritev chunks per log, and logs that fill up exactly at a
    record boundary (the roll rule's edge case)."""
    record_bytes = entrylog.RECORD_HEADER_BYTES + 100
    bytes_max = entrylog.FILE_HEADER_BYTES + 700 * record_bytes
    runs = [
        (7, list(range(1500)), [bytes([e % 251]) * 100 for e in range(1500)]),
        (9, list(range(3, 903, 3)), [b"x" * 100] * 300),
    ]
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    expected = _write_logs(tmp_path / "a", bytes_max, None, runs, batch=False)
    assert _write_logs(tmp_path / "b", bytes_max, None, runs, batch=True) == expected
    logs = entrylog.list_logs(tmp_path / "a")
    assert len(logs) == 3
    assert entrylog.list_logs(tmp_path / "b") == logs
    for log_id in logs:
        name = entrylog.file_name(log_id)
        assert (tmp_path / "b" / name).read_bytes() == (tmp_path / "a" / name).read_bytes()
    assert (tmp_path / "a" / entrylog.file_name(logs[0])).stat().st_size == bytes_max


def test_append_run_rejects_mismatched_or_negative_input(tmp_path: Path) -> None:
    writer = entrylog.EntryLogWriter(tmp_path, entrylog.LogIds(1), 1 << 20, lambda fd: None)
    try:
        with pytest.raises(InvariantViolation):
            writer.append_run(1, [0, 1], [b"a"])
        with pytest.raises(InvariantViolation):
            writer.append_run(1, [-1, 0], [b"a", b"b"])
    finally:
        writer.close()


@pytest.mark.parametrize(("sync_every", "mid_run_syncs"), [(0, 0), (500 << 10, 1), (64 << 10, 2)])
def test_append_run_fsyncs_along_the_way_when_asked(
    tmp_path: Path, sync_every: int, mid_run_syncs: int
) -> None:
    """entry_log_sync_bytes: a checkpoint's log is fsynced every so many bytes while it
    is written, so a journal on the same disk never queues behind one huge fsync."""
    synced: list[int] = []
    writer = entrylog.EntryLogWriter(tmp_path, entrylog.LogIds(1), 1 << 30, synced.append,
                                     sync_every_bytes=sync_every)  # fmt: skip
    payloads = [bytes(600)] * 1000  # ~633 KB: pwritev chunks of 512 records (~324 KB)
    writer.append_run(7, range(1000), payloads)
    assert len(synced) == mid_run_syncs
    writer.sync()
    assert len(synced) > mid_run_syncs  # the final sync still happens (log + directory)
    writer.close()


# --- journal replay: torn tail, damaged entry or corruption (journal_format.scan) -------

adds = st.builds(
    lambda lid, eid, lac, p: JournalRecord(ADD, lid, eid, lac, p),
    st.integers(0, 5),
    ENTRY,
    LAC,
    st.binary(min_size=1, max_size=100),
)


def _grouped(groups: list[list[JournalRecord]]) -> tuple[bytes, list[tuple[int, int, int]]]:
    """A journal file image written group by group, as the journal thread does; and
    (start, end, group number) of every record."""
    image = bytearray(journal.encode_file_header(7))
    spans = []
    for g, group in enumerate(groups):
        buf = bytearray()
        for rec in group:
            start = len(buf)
            journal_format.encode_into(buf, rec.type, rec.ledger_id, rec.entry_id, rec.lac,
                                       rec.data)  # fmt: skip
            spans.append((len(image) + start, len(image) + len(buf), g))
        image += buf
    return bytes(image) + bytes(1000), spans  # + preallocated zeros


def _scan_image(image: bytes, *, last: bool = True) -> journal_format.FileScan:
    return journal_format.scan(image, journal.FILE_HEADER_BYTES, len(image), name="j",
                               last=last)  # fmt: skip


def _is_corrupt(image: bytes) -> bool:
    try:
        _scan_image(image)
    except journal_format.JournalCorruptError:
        return True
    return False


@given(
    st.lists(st.lists(records | adds, min_size=1, max_size=4), min_size=1, max_size=5), st.data()
)
@settings(max_examples=300)
def test_journal_scan_never_drops_acknowledged_records(
    groups: list[list[JournalRecord]], data: st.DataObject
) -> None:
    """One flipped bit anywhere: in the last group it is a torn tail (a prefix comes
    back); before it, either exactly the damaged ADD is reported and every other record
    comes back, or replay refuses (JournalCorruptError) -- never a silent cut."""
    image, spans = _grouped(groups)
    flat = [rec for group in groups for rec in group]
    assert [r for r, _e in _scan_image(image).records] == flat
    k = data.draw(st.integers(0, len(spans) - 1))
    start, end, g = spans[k]
    flipped = bytearray(image)
    flipped[data.draw(st.integers(start, end - 1))] ^= 1 << data.draw(st.integers(0, 7))
    if g < len(groups) - 1 and _is_corrupt(bytes(flipped)):
        # Damage before a later valid group is acknowledged data: a clear stop.
        with pytest.raises(journal_format.JournalCorruptError, match=f"offset {start}"):
            _scan_image(bytes(flipped))
        return
    found = _scan_image(bytes(flipped))
    got = [r for r, _e in found.records]
    if g == len(groups) - 1:  # the last group: a torn tail
        assert got == flat[:k]
        assert not found.damaged
        assert found.end == start
        return
    assert got == flat[:k] + flat[k + 1 :]
    (bad,) = found.damaged
    assert bad.offset == start
    assert flat[k].type == ADD
    assert bad.record._replace(data=flat[k].data) == flat[k]


def test_journal_scan_zeroed_block_before_acknowledged_data_is_corruption() -> None:
    groups = [[JournalRecord(ADD, 1, e, e - 1, b"x" * 50)] for e in range(6)]
    image, spans = _grouped(groups)
    hole = bytearray(image)
    start = spans[2][0]
    hole[start : start + 60] = bytes(60)
    with pytest.raises(journal_format.JournalCorruptError, match=f"offset {start}: zeros"):
        _scan_image(bytes(hole))
    # The same hole in the last group: the torn tail of a write that never completed.
    last = bytearray(image)
    start = spans[-1][0]
    last[start : start + 60] = bytes(60)
    found = _scan_image(bytes(last))
    assert len(found.records) == 5
    assert found.end == start


def test_journal_scan_torn_tail_in_a_rolled_file_is_corruption() -> None:
    image, spans = _grouped([[JournalRecord(ADD, 1, e, e - 1, b"y" * 20)] for e in range(3)])
    torn = image[: spans[-1][1] - 5]
    assert len(_scan_image(torn).records) == 2
    with pytest.raises(journal_format.JournalCorruptError, match="rolled"):
        _scan_image(torn, last=False)
    assert len(_scan_image(image, last=False).records) == 3  # a clean end is fine


def _legacy_record(rec: JournalRecord) -> bytes:
    """A version 1 record (one crc over length .. body), as bookies before wrote them."""
    import struct

    import crc32c

    if rec.type == ADD:
        body = struct.pack(">BBQqq", 1, ADD, rec.ledger_id, rec.entry_id, rec.lac) + rec.data
    else:
        body = struct.pack(">BBQ", 1, rec.type, rec.ledger_id) + (
            rec.data if rec.type == MASTER_KEY else b""
        )
    length = struct.pack(">I", len(body))
    return struct.pack(">I", crc32c.crc32c(body, crc32c.crc32c(length))) + length + body


def test_journal_reads_version_1_files(tmp_path: Path) -> None:
    """Journals written before the two-checksum format still replay; their damage can
    never be named (one checksum), so a bad record before valid ones stops replay."""
    import struct

    import crc32c

    head = struct.pack(">4sHHQI", b"BKLJ", 1, 0, 5, 0)
    recs = [JournalRecord(MASTER_KEY, 1, -1, -1, b"k"),
            *(JournalRecord(ADD, 1, e, e - 1, b"p%d" % e) for e in range(4)),
            JournalRecord(FENCE, 1, -1, -1, b"")]  # fmt: skip
    image = head + crc32c.crc32c(head).to_bytes(4, "big") + b"".join(map(_legacy_record, recs))
    path = tmp_path / journal.file_name(5)
    path.write_bytes(image + bytes(100))
    result = journal.replay(tmp_path, JournalMark(5, 0))
    assert [r for r, _e in result.records] == recs
    assert result.tail_clean
    damaged = bytearray(image)
    damaged[journal.FILE_HEADER_BYTES + 40] ^= 1
    path.write_bytes(bytes(damaged) + bytes(100))
    with pytest.raises(journal_format.JournalCorruptError):
        journal.replay(tmp_path, JournalMark(5, 0))
