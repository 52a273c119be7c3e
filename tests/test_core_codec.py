"""Pure tests of the core library's codecs: DLSNs, start positions, record sets,
truncation/retention planning (no I/O). Hypothesis prints the falsifying example; the
seeded corruption test prints its seed."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from foundation.errors import (
    BadRequestError,
    BooklineError,
    ChecksumError,
    ConfigError,
    InvariantViolation,
    TooLargeError,
)
from metadata.segments import SegmentMetadata, SegmentState, TruncationState
from metadata.streams import StreamOptions
from streams.config import NamespaceConfig
from streams.dlsn import DLSN, PositionKind, StartPosition
from streams.records import Compression
from streams.recordset import (
    HEADER_BYTES,
    decode_header,
    decode_read_records,
    encode_control,
    encode_record_set,
)
from streams.retention import _marks, retention_point

ints = st.integers(min_value=0, max_value=2**62)
dlsns = st.builds(DLSN, ints, ints, ints)


@given(dlsns)
def test_dlsn_bytes_and_str_round_trip(d: DLSN) -> None:
    assert DLSN.from_bytes(bytes(d)) == d
    assert DLSN.parse(str(d)) == d
    assert len(bytes(d)) == 24


@given(dlsns, dlsns)
def test_dlsn_order_matches_tuple_and_bytes_order(a: DLSN, b: DLSN) -> None:
    assert (a < b) == (
        (a.segment_seqno, a.entry_id, a.slot_id) < (b.segment_seqno, b.entry_id, b.slot_id)
    )
    assert (a < b) == (bytes(a) < bytes(b))  # non-negative DLSNs sort as bytes


def test_dlsn_bad_inputs() -> None:
    for text in ("1:2", "a:b:c", "1:2:3:4", ""):
        with pytest.raises(BadRequestError):
            DLSN.parse(text)
    with pytest.raises(BadRequestError):
        DLSN.from_bytes(b"\x00" * 23)


def test_start_position_coerce() -> None:
    assert StartPosition.coerce("earliest").kind is PositionKind.EARLIEST
    assert StartPosition.coerce("LATEST").kind is PositionKind.LATEST
    assert StartPosition.coerce(DLSN(3, 17, 0)).dlsn_value == DLSN(3, 17, 0)
    assert StartPosition.coerce("3:17:0").dlsn_value == DLSN(3, 17, 0)
    assert StartPosition.coerce(None).kind is PositionKind.EARLIEST
    with pytest.raises(BadRequestError):
        StartPosition.sequence(-1)


records_st = st.lists(
    st.tuples(
        st.binary(max_size=300),
        st.one_of(st.none(), st.binary(max_size=20)),
        st.one_of(
            st.none(),
            st.dictionaries(st.text(min_size=1, max_size=10), st.binary(max_size=20), max_size=3),
        ),
    ),
    min_size=1,
    max_size=40,
)


@settings(max_examples=150)
@given(records_st, st.sampled_from(list(Compression)), st.integers(0, 1000), st.integers(0, 10**6))
def test_record_set_round_trip(
    recs: list[tuple[bytes, bytes | None, dict[str, bytes] | None]],
    compression: Compression,
    first_index: int,
    base_txid: int,
) -> None:
    payloads = [p for p, _k, _h in recs]
    keys = [k for _p, k, _h in recs]
    headers = [h for _p, _k, h in recs]
    txids = [base_txid + i for i in range(len(recs))]
    stamps = [1_700_000_000_000 + i for i in range(len(recs))]
    data = encode_record_set(
        payloads, txids, stamps, first_index=first_index, bytes_before=7,
        last_txid=txids[-1], keys=keys, headers=headers, compression=compression,
    )  # fmt: skip
    header, out, eos = decode_read_records(data, "s", 4, 9, 100)
    assert not eos
    assert header.first_index == first_index
    assert header.user_count == len(recs)
    assert header.first_txid == txids[0]
    assert header.last_txid == txids[-1]
    assert [r.payload for r in out] == payloads
    assert [r.key for r in out] == keys
    assert [r.headers for r in out] == [None if h is None else list(h.items()) for h in headers]
    assert [r.txid for r in out] == txids
    assert [r.timestamp_ms for r in out] == stamps
    assert [r.dlsn for r in out] == [DLSN(4, 9, i) for i in range(len(recs))]
    assert [r.sequence_id for r in out] == [100 + first_index + i for i in range(len(recs))]
    # from_slot skips the first records but keeps their sequence ids counted
    _h, tail, _e = decode_read_records(data, "s", 4, 9, 100, from_slot=1)
    assert [r.sequence_id for r in tail] == [r.sequence_id for r in out[1:]]


def test_control_and_end_of_stream_are_never_returned() -> None:
    control = encode_control(first_index=5, bytes_before=50, last_txid=42, timestamp_ms=1)
    header, out, eos = decode_read_records(control, "s", 1, 3, 0)
    assert out == []
    assert not eos
    assert header.count == 1
    assert header.user_count == 0
    assert header.last_txid == 42
    assert header.first_index == 5
    end = encode_control(first_index=5, bytes_before=50, last_txid=42, timestamp_ms=1,
                         end_of_stream=True)  # fmt: skip
    _h, out, eos = decode_read_records(end, "s", 1, 4, 0)
    assert out == []
    assert eos


def test_compression_actually_compresses_and_falls_back() -> None:
    payloads = [b"a" * 1000] * 20
    args = dict(first_index=0, bytes_before=0, last_txid=19)
    plain = encode_record_set(payloads, list(range(20)), [0] * 20, **args)  # type: ignore[arg-type]
    for comp in (Compression.LZ4, Compression.ZSTD):
        packed = encode_record_set(payloads, list(range(20)), [0] * 20, compression=comp, **args)  # type: ignore[arg-type]
        assert len(packed) < len(plain) // 5
        assert decode_header(packed).compression is comp
    noise = [random.Random(1).randbytes(500)]
    packed = encode_record_set(noise, [0], [0], compression=Compression.ZSTD, **args)  # type: ignore[arg-type]
    assert decode_header(packed).compression is Compression.NONE


def test_corruption_is_detected_seeded() -> None:
    seed = random.randrange(2**32)
    print(f"corruption test seed={seed}")
    rng = random.Random(seed)
    for comp in Compression:
        payloads = [rng.randbytes(rng.randrange(0, 200)) for _ in range(30)]
        data = encode_record_set(payloads, list(range(30)), [5] * 30, first_index=0,
                                 bytes_before=0, last_txid=29, compression=comp)  # fmt: skip
        for _ in range(200):
            corrupt = bytearray(data)
            pos = rng.randrange(len(corrupt))
            corrupt[pos] ^= 1 << rng.randrange(8)
            with pytest.raises(BooklineError):
                decode_read_records(bytes(corrupt), "s", 1, 0, 0)
        for cut in (0, 10, HEADER_BYTES - 1, HEADER_BYTES, len(data) - 1):
            with pytest.raises(BooklineError):
                decode_read_records(data[:cut], "s", 1, 0, 0)


def test_flipped_bit_raises_checksum_error() -> None:
    data = bytearray(encode_record_set([b"x" * 10], [1], [1], first_index=0, bytes_before=0,
                                       last_txid=1))  # fmt: skip
    data[-1] ^= 0x01
    with pytest.raises(ChecksumError):
        decode_header(bytes(data))


def test_oversized_record_set_refused() -> None:
    with pytest.raises(TooLargeError):
        encode_record_set([b"x" * (17 << 20)], [0], [0], first_index=0, bytes_before=0,
                          last_txid=0)  # fmt: skip


def _seg(seqno: int, *, sealed: bool = True, size: int = 100, sealed_ms: int = 0,
         count: int = 10) -> SegmentMetadata:  # fmt: skip
    return SegmentMetadata(
        seqno=seqno, ledger_id=100 + seqno,
        state=SegmentState.SEALED if sealed else SegmentState.IN_PROGRESS,
        last_entry_id=4 if sealed else -1, last_slot_id=1 if sealed else -1,
        record_count=count if sealed else 0, size_bytes=size if sealed else 0,
        sealed_ms=sealed_ms, start_sequence_id=(seqno - 1) * count,
    )  # fmt: skip


END = DLSN(3, 5, 0)  # the stream's durable end in test_truncation_marks


def test_truncation_marks() -> None:
    segs = [(_seg(1), 0), (_seg(2), 3), (_seg(3, sealed=False), 1)]
    marks = dict((s.seqno, s) for s, _v in _marks(segs, DLSN(2, 2, 0), END))
    assert marks[1].truncation is TruncationState.TRUNCATED
    assert marks[2].truncation is TruncationState.PARTIALLY_TRUNCATED
    assert marks[2].min_active_dlsn == (2, 2, 0)
    assert 3 not in marks
    # a point past a sealed segment's end truncates it wholly
    marks = dict((s.seqno, s) for s, _v in _marks(segs, DLSN(2, 9, 0), END))
    assert marks[2].truncation is TruncationState.TRUNCATED
    # a point past the durable end is refused: it would hide later records
    with pytest.raises(InvariantViolation):
        _marks(segs, DLSN(3, 1_000_000, 0), END)


def test_retention_point_age_and_size() -> None:
    segs = [_seg(1, sealed_ms=100), _seg(2, sealed_ms=200), _seg(3, sealed_ms=300),
            _seg(4, sealed=False)]  # fmt: skip
    assert retention_point(segs, StreamOptions(retention_ms=1000), now_ms=1150) == DLSN(2, 0, 0)
    assert retention_point(segs, StreamOptions(retention_ms=1000), now_ms=5000) == DLSN(4, 0, 0)
    assert retention_point(segs, StreamOptions(retention_ms=1000), now_ms=500) is None
    assert retention_point(segs, StreamOptions(retention_bytes=150), now_ms=0) == DLSN(3, 0, 0)
    assert retention_point(segs, StreamOptions(retention_bytes=1000), now_ms=0) is None


def test_namespace_config_checks_quorums_with_the_shared_rule() -> None:
    with pytest.raises(ConfigError, match=r"core: quorums must satisfy .* got E=3 Qw=2 Qa=3"):
        NamespaceConfig(ensemble_size=3, write_quorum=2, ack_quorum=3)
    assert NamespaceConfig(ensemble_size=1, write_quorum=1, ack_quorum=1).ack_quorum == 1
