"""httpapi.recordsets: record sets handed through a read proxy (pure codec), and the
thin client's decode of them into records with the core's record-set codec."""

from __future__ import annotations

import crc32c
import pytest
from hypothesis import given
from hypothesis import strategies as st

from foundation.errors import BadRequestError, ChecksumError
from httpapi import recordsets
from httpapi.recordsets import SetFrame
from streams.records import Compression
from streams.recordset import encode_record_set
from thinclient.reads import decode_sets


def _set(payloads: list[bytes], first_index: int = 0) -> bytes:
    txids = [first_index + i + 1 for i in range(len(payloads))]
    return encode_record_set(
        payloads,
        txids,
        [1_000] * len(payloads),
        first_index=first_index,
        bytes_before=0,
        last_txid=txids[-1],
        compression=Compression.NONE,
    )


@given(
    st.lists(st.tuples(st.binary(max_size=64), st.integers(0, 2**40), st.integers(0, 2**31)),
             max_size=8),
    st.integers(-1, 2**40),
)  # fmt: skip
def test_encode_decode_round_trip(items: list[tuple[bytes, int, int]], next_seq: int) -> None:
    frames = [SetFrame(p, n, e, n + e, 0) for p, n, e in items]
    assert recordsets.decode(recordsets.encode(frames, next_seq)) == (frames, next_seq)


def test_damage_is_caught_before_decoding() -> None:
    body = bytearray(recordsets.encode([SetFrame(b"x" * 40, 1, 2, 3, 0)], 7))
    body[30] ^= 0x01
    with pytest.raises(ChecksumError):
        recordsets.decode(bytes(body))
    with pytest.raises(BadRequestError):
        recordsets.decode(b"BLRX" + bytes(body[4:]))
    with pytest.raises(BadRequestError):
        recordsets.decode(bytes(body[:10]))


def test_truncated_framing_is_a_bad_request_not_an_index_error() -> None:
    frames = [SetFrame(b"abc", 1, 2, 3, 0)]
    good = recordsets.encode(frames, 4)
    # Claim two sets but hold one (the CRC recomputed, so framing is what fails).
    head = bytearray(good[:24])
    head[8:12] = (2).to_bytes(4, "big")
    crc = crc32c.crc32c(good[24:], crc32c.crc32c(bytes(head[:20])))
    head[20:24] = crc.to_bytes(4, "big")
    with pytest.raises(BadRequestError):
        recordsets.decode(bytes(head) + good[24:])


def test_thin_client_decodes_sets_into_records_with_sequence_ids() -> None:
    first = _set([b"a", b"b", b"c"])
    second = _set([b"d", b"e"], first_index=3)
    body = recordsets.encode([SetFrame(first, 2, 0, 100, 1), SetFrame(second, 2, 1, 100, 0)], 105)
    records, next_seq, ended = decode_sets("s", body)
    assert [r.payload for r in records] == [b"b", b"c", b"d", b"e"]  # from slot 1 on
    assert [r.sequence_id for r in records] == [101, 102, 103, 104]
    assert [tuple(r.dlsn) for r in records][:2] == [(2, 0, 1), (2, 0, 2)]
    assert (next_seq, ended) == (105, False)
