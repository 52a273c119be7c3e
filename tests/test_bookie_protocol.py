"""Pure tests of the bookie wire codec: round trips and decoder fuzzing."""

from __future__ import annotations

import struct

import crc32c
import msgpack
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bookie import protocol as p
from foundation.errors import (
    BadRequestError,
    FencedError,
    ProtocolVersionError,
    TooLargeError,
    UnknownError,
    for_code,
)

PROTOCOL_ERRORS = (BadRequestError, ProtocolVersionError, TooLargeError)
FRAME_MAX = 4096

u64 = st.integers(0, (1 << 64) - 1)
eid = st.integers(-1, (1 << 64) - 1)
key = st.binary(max_size=64)
payload = st.binary(max_size=512)

requests = st.one_of(
    st.builds(p.AddRequest, u64, u64, u64, eid, key, payload, st.booleans()),
    st.builds(p.ReadRequest, u64, u64, eid, st.booleans(), key),
    st.builds(p.ReadLacRequest, u64, u64, eid, st.integers(0, (1 << 32) - 1)),
    st.builds(
        p.ReadLacRequest, u64, u64, eid, st.integers(0, 1 << 31), st.integers(1, 1 << 31), key
    ),
    st.builds(p.InfoRequest, u64),
    st.builds(p.ListLedgersRequest, u64),
    st.builds(p.ListEntriesRequest, u64, u64, key),
    st.builds(p.AuthRequest, u64, st.text(max_size=p.TOKEN_CHARS_MAX)),
    st.builds(p.HelloRequest, u64, st.binary(min_size=16, max_size=64)),
    st.builds(p.WriteLacRequest, u64, u64, eid, key),
    st.builds(p.ListDamagedRequest, u64, u64, u64),
    st.builds(
        lambda rid, lid, first, n: p.EntryChecksumsRequest(rid, lid, first, first + n),
        u64,
        u64,
        st.integers(0, 1 << 62),
        st.integers(0, 1 << 20),
    ),
)
responses = st.one_of(
    st.builds(p.AddResponse, u64, u64, u64),
    st.builds(p.AuthResponse, u64, st.text(max_size=128)),
    st.builds(
        p.HelloResponse,
        u64,
        st.text(max_size=40),
        st.text(max_size=40),
        st.binary(min_size=32, max_size=32),
    ),
    st.builds(p.ReadResponse, u64, u64, u64, eid, payload),
    st.builds(p.ReadLacResponse, u64, u64, eid, st.none(), st.none()),
    st.builds(p.ReadLacResponse, u64, u64, eid, u64, payload),
    # The run form (LAC_ENTRIES): entries next_entry_id.. all at or below the LAC.
    st.builds(
        lambda rid, lid, first, run: p.ReadLacResponse(
            rid, lid, first + len(run) - 1, first, run[0], tuple(run[1:]), True
        ),
        u64,
        u64,
        st.integers(0, 1 << 40),
        st.lists(st.binary(max_size=64), min_size=1, max_size=8),
    ),
    st.builds(p.ReadLacResponse, u64, u64, eid, st.none(), st.none(), st.just(()), st.just(True)),
    st.builds(
        p.InfoResponse,
        u64,
        st.builds(
            p.BookieInfo,
            st.text(max_size=40),
            st.sampled_from(["writable", "read_only"]),
            st.floats(0.0, 1.0),
            st.integers(0, 1 << 50),
            st.integers(0, 1 << 50),
            st.lists(st.text(max_size=12), max_size=3).map(tuple),
        ),
    ),
    st.builds(p.WriteLacResponse, u64, u64, eid),
    st.builds(p.ListLedgersResponse, u64, st.lists(u64, max_size=50).map(tuple)),
    st.builds(p.ListEntriesResponse, u64, u64, st.lists(u64, max_size=50).map(tuple)),
    st.builds(p.ErrorResponse, u64, st.sampled_from(list(p.Op)), st.integers(1, 0xFFFF), st.text()),
    # LIST_DAMAGED: ascending pairs, then where the next page starts (after them) or nil.
    st.builds(
        lambda rid, pairs, more: p.ListDamagedResponse(
            rid,
            tuple(sorted(set(pairs))),
            (max(pairs)[0] + 1, 0) if more and pairs else None,
        ),
        u64,
        st.lists(st.tuples(st.integers(0, 1 << 40), u64), max_size=30),
        st.booleans(),
    ),
    # ENTRY_CHECKSUMS: ascending, disjoint ids (checksums and damaged) up to the last.
    st.builds(
        lambda rid, lid, ids, damaged_every, extra: p.EntryChecksumsResponse(
            rid,
            lid,
            max(ids, default=0) + extra,
            tuple(
                p.EntryChecksum(e, (e * 2654435761) & 0xFFFFFFFF, e % 5000)
                for e in sorted(ids)
                if e % damaged_every
            ),
            tuple(e for e in sorted(ids) if not e % damaged_every),
        ),
        u64,
        u64,
        st.sets(st.integers(0, 1 << 40), max_size=40),
        st.integers(2, 7),
        st.integers(0, 1000),
    ),
)


