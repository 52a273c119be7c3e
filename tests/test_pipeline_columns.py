"""The Spark read tasks' Arrow path cut straight from record-set bodies (issue 18's
read target): :func:`streams.columns.scan_entry` + :func:`pipeline.columns.layout_batch`
must give exactly the rows the record path (``decode_read_records`` /
:func:`pipeline.client.read_slice` + :func:`pipeline.schema.records_to_arrow`) gives:
values, keys, headers, dlsn, offsets, timestamps, txids -- with keys and headers,
control records and end-of-stream markers in between, part of an entry, several
entries per batch, segment boundaries, a truncated start, and the same errors for
corrupt input. The first half is pure; the second reads a real cluster (no Spark).
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

pa = pytest.importorskip("pyarrow")
pytest.importorskip("numpy")

from foundation.errors import BadRequestError, ChecksumError  # noqa: E402
from pipeline.columns import LayoutPart, layout_batch  # noqa: E402
from pipeline.planning import Slice  # noqa: E402
from pipeline.schema import records_to_arrow  # noqa: E402
from streams.columns import scan_entry  # noqa: E402
from streams.records import Compression, LogRecord, ReadRecord  # noqa: E402
from streams.recordset import (  # noqa: E402
    decode_read_records,
    encode_control,
    encode_record_set,
)
from streams.recordset_encode import _seal  # noqa: E402
from streams.recordset_layout import REC  # noqa: E402
from tests.recordset_support import mixed_set  # noqa: E402

SEQNO = 3
START_SEQ = 1_000


def _schema(include_headers: bool) -> Any:
    """What pyspark's to_arrow_schema makes of the read schema (no JVM needed here)."""
    fields = [
        ("key", pa.binary()), ("value", pa.binary()), ("topic", pa.string()),
        ("partition", pa.int32()), ("offset", pa.int64()),
        ("timestamp", pa.timestamp("us", tz="UTC")), ("timestampType", pa.int32()),
    ]  # fmt: skip
    if include_headers:
        kv = pa.struct([("key", pa.string()), ("value", pa.binary())])
        fields.append(("headers", pa.list_(kv)))
    fields += [("stream", pa.string()), ("dlsn", pa.string()), ("sequence_id", pa.int64()),
               ("txid", pa.int64())]  # fmt: skip
    return pa.schema(fields)


# The Spark sink's tag header before format v3: in a v3 set just a user's header.
TAG_HEADER = "bookline.spark"
SLICE = Slice("s", SEQNO, 0, 1 << 40, 0, 99, topic="t", partition=2)


def _user_set(n: int, first_index: int, *, extras: bool, seed: int, **kw: Any) -> bytes:
    rnd = random.Random(seed)
    payloads = [rnd.randbytes(rnd.choice((0, 1, 12, 13, 100, 700))) for _ in range(n)]
    keys = headers = None
    if extras:
        keys = [None if i % 3 == 0 else b"k%d" % i for i in range(n)]
        headers = [
            None if i % 4 == 1 else
            {TAG_HEADER: b"q:1:2"} if i % 4 == 2 else
            {"h": b"v%d" % i, "empty": b"", TAG_HEADER: b"x"}
            for i in range(n)
        ]  # fmt: skip
    return encode_record_set(
        payloads, [7_000 + first_index + i for i in range(n)],
        [1_700_000_000_000 + 3 * i for i in range(n)],
        first_index=first_index, bytes_before=0, last_txid=7_000 + first_index + n,
        keys=keys, headers=headers, **kw,
    )  # fmt: skip


def _mixed_set(first_index: int) -> bytes:
    return mixed_set(first_index, 1_700_000_000_000, 9)


def _records(entries: Sequence[tuple[int, bytes]]) -> list[ReadRecord]:
    out: list[ReadRecord] = []
    for entry_id, data in entries:
        out += decode_read_records(data, "s", SEQNO, entry_id, START_SEQ)[1]
    return out


def _check_same(entries: Sequence[tuple[int, bytes]], lo: int, hi: int, headers: bool) -> None:
    """Rows lo..hi-1 of the entries' user records, both ways."""
    schema = _schema(headers)
    want = records_to_arrow(_records(entries)[lo:hi], SLICE, schema, headers)
    parts, base = [], 0
    for entry_id, data in entries:
        lay = scan_entry(data, entry_id, START_SEQ)
        a, b = max(0, lo - base), min(lay.count, hi - base)
        if a < b:
            parts.append(LayoutPart(lay, a, b))
        base += lay.count
    got = layout_batch(parts, SLICE, schema, headers)
    assert got.schema == schema
    assert got.num_rows == want.num_rows == max(0, hi - lo)
    assert got.to_pylist() == want.to_pylist()
    assert got.equals(want)


