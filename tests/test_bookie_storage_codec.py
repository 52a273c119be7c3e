"""Pure codec tests of the bookie's on-disk formats: journal records, the journal mark,
entry-log records. Property-based: round trips, and every truncation or bit flip is
detected (replay returns an exact prefix of what was written, never garbage)."""

from __future__ import annotations

import io

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bookie.storage import entrylog, journal
from bookie.storage.journal import ADD, FENCE, MASTER_KEY, JournalMark, JournalRecord
from bookline.errors import ChecksumError

U64 = st.integers(0, (1 << 64) - 1)
ENTRY = st.integers(0, (1 << 63) - 1)
LAC = st.integers(-1, (1 << 63) - 1)

records = st.one_of(
    st.builds(lambda lid, eid, lac, p: JournalRecord(ADD, lid, eid, lac, p),
              U64, ENTRY, LAC, st.binary(max_size=300)),
    st.builds(lambda lid, k: JournalRecord(MASTER_KEY, lid, -1, -1, k),
              U64, st.binary(max_size=40)),
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
    assert got == recs and clean
    # Preallocated zeros after the data end replay cleanly.
    got, clean = _scan(data + bytes(4096))
    assert got == recs and clean


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
def test_entrylog_record_round_trip_and_flip(ledger_id: int, entry_id: int, payload: bytes,
                                             data: st.DataObject) -> None:
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
    runs = entrylog.group_runs([
        (1, loc(5, 100, 10)), (2, loc(5, 110, 20)), (3, loc(6, 130, 5)), (4, loc(6, 135, 5)),
        (5, loc(6, 500, 5)),
    ])
    assert runs == [(loc(5, 100, 30), [1, 2]), (loc(6, 130, 10), [3, 4]), (loc(6, 500, 5), [5])]