def decode_all(decoder: p.Decoder, data: bytes) -> list[p.Request | p.Response]:
    decoder.feed(data)
    out: list[p.Request | p.Response] = []
    while (frame := decoder.next_frame()) is not p.NEED_DATA:
        assert not isinstance(frame, p.NeedData)
        out.append(frame)
    return out


@given(st.lists(requests, max_size=20), st.integers(1, 64))
def test_requests_round_trip_in_any_chunking(reqs: list[p.Request], chunk: int) -> None:
    data = b"".join(p.encode_request(r) for r in reqs)
    decoder = p.Decoder(responses=False)
    got: list[p.Request | p.Response] = []
    for i in range(0, len(data), chunk):
        got += decode_all(decoder, data[i : i + chunk])
    assert got == reqs
    assert decoder.buffered_bytes == 0


@given(st.lists(responses, max_size=20))
def test_responses_round_trip(resps: list[p.Response]) -> None:
    data = b"".join(p.encode_response(r) for r in resps)
    assert decode_all(p.Decoder(responses=True), data) == resps


def test_error_response_rebuilds_the_error_class() -> None:
    frame = p.encode_error(7, p.Op.ADD, FencedError("ledger 3 is fenced"))
    (resp,) = decode_all(p.Decoder(responses=True), frame)
    assert isinstance(resp, p.ErrorResponse)
    err = resp.error()
    assert isinstance(err, FencedError)
    assert err.message == "ledger 3 is fenced"
    # An unknown code from a newer peer keeps its number.
    frame = p.encode_error(8, p.Op.READ, for_code(999, "new"))
    (resp,) = decode_all(p.Decoder(responses=True), frame)
    assert isinstance(resp, p.ErrorResponse)
    assert resp.code == 999
    assert isinstance(resp.error(), UnknownError)


def _frame(
    *,
    version: int = p.PROTOCOL_VERSION,
    op: int = p.Op.INFO,
    kind: int = 0,
    flags: int = 0,
    status: int = 0,
    rid: int = 1,
    meta: bytes = b"\x90",
    payload: bytes = b"",
    body_len: int | None = None,
    meta_len: int | None = None,
    magic: bytes = p.MAGIC,
) -> bytes:
    body = meta + payload
    header = struct.pack(
        ">2sBBBBHIIQ",
        magic,
        version,
        op,
        kind,
        flags,
        status,
        len(body) if body_len is None else body_len,
        len(meta) if meta_len is None else meta_len,
        rid,
    )
    crc = crc32c.crc32c(body, crc32c.crc32c(header))
    return header + struct.pack(">I", crc) + body


def test_wrong_version_is_refused_and_sticky() -> None:
    d = p.Decoder(responses=False)
    with pytest.raises(ProtocolVersionError):
        decode_all(d, _frame(version=1))  # version 1 frames carried no read keys
    with pytest.raises(ProtocolVersionError):  # the stream stays failed
        d.next_frame()


def test_oversized_frame_refused_from_the_header_alone() -> None:
    d = p.Decoder(responses=False, frame_bytes_max=FRAME_MAX)
    header_only = _frame(body_len=FRAME_MAX + 1)[: p.HEADER_BYTES]
    with pytest.raises(TooLargeError):
        decode_all(d, header_only)  # refused before a single body byte is buffered


def test_bad_crc_closes_the_stream() -> None:
    frame = bytearray(_frame())
    frame[-1] ^= 0xFF
    with pytest.raises(BadRequestError) as info:
        decode_all(p.Decoder(responses=False), bytes(frame))
    assert not isinstance(info.value, p.FrameBodyError)