ENTRIES = [
    (0, _user_set(40, 0, extras=False, seed=1)),
    (1, encode_control(first_index=40, bytes_before=0, last_txid=7_040, timestamp_ms=5)),
    (2, _user_set(25, 40, extras=True, seed=2)),
    (3, _mixed_set(65)),
    (4, _user_set(30, 68, extras=False, seed=3, compression=Compression.LZ4)),
    (5, _user_set(9, 98, extras=True, seed=4, compression=Compression.ZSTD)),
]
TOTAL = 107


def _kafka_set(n: int, first_index: int, *, log_append: bool, seed: int) -> bytes:
    """Issue 24's records: null values (keyed and not), header pairs with repeated
    names and null values, producer timestamps out of order and far from the set's
    base (stored whole), and the set's timestamp type."""
    rnd = random.Random(seed)
    payloads = [None if i % 4 == 1 else rnd.randbytes(rnd.choice((0, 9, 70))) for i in range(n)]
    keys = [b"k%d" % i if i % 2 else None for i in range(n)]
    headers = [[("a", b"1"), ("n", None), ("a", b"%d" % i)] if i % 3 == 0 else None
               for i in range(n)]  # fmt: skip
    stamps = [1_600_000_000_000 - 86_400_000 * 40 * (i % 5) + i for i in range(n)]
    return encode_record_set(
        payloads, [9_000 + first_index + i for i in range(n)], stamps,
        first_index=first_index, bytes_before=0, last_txid=9_000 + first_index + n,
        keys=keys, headers=headers, timestamp_type=1 if log_append else 0,
        appended_ms=1_700_000_000_000,
    )  # fmt: skip


@pytest.mark.parametrize("headers", [False, True])
def test_columns_carry_null_values_producer_timestamps_and_types(headers: bool) -> None:
    """The Arrow path gives what the record path gives for issue 24's records: null
    values as nulls (not empty bytes), each record's own timestamp, the set's type."""
    entries = [
        (0, _kafka_set(30, 0, log_append=False, seed=5)),
        (1, _kafka_set(20, 30, log_append=True, seed=6)),
        (2, _user_set(10, 50, extras=False, seed=7)),
    ]
    for lo, hi in ((0, 60), (1, 29), (25, 55), (31, 32)):
        _check_same(entries, lo, hi, headers)
    rows = _records(entries)
    assert [r.payload for r in rows[:2]][1] is None
    assert {r.timestamp_type for r in rows[30:50]} == {1}


@pytest.mark.parametrize("headers", [False, True])
@pytest.mark.parametrize(
    ("lo", "hi"),
    [(0, TOTAL), (0, 1), (5, 39), (39, 41), (40, 65), (41, 67), (64, 70), (66, 67),
     (13, 100), (100, TOTAL), (0, 0)],
)  # fmt: skip
def test_columns_give_the_rows_records_give(lo: int, hi: int, headers: bool) -> None:
    _check_same(ENTRIES, lo, hi, headers)


def test_control_records_keep_their_slots_in_the_dlsn() -> None:
    lay = scan_entry(_mixed_set(0), 8, START_SEQ)
    assert lay.count == 3 and lay.end_of_stream
    batch = layout_batch([LayoutPart(lay, 0, 3)], SLICE, _schema(False))
    assert batch.column("dlsn").to_pylist() == ["3:8:0", "3:8:2", "3:8:4"]
    assert batch.column("value").to_pylist() == [b"abc", b"de", b""]
    assert batch.column("key").to_pylist() == [None, b"key", None]
    assert batch.column("offset").to_pylist() == [START_SEQ, START_SEQ + 1, START_SEQ + 2]


def test_an_empty_entry_and_an_empty_part_give_no_rows() -> None:
    lay = scan_entry(ENTRIES[1][1], 1, START_SEQ)
    assert lay.count == 0
    assert layout_batch([LayoutPart(lay, 0, 0)], SLICE, _schema(True)).num_rows == 0


def test_corrupt_sets_fail_as_the_record_decoder_fails() -> None:
    data = bytearray(ENTRIES[0][1])
    data[-1] ^= 0xFF
    for decode in (lambda d: decode_read_records(d, "s", 1, 0, 0), lambda d: scan_entry(d, 0, 0)):
        with pytest.raises(ChecksumError):
            decode(bytes(data))
    pack = REC.pack
    bad_bodies = [
        pack(0, 1, 0, 50) + b"short",  # a length past the end
        pack(0, 1, 0, 1) + b"ab",  # trailing bytes
        pack(0, 1, 0, 1)[:10],  # a torn framing
        pack(0x04, 1, 0, 1) + b"\x00\x00",  # a torn key length
    ]
    for body in bad_bodies:
        sealed = _seal(body, 1, 1, 0, 1, 1, 0, 0, Compression.NONE)
        with pytest.raises(BadRequestError):
            decode_read_records(sealed, "s", 1, 0, 0)
        with pytest.raises(BadRequestError):
            scan_entry(sealed, 0, 0)
    wrong_count = _seal(pack(0, 1, 0, 1) + b"a", 1, 0, 0, 1, 1, 0, 0, Compression.NONE)
    with pytest.raises(BadRequestError, match="user count"):
        scan_entry(wrong_count, 0, 0)


