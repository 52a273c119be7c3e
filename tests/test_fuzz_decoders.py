"""Property-based fuzzing of every decoder of untrusted bytes (issue 15, scope item 9).

Each decoder, fed anything, either returns or raises one of the documented
:class:`~foundation.errors.BooklineError` subclasses (BadRequestError, ChecksumError,
ProtocolVersionError, TooLargeError...): never an IndexError, struct.error, TypeError,
RecursionError or a hang, and never holds more than its declared limit. Inputs are
random bytes *and* well-framed inputs whose checksums are recomputed over fuzzed
contents, so the code behind each checksum is reached too. Examples are bounded
(``max_examples``) to keep the default suite fast; ``tests/fuzz/`` drives the same
targets with atheris for long runs (docs/security.md, "Hostile input").
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import crc32c
import msgpack
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from bookie import protocol as p
from bookie.protocol import frames
from bookie.storage import entrylog_format, index, journal_format
from foundation.errors import BooklineError, ChecksumError
from groups import log as group_log
from groups import wire as group_wire
from httpapi import positions, recordsets, topics, wire, writes
from metadata import serde
from streams import recordset, recordset_layout
from streams.records import Compression
from tests.waiting import scaled
from thinclient.reads import decode_sets

# BOOKLINE_FUZZ_EXAMPLES=5000 for a longer hunt without atheris.
FUZZ = settings(
    max_examples=int(os.environ.get("BOOKLINE_FUZZ_EXAMPLES", "200")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
# One call on a small input taking this long is a hang in all but name.
CALL_SECONDS_MAX = 2.0

# msgpack/JSON-like values, nested a little: what a hostile body or meta may hold.
scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=True)
    | st.text(max_size=24)
    | st.binary(max_size=24)
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=8), inner, max_size=6)
    ),
    max_leaves=24,
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.text(max_size=24),
    lambda inner: (
        st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=8), inner, max_size=6)
    ),
    max_leaves=24,
)


def only_documented(call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run a decoder: its result, or None when it refused the input with a documented
    error; anything else fails the test (and so does a call slower than a hang bound)."""
    started = time.monotonic()
    try:
        return call(*args, **kwargs)
    except BooklineError:
        return None
    finally:
        assert time.monotonic() - started < scaled(CALL_SECONDS_MAX), "decoder took too long"


# -- bookie frames -----------------------------------------------------------------------


def drain(decoder: p.Decoder, data: bytes, chunk: int) -> None:
    """Feed ``data`` in ``chunk``-byte reads and take every frame, as a connection does;
    the buffer never passes the decoder's bound."""
    for i in range(0, len(data), chunk):
        decoder.feed(data[i : i + chunk])
        assert decoder.buffered_bytes <= decoder.buffered_bytes_max
        while True:
            try:
                if decoder.next_frame() is p.NEED_DATA:
                    break
            except frames.FrameBodyError:
                continue  # answered BAD_REQUEST; the stream goes on


@FUZZ
@given(data=st.binary(max_size=4096), chunk=st.integers(1, 600), responses=st.booleans())
def test_frame_decoder_on_random_bytes(data: bytes, chunk: int, responses: bool) -> None:
    decoder = p.Decoder(responses=responses, frame_bytes_max=2048)
    only_documented(drain, decoder, data, chunk)


@FUZZ
@given(
    op=st.sampled_from(sorted(frames.OPS)),
    flags=st.sampled_from([0, frames.FLAG_RECOVERY, frames.FLAG_FENCE, frames.FLAGS_KNOWN]),
    status=st.integers(0, 0xFFFF),
    rid=st.integers(0, 2**64 - 1),
    meta=values,
    payload=st.binary(max_size=64),
    responses=st.booleans(),
)
def test_frame_decoder_on_framed_hostile_meta(  # noqa: PLR0917 - hypothesis arguments
    op: int, flags: int, status: int, rid: int, meta: Any, payload: bytes, responses: bool
) -> None:
    """Good magic, version, lengths and CRC around any msgpack meta: the op table's
    decoding answers BAD_REQUEST (FrameBodyError) or decodes, nothing else."""
    kind = frames.KIND_RESPONSE if responses else frames.KIND_REQUEST
    packed = msgpack.packb(meta, use_bin_type=True)
    frame = frames.encode_frame(op, kind, flags, status if responses else 0, rid, packed, payload)
    decoder = p.Decoder(responses=responses)
    decoder.feed(frame)
    only_documented(decoder.next_frame)


