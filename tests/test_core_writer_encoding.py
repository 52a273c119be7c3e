"""The writer's batched path gives the same bytes and the same entries as before.

``encode_record_set`` frames records per run of equal (txid, timestamp), and
``write_many`` finds where entries are cut by bisection (issue 17): that only changes
how the work is done, so these tests compare the bytes with the layout
streams/recordset.py documents, built one record at a time, and the cut points with
adding record sizes one by one; the ADD frame a writer sends in two pieces joins to
the one-piece frame."""

from __future__ import annotations

import itertools
import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bookie import protocol as p
from streams.records import RECORD_OVERHEAD_BYTES, Compression
from streams.recordset import decode_read_records, encode_record_set
from streams.writer.writer import _records_fitting

_REC = struct.Struct(">BqII")
_HEADER = struct.Struct(">BBIIqqqqqII")


def reference_body(payloads: list[bytes], txids: list[int], timestamps: list[int]) -> bytes:
    """The documented layout, one record at a time (the encoder before issue 17)."""
    base = timestamps[0]
    return b"".join(
        _REC.pack(0, t, ts - base, len(pl)) + pl
        for pl, t, ts in zip(payloads, txids, timestamps, strict=True)
    )


def body_of(record_set: bytes) -> bytes:
    return record_set[_HEADER.size + 4 :]


# Runs of records sharing a txid and a timestamp, as a writer makes them; sometimes
# unsorted (another caller of the codec), sometimes one run per record.
records = st.lists(
    st.tuples(
        st.integers(min_value=1, max_value=40),  # run length
        st.integers(min_value=-5, max_value=5),  # txid step to the run
        st.integers(min_value=0, max_value=3),  # timestamp step to the run
        st.lists(st.integers(min_value=0, max_value=40), min_size=1, max_size=3),  # lengths
    ),
    min_size=1,
    max_size=30,
)


def expand(runs: list[tuple[int, int, int, list[int]]]) -> tuple[list[bytes], list[int], list[int]]:
    payloads, txids, timestamps = [], [], []
    txid, ts = 1_000, 1_700_000_000_000
    for k, (count, dtxid, dts, lengths) in enumerate(runs):
        txid += dtxid
        ts += dts
        for i in range(count):
            length = lengths[i % len(lengths)]
            payloads.append(bytes([(k + i) % 251]) * length)
            txids.append(txid)
            timestamps.append(ts)
    return payloads, txids, timestamps


@settings(max_examples=300, deadline=None)
@given(records)
def test_record_set_bytes_equal_the_per_record_layout(
    runs: list[tuple[int, int, int, list[int]]],
) -> None:
    payloads, txids, timestamps = expand(runs)
    encoded = encode_record_set(
        payloads, txids, timestamps, first_index=7, bytes_before=9, last_txid=max(txids)
    )
    assert body_of(encoded) == reference_body(payloads, txids, timestamps)
    decoded = decode_read_records(encoded, "s", 1, 2, 100)[1]
    assert [r.payload for r in decoded] == payloads
    assert [r.txid for r in decoded] == txids
    assert [r.timestamp_ms for r in decoded] == timestamps


def test_same_size_records_of_one_call_share_one_framing() -> None:
    """A write_many of same-size records: one framing for all, the join's separator."""
    payloads = [bytes([i % 256]) * 100 for i in range(4_000)]
    txids, timestamps = [42] * 4_000, [1_700_000_000_123] * 4_000
    encoded = encode_record_set(payloads, txids, timestamps, first_index=0, bytes_before=0,
                                last_txid=42)  # fmt: skip
    assert body_of(encoded) == reference_body(payloads, txids, timestamps)
    one = encode_record_set([b""], [1], [2], first_index=0, bytes_before=0, last_txid=1)
    assert body_of(one) == reference_body([b""], [1], [2])