def test_a_batch_past_arrow_binary_offsets_is_a_clear_error() -> None:
    import numpy as np

    from foundation.errors import TooLargeError
    from pipeline.columns import _binary

    with pytest.raises(TooLargeError, match="arrowBatchRows"):
        _binary(np.zeros(0, dtype=np.uint8), np.array([1 << 30, 1 << 30], dtype=np.int64))


# -- a real cluster: read_slice_columns against read_slice ---------------------------


@pytest.fixture(scope="module")
def ns(bookie_cluster: Any) -> Iterator[Any]:
    from streams.sync import SyncNamespace

    namespace = SyncNamespace.open(zk=bookie_cluster.zk, root=bookie_cluster.root)
    try:
        yield namespace
    finally:
        namespace.close()


def _write(writer: Any, n: int, seed: int, extras: bool) -> list[Any]:
    rnd = random.Random(seed)
    recs = [
        LogRecord(
            rnd.randbytes(rnd.choice((0, 5, 100, 300))),
            key=b"k%d" % i if extras and i % 2 else None,
            headers={"h": b"%d" % i, TAG_HEADER: b"t"} if extras and i % 3 == 0 else None,
        )
        for i in range(n)
    ]
    out: list[Any] = []
    for lo in range(0, n, 37):  # many entries
        out += writer.write_many(recs[lo : lo + 37])
    return out


def _both_ways(ns: Any, sl: Slice, batch_rows: int, headers: bool) -> tuple[Any, Any]:
    from pipeline import client

    schema = _schema(headers)
    old = [records_to_arrow(r, sl, schema, headers) for r in client.read_slice(ns, sl, batch_rows)]
    new = [layout_batch(p, sl, schema, headers)
           for p in client.read_slice_columns(ns, sl, batch_rows)]  # fmt: skip
    return old, new


@pytest.mark.integration
def test_slices_read_as_columns_equal_the_record_path(ns: Any) -> None:
    """Three segments (sealed with keys/headers, sealed, in progress), the first
    truncated part-way: every planned slice (many cut mid-entry) reads the same rows
    in the same batches both ways, exactly its offsets."""
    from pipeline import client
    from pipeline.planning import plan_slices, resolve_range

    stream = f"cols-{uuid.uuid4().hex[:8]}"
    ns.create_stream(stream)
    first = ns.open_writer(stream, identity="cols-a")
    dlsns = _write(first, 400, seed=1, extras=True)
    first.close()
    second = ns.open_writer(stream, identity="cols-b")
    _write(second, 300, seed=2, extras=False)
    second.close()
    third = ns.open_writer(stream, identity="cols-c")
    try:
        _write(third, 200, seed=3, extras=True)
        assert third.truncate(dlsns[123])
        view = client.snapshot(ns, stream)
        assert view.first_sequence_id == 123 and view.next_sequence_id == 900
        lo, hi = resolve_range(view, None, None, fail_on_data_loss=True)
        slices = plan_slices([(view, lo, hi)], min_partitions=9, max_records=10_000,
                             fail_on_data_loss=True)  # fmt: skip
        assert len(slices) >= 9
        for sl in slices:
            for headers, batch_rows in ((True, 50), (False, 8192)):
                old, new = _both_ways(ns, sl, batch_rows, headers)
                assert [b.num_rows for b in new] == [b.num_rows for b in old]
                got = pa.Table.from_batches(new, schema=_schema(headers))
                assert got.equals(pa.Table.from_batches(old, schema=_schema(headers)))
                assert got.column("offset").to_pylist() == list(range(sl.seq_lo, sl.seq_hi))
    finally:
        third.close()


@pytest.mark.integration
def test_a_stream_ended_by_its_marker_reads_the_same(ns: Any) -> None:
    """The end-of-stream set is an entry without user records, the segment's last."""
    from pipeline import client
    from pipeline.planning import plan_slices, resolve_range

    stream = f"cols-eos-{uuid.uuid4().hex[:8]}"
    ns.create_stream(stream)
    writer = ns.open_writer(stream, identity="cols-eos")
    try:
        _write(writer, 120, seed=4, extras=True)
        writer.mark_end_of_stream()
    finally:
        writer.close()
    view = client.snapshot(ns, stream)
    lo, hi = resolve_range(view, None, None, fail_on_data_loss=True)
    (sl,) = plan_slices([(view, lo, hi)], min_partitions=1, max_records=10_000,
                        fail_on_data_loss=True)  # fmt: skip
    old, new = _both_ways(ns, sl, 8192, True)
    assert sum(b.num_rows for b in new) == 120
    assert pa.Table.from_batches(new).equals(pa.Table.from_batches(old))