@FUZZ
@given(meta=st.binary(max_size=200), op=st.sampled_from(sorted(frames.OPS)))
def test_frame_decoder_on_framed_random_meta(meta: bytes, op: int) -> None:
    frame = frames.encode_frame(op, frames.KIND_REQUEST, 0, 0, 7, meta, b"")
    decoder = p.Decoder(responses=False)
    decoder.feed(frame)
    only_documented(decoder.next_frame)


def test_frame_decoder_refuses_to_buffer_past_its_bound() -> None:
    decoder = p.Decoder(responses=False, frame_bytes_max=1024)
    header = frames.HEADER.pack(frames.MAGIC, frames.PROTOCOL_VERSION, frames.OP_ADD,
                                frames.KIND_REQUEST, 0, 0, 1000, 10, 1)  # fmt: skip
    decoder.feed(header + b"\0\0\0\0")
    assert decoder.next_frame() is p.NEED_DATA
    with pytest.raises(BooklineError):
        decoder.feed(b"\0" * (decoder.buffered_bytes_max + 1))
    assert decoder.buffered_bytes == 0  # failed and dropped what it held


# -- record sets (streams) and their framing through a read proxy ------------------------


def seal_record_set(fields: tuple[int, ...], body: bytes) -> bytes:
    """A record set whose header says ``fields`` and whose CRC is right."""
    head = recordset_layout.HEADER.pack(*fields)
    crc = crc32c.crc32c(body, crc32c.crc32c(head))
    return head + recordset_layout.CRC.pack(crc) + body


record_set_headers = st.tuples(
    st.just(recordset.RECORD_SET_VERSION),
    st.integers(0, 3),  # flags: compression bits and beyond
    st.integers(0, 2**32 - 1),  # count
    st.integers(0, 2**32 - 1),  # user count
    st.integers(0, 2**32 - 1),  # first index
    st.integers(-(2**63), 2**63 - 1),
    st.integers(-(2**63), 2**63 - 1),
    st.integers(-(2**63), 2**63 - 1),  # base timestamp
    st.integers(0, 2**32 - 1),
)


@FUZZ
@given(data=st.binary(max_size=2048))
def test_record_set_decoder_on_random_bytes(data: bytes) -> None:
    only_documented(recordset.decode_read_records, data, "s", 1, 0, 0)


@FUZZ
@given(head=record_set_headers, body=st.binary(max_size=512), raw_len=st.integers(0, 1 << 24))
def test_record_set_decoder_on_sealed_hostile_sets(
    head: tuple[int, ...], body: bytes, raw_len: int
) -> None:
    data = seal_record_set((*head, len(body), raw_len), body)
    only_documented(recordset.decode_read_records, data, "s", 1, 0, 0)


@FUZZ
@given(
    payloads=st.lists(st.binary(max_size=40), min_size=1, max_size=5),
    with_extras=st.booleans(),
    flip=st.integers(0, 10_000),
    compression=st.sampled_from(list(Compression)),
)
def test_record_set_decoder_on_flipped_bodies(
    payloads: list[bytes], with_extras: bool, flip: int, compression: Compression
) -> None:
    """A real set with one byte of its stored body changed and its CRC recomputed: the
    body's own framing must catch what the checksum no longer does."""
    n = len(payloads)
    data = bytearray(
        recordset.encode_record_set(
            payloads, [1] * n, [1000] * n, first_index=0, bytes_before=0, last_txid=1,
            keys=[b"k"] * n if with_extras else None,
            headers=[{"h": b"v"}] * n if with_extras else None,
            compression=compression,
        )
    )  # fmt: skip
    pos = recordset.HEADER_BYTES + flip % (len(data) - recordset.HEADER_BYTES)
    data[pos] ^= 0xFF
    fields = recordset_layout.HEADER.unpack_from(data, 0)
    resealed = seal_record_set(fields, bytes(data[recordset.HEADER_BYTES :]))
    only_documented(recordset.decode_read_records, resealed, "s", 1, 0, 0)


