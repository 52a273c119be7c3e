"""Issue 24 (1-4): what a record carries -- ordered headers with repeated names and
null values, null values, the producer's timestamp or the log's -- through the record
set codec (format v2; v3 since the origin tag), and data written before (format v1,
kept here as the old encoder) still read with Bookline's ``bl.*`` marker headers out
of the user's headers.
Pure codec tests; the same through real bookies and proxies is in
``test_records_v2_live.py``.
"""

from __future__ import annotations

import struct

import crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from foundation.errors import BadRequestError
from serving.write import dedup
from streams.columns import scan_entry
from streams.dlsn import DLSN
from streams.records import (
    CREATE_TIME,
    LOG_APPEND_TIME,
    Compression,
    LogRecord,
    ProducerMarker,
    ReadRecord,
    RecordColumns,
)
from streams.recordset import (
    RECORD_SET_VERSION,
    decode_header,
    decode_read_records,
    decode_with_markers,
    encode_record_set,
)
from streams.recordset_encode import check_headers

BASE_TS = 1_700_000_000_000

# -- format v1, as Bookline wrote it before issue 24 (the old encoder, kept here) -----

_V1_HEADER = struct.Struct(">BBIIqqqqqII")
_V1_REC = struct.Struct(">BqII")


def encode_v1(records: list[tuple[bytes, bytes | None, dict[str, bytes] | None]]) -> bytes:
    """A v1 record set of ``(payload, key, headers)``: txids 1.., one timestamp."""
    parts = []
    for i, (payload, key, headers) in enumerate(records):
        flags = (0x04 if key is not None else 0) | (0x08 if headers is not None else 0)
        parts.append(_V1_REC.pack(flags, i + 1, 0, len(payload)))
        if key is not None:
            parts += (struct.pack(">I", len(key)), key)
        if headers is not None:
            parts.append(struct.pack(">H", len(headers)))
            for name, value in headers.items():
                raw = name.encode()
                parts += (struct.pack(">H", len(raw)), raw, struct.pack(">I", len(value)), value)
        parts.append(payload)
    body = b"".join(parts)
    n = len(records)
    head = _V1_HEADER.pack(1, 0, n, n, 0, 1, n, BASE_TS, 0, len(body), len(body))
    return head + struct.pack(">I", crc32c.crc32c(body, crc32c.crc32c(head))) + body


def v1_marker(producer: str, epoch: int, seq: int, count: int) -> dict[str, bytes]:
    """The headers the write proxy put on a batch's first record in format v1."""
    out = {"bl.producer": producer.encode(), "bl.seq": struct.pack(">Q", seq),
           "bl.count": struct.pack(">I", count)}  # fmt: skip
    if epoch:
        out["bl.epoch"] = struct.pack(">I", epoch)
    return out


def test_v1_data_decodes_with_its_marker_headers_stripped_and_kept_as_markers() -> None:
    data = encode_v1([
        (b"a", None, {**v1_marker("p", 0, 0, 2), "app": b"1"}),
        (b"b", b"k", None),
        (b"c", None, v1_marker("q", 3, 7, 1)),
        (b"d", None, {"bl.other": b"x"}),  # reserved prefix, not a marker: still removed
    ])  # fmt: skip
    header, recs, eos = decode_read_records(data, "s", 1, 0, 0)
    assert header.version == 1 and not eos
    assert [(r.payload, r.key, r.headers) for r in recs] == [
        (b"a", None, [("app", b"1")]),
        (b"b", b"k", None),
        (b"c", None, None),
        (b"d", None, None),
    ]
    assert all(r.timestamp_type == CREATE_TIME for r in recs)
    _h, same, markers = decode_with_markers(data, "s", 1, 0, 0)
    assert same == recs
    assert markers == {0: ProducerMarker("p", 0, 0, 2), 2: ProducerMarker("q", 3, 7, 1)}


def test_v1_markers_still_rebuild_the_dedup_table() -> None:
    """A stream written before the change: its batches are still known retries."""
    data = encode_v1([(b"a", None, v1_marker("p", 0, 0, 2)), (b"b", None, None)])
    _h, recs, markers = decode_with_markers(data, "s", 1, 0, 0)
    table = dedup.DedupTable(batches_per_producer=4, producers_max=4)
    assert dedup.rebuild(table, [(r, markers.get(r.dlsn.slot_id)) for r in recs]) == 1
    assert table.plan("p", 0, 0, 2).duplicates == [(1, 0, 0), (1, 0, 1)]


def test_user_headers_named_like_old_markers_are_never_markers_in_v2() -> None:
    """A v2 record's headers are the user's, whatever their names (the write path
    refuses the reserved prefix; this is a set made by hand): never a marker."""
    forged = list(v1_marker("p", 0, 0, 1).items())
    data = encode_record_set([b"a"], [1], [BASE_TS], first_index=0, bytes_before=0,
                             last_txid=1, headers=[forged])  # fmt: skip
    _h, recs, markers = decode_with_markers(data, "s", 1, 0, 0)
    assert markers == {}
    table = dedup.DedupTable(batches_per_producer=4, producers_max=4)
    assert dedup.rebuild(table, [(r, markers.get(r.dlsn.slot_id)) for r in recs]) == 0
    assert table.plan("p", 0, 0, 1).duplicates == []


