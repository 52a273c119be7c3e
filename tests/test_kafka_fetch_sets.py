"""A catch-up fetch's record batch cut from stored record sets column-wise (issue 25's
consume target): :func:`kafkaapi.fetch_sets.sets_batch` must give, byte for byte, the
batch the record path gives -- ``decode_verified`` into ``ReadRecord`` tuples, then
``encode_columns`` record by record -- for any sets: keys and values null or not, of
0 to ~1,000 bytes, headers (encoded the record way), producer markers, timestamps near
and far from the set's base, compacted (sparse) sets, control records and
end-of-stream markers between records, several sets, and a fetch offset inside them
(and :func:`streams.columns.payload_bytes`, what a stream's info counts of its last
entry, is the records' payload bytes).
:func:`kafkaapi.protocol.records_arrays.encode_arrays` alone is checked against
``encode_columns`` the same way. Pure: no cluster.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kafkaapi.fetch_sets import records_batch, sets_batch
from kafkaapi.protocol.records import decode_batches, encode_columns
from kafkaapi.protocol.records_arrays import encode_arrays
from streams.columns import payload_bytes, scan_entry
from streams.reader_items import RawRecordSet
from streams.records import CREATE_TIME, LOG_APPEND_TIME, Compression, ProducerMarker, ReadRecord
from streams.recordset import decode_read_records, encode_control, encode_record_set
from streams.recordset_sparse import encode_sparse_set
from tests.recordset_support import mixed_set

STREAM = "t~0"
SEQNO = 2
START_SEQ = 5_000
BASE_TS = 1_700_000_000_000

_bytes = st.one_of(
    st.none(), st.binary(max_size=12), st.binary(min_size=120, max_size=140),
    st.binary(min_size=900, max_size=1_000),
)  # fmt: skip
_header = st.tuples(
    st.sampled_from(["h", "trace", "é"]), st.one_of(st.none(), st.binary(max_size=8))
)
_record = st.fixed_dictionaries({
    "key": _bytes,
    "value": _bytes,
    "ts": st.one_of(st.integers(0, 200), st.integers(-(2**40), 2**40)),
    "headers": st.one_of(st.none(), st.lists(_header, min_size=1, max_size=3)),
    "marker": st.booleans(),
})  # fmt: skip
_set = st.fixed_dictionaries({
    "records": st.lists(_record, min_size=1, max_size=40),
    "kind": st.sampled_from(["user", "sparse", "control", "mixed"]),
    "log_append": st.booleans(),
    "compression": st.sampled_from([Compression.NONE, Compression.LZ4]),
    "keep": st.integers(0, 2**40),  # which records a compaction keeps (bits)
})  # fmt: skip


def _user_set(spec: dict[str, Any], first_index: int, with_headers: bool) -> bytes:
    recs = spec["records"]
    return encode_record_set(
        [r["value"] for r in recs], [100 + first_index + i for i in range(len(recs))],
        [BASE_TS + r["ts"] for r in recs], first_index=first_index, bytes_before=0,
        last_txid=100 + first_index + len(recs), keys=[r["key"] for r in recs],
        headers=[r["headers"] for r in recs] if with_headers else None,
        markers={i: ProducerMarker("p", 1, i, 1) for i, r in enumerate(recs) if r["marker"]},
        compression=spec["compression"],
        timestamp_type=LOG_APPEND_TIME if spec["log_append"] else CREATE_TIME,
        appended_ms=BASE_TS,
    )  # fmt: skip


def _mixed_set(first_index: int) -> bytes:
    return mixed_set(first_index, BASE_TS, -9)


def _stored(specs: list[dict[str, Any]], with_headers: bool) -> list[RawRecordSet]:
    """The sets of ``specs``, one entry each, offsets one run from START_SEQ."""
    out, first_index = [], 0
    for entry_id, spec in enumerate(specs):
        if spec["kind"] == "control":
            payload = encode_control(first_index=first_index, bytes_before=0, last_txid=1,
                                     timestamp_ms=BASE_TS)  # fmt: skip
        elif spec["kind"] == "mixed":
            payload = _mixed_set(first_index)
        else:
            payload = _user_set(spec, first_index, with_headers)
        if spec["kind"] == "sparse":
            header, recs, _eos = decode_read_records(payload, STREAM, SEQNO, entry_id, START_SEQ)
            kept = [r for i, r in enumerate(recs) if spec["keep"] >> i & 1]
            if kept:
                payload = encode_sparse_set(header, START_SEQ + first_index, kept)
        header, _recs, _eos = decode_read_records(payload, STREAM, SEQNO, entry_id, START_SEQ)
        users = header.user_count
        out.append(RawRecordSet(payload, SEQNO, entry_id, START_SEQ, 0,
                                START_SEQ + first_index + users, users))  # fmt: skip
        first_index += users
    return out


def _record_way(sets: list[RawRecordSet], offset: int) -> tuple[bytes, int]:
    recs: list[ReadRecord] = []
    for s in sets:
        recs += decode_read_records(s.payload, STREAM, SEQNO, s.entry_id, START_SEQ)[1]
    recs = [r for r in recs if r.sequence_id >= offset]
    return (records_batch(recs), recs[-1].sequence_id + 1) if recs else (b"", offset)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs=st.lists(_set, min_size=1, max_size=4), with_headers=st.booleans(),
       skip=st.integers(0, 200))  # fmt: skip
def test_a_batch_cut_from_stored_sets_is_the_batch_of_their_records(
    specs: list[dict[str, Any]], with_headers: bool, skip: int
) -> None:
    sets = _stored(specs, with_headers)
    offset = START_SEQ + skip
    got = sets_batch(sets, offset, STREAM)
    assert got == _record_way(sets, offset)
    if got[0]:
        assert decode_batches(got[0])[0].records[0].offset >= offset
    for s in sets:  # what a stream's info counts of its last entry (Namespace._confirmed)
        recs = decode_read_records(s.payload, STREAM, SEQNO, s.entry_id, START_SEQ)[1]
        layout = scan_entry(s.payload, s.entry_id, START_SEQ, keys_inline=True)
        assert payload_bytes(layout) == sum(len(r.payload or b"") for r in recs)


@settings(max_examples=300, deadline=None)
@given(records=st.lists(_record, min_size=1, max_size=60), gaps=st.lists(st.integers(1, 5000)))
def test_the_column_encoder_is_the_record_encoder(
    records: list[dict[str, Any]], gaps: list[int]
) -> None:
    offsets, at = [], 7
    for i in range(len(records)):
        offsets.append(at)
        at += gaps[i] if i < len(gaps) else 1
    stamps = [BASE_TS + r["ts"] for r in records]
    keys, values = [r["key"] for r in records], [r["value"] for r in records]
    payload = b"".join((k or b"") + (v or b"") for k, v in zip(keys, values, strict=True))
    for log_append in (False, True):
        want = encode_columns(offsets, stamps, keys, values, [None] * len(records),
                              log_append_time=log_append)  # fmt: skip
        got = encode_arrays(
            np.array(offsets, dtype=np.int64), np.array(stamps, dtype=np.int64),
            np.array([-1 if k is None else len(k) for k in keys], dtype=np.int64),
            np.array([-1 if v is None else len(v) for v in values], dtype=np.int64),
            np.frombuffer(payload, dtype=np.uint8), log_append_time=log_append,
        )  # fmt: skip
        assert got == want