@FUZZ
@given(data=st.binary(max_size=1024))
def test_recordsets_framing_on_random_bytes(data: bytes) -> None:
    only_documented(recordsets.decode, data)
    only_documented(decode_sets, "s", data)


@FUZZ
@given(count=st.integers(0, 2**32 - 1), next_seq=st.integers(-(2**63), 2**63 - 1),
       body=st.binary(max_size=512))  # fmt: skip
def test_recordsets_framing_on_sealed_hostile_bodies(
    count: int, next_seq: int, body: bytes
) -> None:
    head = recordsets._HEAD.pack(recordsets.MAGIC, recordsets.RECORDSETS_VERSION, count, next_seq)
    data = head + recordsets._CRC.pack(crc32c.crc32c(body, crc32c.crc32c(head))) + body
    only_documented(recordsets.decode, data)
    only_documented(decode_sets, "s", data)


# -- storage: journal, entry log, index -------------------------------------------------


@FUZZ
@given(data=st.binary(max_size=2048), legacy=st.booleans(), start=st.integers(0, 64))
def test_journal_scan_on_random_bytes(data: bytes, legacy: bool, start: int) -> None:
    only_documented(journal_format.scan, data, min(start, len(data)), len(data),
                    name="fuzz", last=True, legacy=legacy)  # fmt: skip
    only_documented(journal_format.scan, data, min(start, len(data)), len(data),
                    name="fuzz", last=False, legacy=legacy)  # fmt: skip
    only_documented(journal_format.decode_file_header, data)
    only_documented(journal_format.decode_mark, data)


@FUZZ
@given(
    tail=st.tuples(
        st.integers(0, 2**32 - 1), st.integers(0, 255), st.integers(0, 255),
        st.integers(0, 2**64 - 1), st.integers(-(2**63), 2**63 - 1),
        st.integers(-(2**63), 2**63 - 1), st.integers(0, 2**32 - 1), st.integers(0, 2**32 - 1),
    ),
    data=st.binary(max_size=128),
    prefix=st.binary(max_size=64),
)  # fmt: skip
def test_journal_records_with_sound_header_crc(
    tail: tuple[int, ...], data: bytes, prefix: bytes
) -> None:
    """Header checksum right, every field hostile (lengths, types, group offsets)."""
    packed = journal_format._TAIL.pack(*tail)
    record = journal_format._U32.pack(crc32c.crc32c(packed)) + packed + data
    image = prefix + record + b"\0" * 16
    only_documented(journal_format.scan, image, len(prefix), len(image), name="fuzz", last=True)
    only_documented(journal_format.read_at, image, len(prefix), len(image))


def test_entry_log_run_cut_inside_a_record_header_is_damage() -> None:
    """Found by the fuzzer: a run whose last bytes are less than a length field raised
    struct.error out of the read path instead of ChecksumError (which makes the read
    fall back to one record at a time and name the damaged entry)."""
    run = bytearray()
    entrylog_format.encode_into(run, 1, 0, b"payload")
    for tail in (b"\0", b"\0" * 7):
        with pytest.raises(ChecksumError):
            list(entrylog_format.split_records(bytes(run) + tail))


@FUZZ
@given(data=st.binary(max_size=1024))
@example(data=b"\0")
def test_entry_log_records_on_random_bytes(data: bytes) -> None:
    only_documented(entrylog_format.decode_record, data)
    only_documented(entrylog_format.decode_expected, data, 1, 2)
    only_documented(lambda: list(entrylog_format.split_records(data)))


@FUZZ
@given(length=st.integers(0, 2**32 - 1), version=st.integers(0, 255),
       ids=st.tuples(st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1)),
       payload=st.binary(max_size=64), trailer=st.binary(max_size=32))  # fmt: skip