def test_malformed_meta_keeps_the_stream_in_sync() -> None:
    bad = _frame(op=p.Op.ADD, rid=41, meta=msgpack.packb(["not", "ids"]))
    good = p.encode_request(p.InfoRequest(42))
    d = p.Decoder(responses=False)
    d.feed(bad + good)
    with pytest.raises(p.FrameBodyError) as info:
        d.next_frame()
    assert info.value.request_id == 41
    assert info.value.op == p.Op.ADD
    assert d.next_frame() == p.InfoRequest(42)


@pytest.mark.parametrize(
    ("kwargs", "body_error"),
    [
        ({"magic": b"XX"}, False),
        ({"op": 99}, False),
        ({"kind": 1}, False),  # a response sent to a server
        ({"flags": 0x80}, False),
        ({"status": 5}, False),
        ({"meta_len": 5, "meta": b"\x90"}, False),
        ({"meta": b"\xc1"}, True),  # never-used msgpack byte
        ({"meta": b"\x92"}, True),  # truncated array
        ({"meta": b"\x91\x01"}, True),  # INFO takes no fields
        ({"op": p.Op.READ, "flags": p.FLAG_RECOVERY, "meta": msgpack.packb([1, 1, b""])}, True),
        ({"op": p.Op.READ_LAC, "meta": msgpack.packb([1, -2, 10])}, True),
        ({"op": p.Op.READ, "meta": msgpack.packb([1, 1, b"k" * 300])}, True),
        ({"payload": b"stray"}, True),
    ],
)
def test_malformed_frames(kwargs: dict[str, object], body_error: bool) -> None:
    with pytest.raises(BadRequestError) as info:
        decode_all(p.Decoder(responses=False), _frame(**kwargs))  # type: ignore[arg-type]
    assert isinstance(info.value, p.FrameBodyError) is body_error


def _check_decoder_survives(data: bytes, frame_max: int) -> None:
    """Any outcome but a documented protocol error (or a crash) fails the test; the
    buffer never holds more than one maximal frame plus what was fed at once."""
    d = p.Decoder(responses=False, frame_bytes_max=frame_max)
    for i in range(0, len(data), 97):
        try:
            decode_all(d, data[i : i + 97])
        except p.FrameBodyError:
            continue  # recoverable: keep feeding
        except PROTOCOL_ERRORS:
            return
        assert d.buffered_bytes <= p.HEADER_BYTES + frame_max + 97


@settings(max_examples=500, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=2048))
def test_garbage_never_crashes_the_decoder(data: bytes) -> None:
    _check_decoder_survives(data, FRAME_MAX)


@settings(max_examples=500, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=64))
def test_garbage_after_valid_magic_and_version(data: bytes) -> None:
    _check_decoder_survives(p.MAGIC + bytes([p.PROTOCOL_VERSION]) + data, FRAME_MAX)


@settings(max_examples=300)
@given(requests, st.data())
def test_mutated_valid_frames(req: p.Request, data: st.DataObject) -> None:
    frame = bytearray(p.encode_request(req))
    n = data.draw(st.integers(1, 4))
    for _ in range(n):
        pos = data.draw(st.integers(0, len(frame) - 1))
        frame[pos] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(frame)))
    _check_decoder_survives(bytes(frame[:cut]), FRAME_MAX)


@settings(max_examples=200)
@given(
    op=st.sampled_from(list(p.Op)),
    flags=st.integers(0, 3),
    meta=st.recursive(
        st.none()
        | st.booleans()
        | st.integers(-(2**63), 2**64 - 1)
        | st.binary(max_size=8)
        | st.text(max_size=8)
        | st.floats(),
        lambda kids: st.lists(kids, max_size=5),
        max_leaves=12,
    ),
    payload=st.binary(max_size=16),
)
def test_valid_frames_with_arbitrary_meta(
    op: p.Op, flags: int, meta: object, payload: bytes
) -> None:
    frame = _frame(op=op, flags=flags, meta=msgpack.packb(meta), payload=payload)
    d = p.Decoder(responses=False)
    try:
        (req,) = decode_all(d, frame)
    except p.FrameBodyError:
        return
    # Anything accepted re-encodes to the very same bytes' meaning.
    assert decode_all(p.Decoder(responses=False), p.encode_request(req)) == [req]  # type: ignore[arg-type]


