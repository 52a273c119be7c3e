"""The record set encoder's C-level path for keyed records (streams/recordset_encode.py,
``_keyed_body``): the same bytes as framing each record on its own, whatever keys,
markers, headers and timestamps the set mixes in."""

from __future__ import annotations

from typing import NamedTuple

from hypothesis import given, settings
from hypothesis import strategies as st

from streams import recordset_encode as enc
from streams.records import HeadersIn, ProducerMarker

SOME = settings(max_examples=150, deadline=None)


class Case(NamedTuple):
    payloads: list[bytes | None]
    txids: list[int]
    timestamps_ms: list[int]
    keys: list[bytes | None]
    headers: list[HeadersIn | None] | None
    markers: dict[int, ProducerMarker] | None
    base_ts: int


@st.composite
def keyed_sets(draw: st.DrawFn) -> Case:
    n = draw(st.integers(1, 60))
    base_ts = draw(st.integers(0, 1 << 41))
    keys: list[bytes | None] = [draw(st.binary(max_size=20)) for _ in range(n)]
    if draw(st.booleans()):  # now and then a record without a key
        keys[draw(st.integers(0, n - 1))] = None
    headers: list[HeadersIn | None] | None = None
    if draw(st.booleans()):
        headers = [None] * n
        headers[draw(st.integers(0, n - 1))] = [("h", b"v")]
    marker = ProducerMarker("kafka:7", 0, draw(st.integers(0, 1000)), n)
    return Case(
        [draw(st.binary(max_size=40)) for _ in range(n)],
        [base_ts] * n,
        sorted(base_ts + draw(st.integers(0, 5000)) for _ in range(n)),
        keys,
        headers,
        {0: marker} if draw(st.booleans()) else None,
        base_ts,
    )


@SOME
@given(keyed_sets())
def test_keyed_records_encode_as_one_by_one(case: Case) -> None:
    c = case
    one_by_one = enc._body_each(
        c.payloads, c.txids, c.timestamps_ms, c.base_ts, c.keys, c.headers, c.markers
    )
    flagged = enc._sparse_extras(c.headers, c.markers, None, len(c.payloads))
    if flagged is None:
        return  # too many records with extras: the encoder frames them one by one
    try:
        sparse = enc._body_sparse(c.payloads, c.txids, c.timestamps_ms, c.base_ts, c.headers,
                                  c.markers, None, flagged, c.keys)  # fmt: skip
    except TypeError:
        assert None in c.keys  # a record without a key: framed one by one
        return
    assert sparse == one_by_one