def test_one_txid_per_record_and_tuples_take_the_per_record_path() -> None:
    n = 1_000
    payloads = tuple(bytes([i % 256]) * (i % 37) for i in range(n))
    txids = tuple(range(n))  # every record its own run
    timestamps = tuple(1_000 + i // 10 for i in range(n))
    encoded = encode_record_set(payloads, txids, timestamps, first_index=0, bytes_before=0,
                                last_txid=n - 1)  # fmt: skip
    assert body_of(encoded) == reference_body(list(payloads), list(txids), list(timestamps))


def test_compressed_and_keyed_sets_still_round_trip() -> None:
    payloads = [b"abc" * 50] * 200
    txids, timestamps = [5] * 200, [10] * 200
    encoded = encode_record_set(payloads, txids, timestamps, first_index=0, bytes_before=0,
                                last_txid=5, compression=Compression.LZ4)  # fmt: skip
    assert [r.payload for r in decode_read_records(encoded, "s", 1, 0, 0)[1]] == payloads
    keyed = encode_record_set(payloads[:3], txids[:3], timestamps[:3], first_index=0,
                              bytes_before=0, last_txid=5, keys=[b"k", None, b"k2"],
                              headers=[None, {"h": b"v"}, None])  # fmt: skip
    back = decode_read_records(keyed, "s", 1, 0, 0)[1]
    assert [(r.key, r.headers) for r in back] == [
        (b"k", None),
        (None, [("h", b"v")]),
        (b"k2", None),
    ]


def reference_headers_body(
    payloads: list[bytes], txids: list[int], timestamps: list[int], headers: list[Any]
) -> bytes:
    """The documented layout with headers (flag 0x08), one record at a time."""
    base, parts = timestamps[0], []
    for pl, t, ts, hdrs in zip(payloads, txids, timestamps, headers, strict=True):
        parts.append(_REC.pack(0 if hdrs is None else 0x08, t, ts - base, len(pl)))
        if hdrs is not None:
            parts.append(struct.pack(">H", len(hdrs)))
            for name, value in hdrs.items():
                raw = name.encode()
                parts += (struct.pack(">H", len(raw)), raw, struct.pack(">I", len(value)), value)
        parts.append(pl)
    return b"".join(parts)


@settings(max_examples=300, deadline=None)
@given(records, st.data())
def test_a_batch_with_headers_on_a_few_records_has_the_per_record_bytes(
    runs: list[tuple[int, int, int, list[int]]], data: st.DataObject
) -> None:
    """A write proxy's producer batch carries its marker on the first record only
    (issue 23): the plain records around it take the framing-per-run path, and the
    bytes are those of the layout, record by record -- empty header maps included."""
    payloads, txids, timestamps = expand(runs)
    n = len(payloads)
    marked = data.draw(st.sets(st.integers(min_value=0, max_value=n - 1), max_size=3))
    maps = st.dictionaries(
        st.text("ab.", min_size=1, max_size=5), st.binary(max_size=5), max_size=2
    )
    headers: list[Any] = [data.draw(maps) if k in marked else None for k in range(n)]
    keys = data.draw(st.sampled_from([None, [None] * n]))  # the buffer's all-None keys
    encoded = encode_record_set(payloads, txids, timestamps, first_index=0, bytes_before=0,
                                last_txid=max(txids), keys=keys, headers=headers)  # fmt: skip
    assert body_of(encoded) == reference_headers_body(payloads, txids, timestamps, headers)
    back = decode_read_records(encoded, "s", 1, 0, 0)[1]
    pairs = [None if h is None else list(h.items()) for h in headers]
    assert [(r.payload, r.headers) for r in back] == list(zip(payloads, pairs, strict=True))


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(min_value=0, max_value=300), min_size=1, max_size=60),
    st.data(),
)
def test_entry_cut_points_are_those_of_adding_sizes_one_by_one(
    user: list[int], data: st.DataObject
) -> None:
    """The writer cuts entries by bisecting running byte counts: the same records fit
    as when their sizes (framing included) were added one at a time."""
    i = data.draw(st.integers(min_value=0, max_value=len(user) - 1))
    room = data.draw(st.integers(min_value=-50, max_value=4_000))
    ends = list(itertools.accumulate(user, initial=0))
    j, used = i, 0
    while j < len(user) and used + user[j] + RECORD_OVERHEAD_BYTES <= room:
        used += user[j] + RECORD_OVERHEAD_BYTES
        j += 1
    assert _records_fitting(ends, i, room) == j


@pytest.mark.parametrize("recovery", [False, True])
@pytest.mark.parametrize("payload", [b"", b"x", bytes(range(256)) * 2_000])
def test_add_frame_in_two_pieces_is_the_frame(payload: bytes, recovery: bool) -> None:
    """The writer hands an ADD to the socket as (head, entry): joined, they are the
    frame ``encode_request`` makes and the bookie's decoder reads."""
    encoder = p.AddEncoder(77, b"k" * 20, recovery)
    head, body = encoder.encode_parts(9, 5, 4, payload)
    assert body is payload  # not copied
    frame = head + body
    assert frame == encoder.encode(9, 5, 4, payload)
    assert frame == p.encode_request(p.AddRequest(9, 77, 5, 4, b"k" * 20, payload, recovery))
