"""Issue 24 (1): internal per-record metadata -- the write proxy's producer marker and
a writer's *origin tag* (the Spark sink's exactly-once tag) -- travels in the record
framing (record set format v3), never as a header: readers never see it, only
``decode_internal`` returns it, compaction keeps it; data written before (format v2,
and v1) with the sink's ``bookline.spark`` header reads with that header turned into
the tag. Pure codec tests; the sink through Spark is in ``test_pipeline_*`` and
``test_record_edges_integration.py``.
"""

from __future__ import annotations

import struct

import crc32c
import pytest

from foundation.errors import BadRequestError
from streams.columns import scan_entry
from streams.records import ProducerMarker, RecordColumns
from streams.recordset import (
    decode_header,
    decode_internal,
    decode_read_records,
    decode_with_markers,
    encode_record_set,
    encode_sparse_set,
)
from streams.recordset_layout import F_MARKER, RECORD_SET_VERSION

BASE_TS = 1_700_000_000_000
TAG = b"query-1:4:run-a:2"
MARKER = ProducerMarker("prod-1", 2, 40, 3)
_SET_HEADER = struct.Struct(">BBIIqqqqqII")


def _sealed(version: int, records: list[bytes]) -> bytes:
    """A set of format ``version`` around the framed ``records`` (txids 1..)."""
    body = b"".join(records)
    n = len(records)
    head = _SET_HEADER.pack(version, 0, n, n, 0, 1, n, BASE_TS, 0, len(body), len(body))
    return head + struct.pack(">I", crc32c.crc32c(body, crc32c.crc32c(head))) + body


def _headers(pairs: list[tuple[str, bytes]], value_len: str) -> bytes:
    out = [struct.pack(">H", len(pairs))]
    for name, value in pairs:
        raw = name.encode()
        out += (struct.pack(">H", len(raw)), raw, struct.pack(value_len, len(value)), value)
    return b"".join(out)


def _v2_record(txid: int, payload: bytes, headers: list[tuple[str, bytes]],
               marker: ProducerMarker | None = None) -> bytes:  # fmt: skip
    """One record as format v2 framed it: the marker alone under flag 0x40 (no kinds
    byte), the sink's tag a header."""
    flags = 0x08 | (F_MARKER if marker is not None else 0)
    parts = [struct.pack(">BqiI", flags, txid, 0, len(payload)), _headers(headers, ">i")]
    if marker is not None:
        pid = marker.producer.encode()
        parts += (struct.pack(">H", len(pid)), pid,
                  struct.pack(">IqI", marker.epoch, marker.seq, marker.count))  # fmt: skip
    return b"".join([*parts, payload])


def _v1_record(txid: int, payload: bytes, headers: list[tuple[str, bytes]]) -> bytes:
    return struct.pack(">BqII", 0x08, txid, 0, len(payload)) + _headers(headers, ">I") + payload


def test_an_origin_tag_rides_in_the_framing_and_no_reader_sees_it() -> None:
    data = encode_record_set(
        [b"a", b"b", None], [1, 1, 1], [BASE_TS] * 3, first_index=0, bytes_before=0,
        last_txid=1, keys=[None, b"k", None], headers=[[("h", b"1")], None, None],
        markers={0: MARKER}, tags={0: TAG, 1: TAG, 2: b""},
    )  # fmt: skip
    assert decode_header(data).version == RECORD_SET_VERSION == 3
    _h, recs, _eos = decode_read_records(data, "s", 1, 0, 0)
    assert [(r.payload, r.key, r.headers) for r in recs] == [
        (b"a", None, [("h", b"1")]), (b"b", b"k", None), (None, None, None)
    ]  # fmt: skip
    _h, same, markers, tags = decode_internal(data, "s", 1, 0, 0)
    assert same == recs
    assert (markers, tags) == ({0: MARKER}, {0: TAG, 1: TAG, 2: b""})
    assert decode_with_markers(data, "s", 1, 0, 0)[2] == {0: MARKER}
    layout = scan_entry(data, 0, 0)  # the Spark source's column path
    assert [(e.key, e.headers) for e in layout.extras] == [
        (None, [("h", b"1")]), (b"k", None), (None, None)
    ]  # fmt: skip