def test_truncated_frames_wait_for_more_data() -> None:
    frame = p.encode_request(p.AddRequest(1, 2, 3, 2, b"key", b"x" * 100))
    d = p.Decoder(responses=False)
    for i in range(len(frame) - 1):
        d.feed(frame[i : i + 1])
        assert d.next_frame() is p.NEED_DATA
    d.feed(frame[-1:])
    assert isinstance(d.next_frame(), p.AddRequest)


def test_info_without_features_decodes_as_an_old_bookie() -> None:
    """Old bookies send INFO without "features": clients read that as no optional ops
    (and so never send them WRITE_LAC, which they would answer by closing)."""
    fields = {"bookie_id": "b", "state": "writable", "used_fraction": 0.5,
              "free_bytes": 1, "total_bytes": 2}  # fmt: skip
    frame = p._frame(int(p.Op.INFO), p.KIND_RESPONSE, 0, 0, 9, msgpack.packb(fields), b"")
    (resp,) = decode_all(p.Decoder(responses=True), frame)
    assert isinstance(resp, p.InfoResponse)
    assert resp.info.features == ()


@given(st.lists(responses, max_size=20), st.integers(1, 64))
def test_add_ack_fast_path_matches_next_frame(resps: list[p.Response], chunk: int) -> None:
    data = b"".join(p.encode_response(r) for r in resps)
    d = p.Decoder(responses=True)
    got: list[object] = []
    for i in range(0, len(data), chunk):
        d.feed(data[i : i + chunk])
        while (frame := d.next_frame_or_add_ack()) is not p.NEED_DATA:
            got.append(frame)
    want = [r.request_id if type(r) is p.AddResponse else r for r in resps]
    assert got == want


def test_add_ack_fast_path_still_checks_crc_and_size() -> None:
    ack = bytearray(p.encode_add_response(7, 1, 2))
    ack[-1] ^= 0xFF
    d = p.Decoder(responses=True)
    d.feed(bytes(ack))
    with pytest.raises(BadRequestError) as info:
        d.next_frame_or_add_ack()
    assert not isinstance(info.value, p.FrameBodyError)
    with pytest.raises(BadRequestError):  # the stream stays failed
        d.next_frame_or_add_ack()
    big = _frame(op=p.Op.ADD, kind=1, body_len=FRAME_MAX + 1)[: p.HEADER_BYTES]
    d = p.Decoder(responses=True, frame_bytes_max=FRAME_MAX)
    d.feed(big)
    with pytest.raises(TooLargeError):
        d.next_frame_or_add_ack()


def _lac_run_frame(meta: list[object], payload: bytes) -> bytes:
    packed: bytes = msgpack.packb(meta)
    body = packed + payload
    header = struct.pack(
        ">2sBBBBHIIQ", p.MAGIC, p.PROTOCOL_VERSION, int(p.Op.READ_LAC), p.KIND_RESPONSE, 0, 0,
        len(body), len(packed), 7,
    )  # fmt: skip
    return header + struct.pack(">I", crc32c.crc32c(body, crc32c.crc32c(header))) + body


@pytest.mark.parametrize(
    ("meta", "payload"),
    [
        ([1, 5, 4, [2, 2]], b"abc"),  # lengths do not add up
        ([1, 5, 4, [2, 2, 2]], b"aabbcc"),  # entry 6 is past the LAC 5
        ([1, 5, None, [2]], b"aa"),  # entries without a first id
        ([1, 5, 4, []], b""),  # a first id without entries
        ([1, 5, 4, [-1]], b""),  # negative length
        ([1, 5, 4, "xx"], b"xx"),  # not a list
    ],
)
def test_malformed_lac_runs_are_refused(meta: list[object], payload: bytes) -> None:
    decoder = p.Decoder(responses=True)
    decoder.feed(_lac_run_frame(meta, payload))
    with pytest.raises(BadRequestError):
        decoder.next_frame()


def test_lac_run_needs_the_run_form() -> None:
    with pytest.raises(ValueError, match="run form"):
        p.encode_response(p.ReadLacResponse(1, 1, 5, 4, b"a", (b"b",)))