def test_the_marker_rides_in_the_framing_not_the_headers() -> None:
    marker = ProducerMarker("prod-1", 2, 40, 3)
    data = encode_record_set([b"a", b"b", b"c"], [1, 1, 1], [BASE_TS] * 3, first_index=0,
                             bytes_before=0, last_txid=1, markers={0: marker})  # fmt: skip
    recs = decode_read_records(data, "s", 1, 0, 0)[1]
    assert [r.headers for r in recs] == [None, None, None]
    assert decode_with_markers(data, "s", 1, 0, 0)[2] == {0: marker}


# -- format v2 round trips --------------------------------------------------------------

names = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=8)
header_lists = st.lists(st.tuples(st.sampled_from(["a", "b", "a.b"]) | names,
                                  st.none() | st.binary(max_size=6)), max_size=5)  # fmt: skip
records_st = st.lists(
    st.tuples(
        st.none() | st.binary(max_size=30),  # payload (None: a null value)
        st.none() | st.binary(max_size=6),  # key
        st.none() | header_lists,
        st.integers(-(2**40), 2**40),  # the producer's timestamp, from the base
    ),
    min_size=1,
    max_size=30,
)


@settings(max_examples=200, deadline=None)
@given(records_st, st.sampled_from(list(Compression)), st.sampled_from([0, 1]))
def test_v2_round_trip(
    recs: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]] | None, int]],
    compression: Compression,
    ts_type: int,
) -> None:
    payloads = [p for p, _k, _h, _t in recs]
    keys = [k for _p, k, _h, _t in recs]
    headers = [h for _p, _k, h, _t in recs]
    stamps = [BASE_TS + t for _p, _k, _h, t in recs]
    data = encode_record_set(payloads, [5] * len(recs), stamps, first_index=0, bytes_before=0,
                             last_txid=5, keys=keys, headers=headers, compression=compression,
                             timestamp_type=ts_type, appended_ms=BASE_TS)  # fmt: skip
    header, out, _eos = decode_read_records(data, "s", 1, 0, 0)
    assert header.version == RECORD_SET_VERSION and header.base_ts_ms == BASE_TS
    assert [(r.payload, r.key, r.headers, r.timestamp_ms) for r in out] == [
        (p, k, h, s) for p, k, h, s in zip(payloads, keys, headers, stamps, strict=True)
    ]
    assert {r.timestamp_type for r in out} == {ts_type}
    # The column scan (Spark's Arrow path) sees the same records.
    lay = scan_entry(data, 0, 0)
    assert lay.count == len(recs) and lay.header.timestamp_type == ts_type
    by_index = {x.record: x for x in lay.extras}
    for i, (payload, key, hdrs, stamp) in enumerate(zip(payloads, keys, headers, stamps,
                                                        strict=True)):  # fmt: skip
        x = by_index.get(i)
        if x is None:
            assert payload is not None and key is None and hdrs is None
        else:
            assert (x.key, x.headers, x.timestamp_ms, x.null) == (key, hdrs, stamp, payload is None)


def test_headers_keep_order_repeats_and_null_values() -> None:
    hdrs = [("a", b"1"), ("a", b"2"), ("b", None), ("a", b"")]
    data = encode_record_set([b"x"], [1], [BASE_TS], first_index=0, bytes_before=0,
                             last_txid=1, headers=[hdrs])  # fmt: skip
    [rec] = decode_read_records(data, "s", 1, 0, 0)[1]
    assert rec.headers == hdrs


def test_a_mapping_is_still_accepted_as_headers_and_kept_as_pairs() -> None:
    assert LogRecord(b"x", headers={"a": b"1", "b": b"2"}).headers == [("a", b"1"), ("b", b"2")]
    cols = RecordColumns([b"x"], headers=[{"a": b"1"}])
    assert cols[0].headers == [("a", b"1")]
    rec = ReadRecord("s", DLSN(1, 0, 0), 0, 1, BASE_TS, b"x", None, {"a": b"1"})
    assert rec.headers == [("a", b"1")] and rec.timestamp_type == CREATE_TIME


def test_a_null_value_is_not_an_empty_one() -> None:
    data = encode_record_set([None, b"", None], [1, 1, 1], [BASE_TS] * 3, first_index=0,
                             bytes_before=0, last_txid=1, keys=[b"k", b"k", None])  # fmt: skip
    assert [r.payload for r in decode_read_records(data, "s", 1, 0, 0)[1]] == [None, b"", None]


def test_log_append_time_sets_say_so() -> None:
    data = encode_record_set([b"x"], [1], [BASE_TS], first_index=0, bytes_before=0,
                             last_txid=1, timestamp_type=LOG_APPEND_TIME)  # fmt: skip
    assert decode_header(data).timestamp_type == LOG_APPEND_TIME
    assert decode_read_records(data, "s", 1, 0, 0)[1][0].timestamp_type == LOG_APPEND_TIME


@pytest.mark.parametrize(
    "headers",
    [
        [("bl.producer", b"p")],  # the reserved prefix
        [("a", "text")],  # a value that is not bytes
        [(1, b"v")],  # a name that is not a string
        [("a",)],  # not a pair
        [("n" * 300, b"v")],  # a name too long
    ],
)
def test_bad_headers_are_refused_with_a_clear_error(headers: list[tuple[object, ...]]) -> None:
    with pytest.raises(BadRequestError):
        check_headers(headers)  # type: ignore[arg-type]