def test_many_tagged_records_and_a_marker_alone_round_trip() -> None:
    """Every record of a sink write tagged (the per-record path), and a write proxy's
    batch with only its marker (the sparse-extras path) -- both still read."""
    n = 50
    payloads = [b"p%d" % i for i in range(n)]
    every = dict.fromkeys(range(n), TAG)
    tagged = encode_record_set(payloads, [1] * n, [BASE_TS] * n, first_index=0,
                               bytes_before=0, last_txid=1, tags=every)  # fmt: skip
    _h, recs, markers, tags = decode_internal(tagged, "s", 1, 0, 0)
    assert [r.payload for r in recs] == payloads and all(r.headers is None for r in recs)
    assert (markers, tags) == ({}, every)
    marked = encode_record_set(payloads, [1] * n, [BASE_TS] * n, first_index=0,
                               bytes_before=0, last_txid=1, markers={0: MARKER})  # fmt: skip
    assert decode_internal(marked, "s", 1, 0, 0)[2:] == ({0: MARKER}, {})


def test_v2_data_reads_its_sink_tag_header_as_the_tag_and_its_marker_as_before() -> None:
    tag_header = ("bookline.spark", TAG)
    data = _sealed(2, [
        _v2_record(1, b"a", [("user", b"0"), tag_header], MARKER),
        _v2_record(2, b"b", [tag_header]),
        _v2_record(3, b"c", [("user", b"2")]),
    ])  # fmt: skip
    _h, recs, _eos = decode_read_records(data, "s", 1, 0, 0)
    assert [r.headers for r in recs] == [[("user", b"0")], None, [("user", b"2")]]
    assert decode_internal(data, "s", 1, 0, 0)[2:] == ({0: MARKER}, {0: TAG, 1: TAG})
    layout = scan_entry(data, 0, 0)
    assert [e.headers for e in layout.extras] == [[("user", b"0")], None, [("user", b"2")]]


def test_v1_data_reads_its_sink_tag_header_as_the_tag() -> None:
    data = _sealed(1, [_v1_record(1, b"a", [("bookline.spark", TAG), ("user", b"0")])])
    assert decode_read_records(data, "s", 1, 0, 0)[1][0].headers == [("user", b"0")]
    assert decode_internal(data, "s", 1, 0, 0)[3] == {0: TAG}


def test_in_v3_a_header_named_like_the_old_tag_is_the_users() -> None:
    data = encode_record_set([b"a"], [1], [BASE_TS], first_index=0, bytes_before=0,
                             last_txid=1, headers=[[("bookline.spark", b"mine")]])  # fmt: skip
    assert decode_read_records(data, "s", 1, 0, 0)[1][0].headers == [("bookline.spark", b"mine")]
    assert decode_internal(data, "s", 1, 0, 0)[3] == {}


def test_compaction_keeps_a_kept_records_tag() -> None:
    data = encode_record_set([b"a", b"b", b"c"], [1, 1, 1], [BASE_TS] * 3, first_index=0,
                             bytes_before=0, last_txid=1, tags={0: b"t0", 1: b"t1", 2: b"t2"},
                             markers={0: MARKER})  # fmt: skip
    header, recs, markers, tags = decode_internal(data, "s", 1, 0, 0)
    sparse = encode_sparse_set(header, 0, [recs[0], recs[2]], markers, tags)
    _h, kept, markers2, tags2 = decode_internal(sparse, "s", 1, 0, 0)
    assert [r.payload for r in kept] == [b"a", b"c"] and all(r.headers is None for r in kept)
    assert (markers2, tags2) == ({0: MARKER}, {0: b"t0", 2: b"t2"})


@pytest.mark.parametrize("kinds", [0x00, 0x04, 0x80])
def test_unknown_internal_extras_are_refused(kinds: int) -> None:
    record = struct.pack(">BqiI", F_MARKER, 1, 0, 1) + bytes((kinds,)) + b"a"
    with pytest.raises(BadRequestError, match="internal extras"):
        decode_read_records(_sealed(3, [record]), "s", 1, 0, 0)


def test_a_truncated_tag_is_refused() -> None:
    record = struct.pack(">BqiI", F_MARKER, 1, 0, 0) + b"\x02" + struct.pack(">H", 10) + b"abc"
    with pytest.raises(BadRequestError, match="truncated"):
        decode_read_records(_sealed(3, [record]), "s", 1, 0, 0)


def test_a_tag_too_long_for_the_framing_is_refused_by_the_encoder() -> None:
    with pytest.raises(BadRequestError, match="origin tag"):
        encode_record_set([b"a"], [1], [BASE_TS], first_index=0, bytes_before=0,
                          last_txid=1, tags={0: b"x" * 0x10000})  # fmt: skip


def test_record_columns_keep_the_tag_on_every_slice() -> None:
    cols = RecordColumns([b"a", b"b", b"c"], tag=TAG, marker=MARKER)
    assert cols[1:].tag == TAG and cols[1:].marker is None
    assert cols[:2].tag == TAG and cols[:2].marker == MARKER