# -- replica check (LIST_DAMAGED, ENTRY_CHECKSUMS) --------------------------------------


def _response_frame(op: p.Op, meta: object, payload: bytes = b"") -> bytes:
    return _frame(op=op, kind=p.KIND_RESPONSE, rid=7, meta=msgpack.packb(meta), payload=payload)


@pytest.mark.parametrize(
    "meta",
    [
        [[], None, 3],  # a field too many
        [[[1, 2], [1, 2]], None],  # a pair twice
        [[[2, 0], [1, 5]], None],  # not ascending
        [[[1, -1]], None],  # a negative entry id
        [[[1, 2]], [1, 2]],  # the next page starts inside this one
        [[[1, 2]], [1]],  # next is not a pair
        [[[1, 2, 3]], None],  # not a pair
        [[[1, 2]] * (p.DAMAGED_PAGE_ENTRIES_MAX + 1), None],  # more than a page
        ["xx", None],
    ],
)
def test_malformed_list_damaged_answers_are_refused(meta: object) -> None:
    with pytest.raises(p.FrameBodyError):
        decode_all(p.Decoder(responses=True), _response_frame(p.Op.LIST_DAMAGED, meta))


@pytest.mark.parametrize(
    "meta",
    [
        [1, 10, [[2, 5, 5], [1, 5, 5]], []],  # not ascending
        [1, 10, [[2, 5, 5]], [2]],  # an entry both intact and damaged
        [1, 10, [[11, 5, 5]], []],  # past last_entry_id
        [1, 10, [], [11]],  # damaged past last_entry_id
        [1, 10, [[2, 1 << 32, 5]], []],  # crc wider than 32 bits
        [1, 10, [[2, 5, -1]], []],  # negative length
        [1, 10, [[2, 5]], []],  # not a triple
        [1, 10, [[2, 5, 5]]],  # damaged list missing
        [1, -1, [], []],  # no last entry
        [1, 1 << 40, [[e, 0, 0] for e in range(p.CHECKSUM_RANGE_ENTRIES_MAX + 1)], []],
    ],
)
def test_malformed_entry_checksum_answers_are_refused(meta: object) -> None:
    with pytest.raises(p.FrameBodyError):
        decode_all(p.Decoder(responses=True), _response_frame(p.Op.ENTRY_CHECKSUMS, meta))


@pytest.mark.parametrize(
    ("op", "meta"),
    [
        (p.Op.ENTRY_CHECKSUMS, [1, 5, 4]),  # first after last
        (p.Op.ENTRY_CHECKSUMS, [1, -1, 4]),
        (p.Op.ENTRY_CHECKSUMS, [1, 2]),
        (p.Op.LIST_DAMAGED, [1]),
        (p.Op.LIST_DAMAGED, [1, -1]),
        (p.Op.LIST_DAMAGED, ["a", 0]),
    ],
)
def test_malformed_replica_check_requests_keep_the_stream(op: p.Op, meta: object) -> None:
    good = p.encode_request(p.ListDamagedRequest(9, 0, 0))
    d = p.Decoder(responses=False)
    d.feed(_frame(op=op, rid=8, meta=msgpack.packb(meta)) + good)
    with pytest.raises(p.FrameBodyError) as info:
        d.next_frame()
    assert info.value.request_id == 8
    assert info.value.op == op
    assert d.next_frame() == p.ListDamagedRequest(9, 0, 0)


@settings(max_examples=200)
@given(responses, st.data())
def test_truncated_or_mutated_answers_are_rejected_cleanly(
    resp: p.Response, data: st.DataObject
) -> None:
    """A client decoder fed a cut or damaged answer (new ops included) waits for more
    data or raises a protocol error; it never crashes or returns a bogus frame."""
    frame = bytearray(p.encode_response(resp))
    for _ in range(data.draw(st.integers(0, 3))):
        frame[data.draw(st.integers(0, len(frame) - 1))] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(frame)))
    d = p.Decoder(responses=True, frame_bytes_max=FRAME_MAX)
    try:
        got = decode_all(d, bytes(frame[:cut]))
    except PROTOCOL_ERRORS:
        return
    if cut < len(frame):
        assert got == []  # a cut frame is never decoded early
    elif got:
        assert decode_all(p.Decoder(responses=True), p.encode_response(got[0])) == got  # type: ignore[arg-type]