def test_entry_log_records_with_sound_crc(
    length: int, version: int, ids: tuple[int, int], payload: bytes, trailer: bytes
) -> None:
    tail = entrylog_format.RECORD_TAIL.pack(length, version, *ids) + payload
    record = entrylog_format.CRC.pack(crc32c.crc32c(tail)) + tail
    only_documented(entrylog_format.decode_record, record)
    only_documented(lambda: list(entrylog_format.split_records(record + trailer)))


@FUZZ
@given(data=st.binary(max_size=128))
def test_index_rows_on_random_bytes(data: bytes) -> None:
    only_documented(index.decode_damage, data)
    only_documented(index.decode_state, data)


# -- metadata and the group log ------------------------------------------------------------


@FUZZ
@given(data=st.binary(max_size=512))
def test_metadata_serde_on_random_bytes(data: bytes) -> None:
    only_documented(serde.decode, data, "ledger", 3)


@FUZZ
@given(kind=st.text(max_size=10) | st.just("ledger"), version=values, body=values)
def test_metadata_serde_on_hostile_objects(kind: str, version: Any, body: Any) -> None:
    data = msgpack.packb([serde.MAGIC, kind, version, body], use_bin_type=True)
    only_documented(serde.decode, data, "ledger", 3)


def test_group_log_record_with_a_map_as_a_map_key_is_checksum_error() -> None:
    """Found by the atheris harness (target group-log-sealed): a body whose map has a
    map as a key made msgpack raise TypeError (unhashable dict) out of decode."""
    body = b"\x87" * 15 + b"\x80\x80"
    head = group_log._HEADER.pack(group_log.MAGIC, group_log.FORMAT, crc32c.crc32c(body))
    with pytest.raises(ChecksumError, match="undecodable"):
        group_log.decode(head + body)


@FUZZ
@given(body=values | st.binary(max_size=64))
@example(body=b"\x87" * 15 + b"\x80\x80")
def test_group_log_on_sealed_hostile_records(body: Any) -> None:
    packed = body if isinstance(body, bytes) else msgpack.packb(body, use_bin_type=True)
    head = group_log._HEADER.pack(group_log.MAGIC, group_log.FORMAT, crc32c.crc32c(packed))
    only_documented(group_log.decode, head + packed)
    only_documented(group_log.decode, packed)


# -- HTTP bodies (and WebSocket frames, which carry the same bodies) --------------------


@FUZZ
@given(data=st.binary(max_size=1024), media=st.sampled_from([None, wire.JSON, wire.MSGPACK]))
def test_http_bodies_on_random_bytes(data: bytes, media: str | None) -> None:
    only_documented(wire.decode_body, data, media)


@FUZZ
@given(obj=values)
@example(obj={"records": [{"payload": "x", "headers": {"a": 1}}]})
@example(obj={"payloads": ["x"], "keys": [1]})
def test_http_request_parsers_on_hostile_objects(obj: Any) -> None:
    """Every parser of a request body, on any decoded object: a JSON or msgpack body
    may hold any of these shapes."""
    body = only_documented(wire.decode_body, msgpack.packb(obj, use_bin_type=True), wire.MSGPACK)
    if body is None:
        return
    only_documented(writes.parse_write, body, records_max=100)
    only_documented(topics.parse_create, body)
    only_documented(topics.parse_alter, body)
    for parse in (group_wire.parse_join, group_wire.parse_heartbeat, group_wire.parse_commit,
                  group_wire.parse_leave, group_wire.parse_reset):  # fmt: skip
        only_documented(parse, body)
    only_documented(wire.decode_error, body, 500)
    only_documented(writes.decode_runs, body.get("runs"))
    only_documented(writes.decode_offset_runs, body.get("offset_runs"))


@FUZZ
@given(obj=json_values)
def test_json_bodies_round_trip_through_the_parsers(obj: Any) -> None:
    import json

    body = only_documented(wire.decode_body, json.dumps(obj).encode(), wire.JSON)
    if body is not None:
        only_documented(writes.parse_write, body, records_max=100)


@FUZZ
@given(text=st.text(max_size=64))
@example(text="1:2:" + "9" * 5000)
def test_positions_on_hostile_text(text: str) -> None:
    only_documented(positions.parse_dlsn, text)
    only_documented(positions.parse_position, text)
    only_documented(topics.parse_partition, text)
