"""Pure parts of the proxies: the HTTP body codec, positions, DLSN runs, error bodies,
the de-duplication table (and its rebuild from the log), admission limits, OpenAPI."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import given
from hypothesis import strategies as st

from foundation.errors import (
    BadRequestError,
    ConfigError,
    OutcomeUnknownError,
    OwnerMovedError,
    ProducerFencedError,
    TooManyRequestsError,
    UnknownError,
)
from foundation.limits import RECORD_BYTES_MAX, record_bytes
from httpapi import positions, wire, writes
from httpapi.openapi import build_document
from httpapi.views import record_from_view, record_view
from serving.write import dedup
from serving.write.limits import InflightLimiter
from streams.dlsn import DLSN, DLSNSequence
from streams.records import ReadRecord
from thinclient.client import ClientConfig
from writeproxy.config import WriteProxyConfig


def test_negotiate_prefers_msgpack_only_when_asked() -> None:
    assert wire.negotiate(None) == wire.JSON
    assert wire.negotiate("*/*") == wire.JSON
    assert wire.negotiate("application/msgpack") == wire.MSGPACK
    assert wire.negotiate("application/json;q=0.5, application/x-msgpack") == wire.MSGPACK
    assert wire.negotiate("application/msgpack;q=0.1, application/json") == wire.JSON


def test_json_and_msgpack_bodies_carry_the_same_write() -> None:
    recs = [
        writes.WireRecord(b"a"),
        writes.WireRecord(b"\xff\x00", key=b"k", headers=[("h", b"v")], txid=7),
    ]
    body = writes.write_body(recs, "p1", 10, 3)
    for media in (wire.JSON, wire.MSGPACK):
        raw = wire.encode_body(body, media)
        req = writes.parse_write(wire.decode_body(raw, media), records_max=10)
        assert req.producer == "p1"
        assert req.seq == 10
        assert req.epoch == 3
        assert req.records == recs


def test_crc_mismatch_is_a_bad_request() -> None:
    body = writes.write_body([writes.WireRecord(b"abc")], None, None)
    body["crc"] ^= 1
    with pytest.raises(BadRequestError, match="checksum"):
        writes.parse_write(body, records_max=10)


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"payloads": "x"},
        {"payloads": [1]},
        {"payloads": []},
        {"records": [{"key": "k"}]},
        {"payload": "x", "producer": "p"},
        {"payload": "x", "producer": "", "seq": 1},
        {"payload": "x", "seq": -1},
        {"payload": "x", "epoch": 1},
        {"payload": "x", "producer": "p", "seq": 0, "epoch": 1 << 31},
        {"payload_b64": "!!"},
        {"records": [{"payload": "x", "headers": {"bl.x": "y"}}]},
    ],
)
def test_malformed_writes_are_bad_requests(body: dict[str, Any]) -> None:
    with pytest.raises(BadRequestError):
        writes.parse_write(body, records_max=10)


def test_too_many_records_in_one_request() -> None:
    with pytest.raises(BadRequestError, match="at most 2"):
        writes.parse_write({"payloads": ["a", "b", "c"]}, records_max=2)


@pytest.mark.parametrize(
    ("raw", "media"),
    [(b"{", None), (b"[1]", None), (b"\xc1", wire.MSGPACK), (b"\x92\x01", wire.MSGPACK)],
)
def test_decode_body_rejects_garbage(raw: bytes, media: str | None) -> None:
    with pytest.raises(BadRequestError):
        wire.decode_body(raw, media)


@given(st.lists(st.tuples(st.integers(1, 3), st.integers(0, 5), st.integers(0, 5)), max_size=50))
def test_runs_round_trip(dlsns: list[tuple[int, int, int]]) -> None:
    assert writes.decode_runs(writes.encode_runs(dlsns)) == dlsns


def test_the_table_remembers_a_writers_answer_as_it_is() -> None:
    """Issue 23: a batch's DLSNs stay the writer's runs (copying them made a DLSN per
    record on every write); retries are answered from them all the same."""
    table = dedup.DedupTable(batches_per_producer=4, producers_max=10)
    dlsns = DLSNSequence([(1, 0, 0, 600), (1, 1, 0, 400)])
    table.record("p", 0, 0, dlsns, range(1000))
    state = table.state("p")
    assert state is not None and state.batches[-1][2] is dlsns
    plan = table.plan("p", 0, 598, 4)  # across the two entries
    assert plan.duplicates == [DLSN(1, 0, 598), DLSN(1, 0, 599), DLSN(1, 1, 0), DLSN(1, 1, 1)]
    assert (plan.offsets, plan.write_from) == ([598, 599, 600, 601], 4)
    assert table.plan("p", 0, 999, 1).duplicates == [DLSN(1, 1, 399)]


def test_contiguous_batch_is_few_runs() -> None:
    dlsns = [(2, 5, i) for i in range(600)] + [(2, 6, i) for i in range(400)]
    assert writes.encode_runs(dlsns) == [[2, 5, 0, 600], [2, 6, 0, 400]]


@given(
    st.lists(st.tuples(st.integers(1, 2), st.integers(0, 2), st.integers(0, 3), st.integers(0, 4))),
    st.lists(st.integers(0, 6), max_size=20),
    st.booleans(),
)
def test_a_writers_answer_encodes_from_its_runs(
    runs: list[tuple[int, int, int, int]], offsets: list[int], consecutive: bool
) -> None:
    """The write proxy answers from the writer's runs and offsets as they are (issue
    23): the same runs as record by record, and DLSNs decoded without a Python call each."""
    dlsns = DLSNSequence(runs)
    assert writes.encode_runs(dlsns) == writes.encode_runs(list(dlsns))
    decoded = writes.decode_runs(writes.encode_runs(dlsns))
    assert decoded == list(dlsns) and all(type(d) is DLSN for d in decoded)
    if consecutive:
        offsets = list(range(offsets[0], offsets[0] + len(offsets))) if offsets else []
    expected = [[o, 1] for o in offsets]
    for i in range(len(expected) - 1, 0, -1):  # merge consecutive ones, the slow way
        if expected[i - 1][0] + expected[i - 1][1] == expected[i][0]:
            expected[i - 1][1] += expected.pop(i)[1]
    assert writes.encode_offset_runs(offsets) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("earliest", "earliest"),
        ("latest", "latest"),
        ("1:2:3", "dlsn:1:2:3"),
        ("dlsn:1:2:3", "dlsn:1:2:3"),
        ("seq:5", "seq:5"),
        ("txid:9", "txid:9"),
        ("time:100", "time:100"),
    ],
)
def test_positions(text: str, expected: str) -> None:
    assert str(positions.parse_position(text)) == expected


@pytest.mark.parametrize("text", ["seq:x", "1:2", "foo", "seq:-1", "1:-2:3"])
def test_bad_positions(text: str) -> None:
    with pytest.raises(BadRequestError):
        positions.parse_position(text)


def test_error_bodies_round_trip_with_owner() -> None:
    exc = OwnerMovedError("moved", owner="http://h:1")
    body = wire.error_body(exc)
    assert body == {"code": 32, "name": "OWNER_MOVED", "message": "moved", "owner": "http://h:1"}
    back = wire.decode_error(body, 307)
    assert isinstance(back, OwnerMovedError)
    assert back.owner == "http://h:1"
    assert isinstance(wire.decode_error({"code": 999, "message": "?"}, 500), UnknownError)
    assert isinstance(wire.decode_error({"oops": 1}, 502), UnknownError)


def test_json_view_of_binary_uses_b64() -> None:
    rec = ReadRecord("s", DLSN(1, 2, 3), 4, 5, 6, b"\xff", None, [("h", b"v")])
    view = record_view(rec)
    assert view["headers"] == [("h", b"v")]
    as_json = json.loads(wire.encode_body(view, wire.JSON))
    assert as_json["payload_b64"] == "/w=="
    back = record_from_view("s", as_json)
    assert back.payload == b"\xff"
    assert back.dlsn == DLSN(1, 2, 3)
    packed = msgpack.unpackb(wire.encode_body(view, wire.MSGPACK))
    assert record_from_view("s", packed).payload == b"\xff"


# -- de-duplication ---------------------------------------------------------------------


def test_dedup_answers_retries_with_original_dlsns() -> None:
    table = dedup.DedupTable(batches_per_producer=4, producers_max=10)
    plan = table.plan("p", 0, 0, 3)
    assert plan == dedup.Plan([], 0, 0)
    table.record("p", 0, 0, [(1, 0, 0), (1, 0, 1), (1, 0, 2)], [7, 8, 9])
    assert table.plan("p", 0, 0, 3) == dedup.Plan(
        [(1, 0, 0), (1, 0, 1), (1, 0, 2)], 3, 3, [7, 8, 9]
    )
    # A retry that overlaps: the first two are old, the rest new.
    assert table.plan("p", 0, 1, 4) == dedup.Plan([(1, 0, 1), (1, 0, 2)], 2, 3, [8, 9])
    assert table.plan("q", 0, 0, 1) == dedup.Plan([], 0, 0)


def test_dedup_forgets_old_batches_and_says_so() -> None:
    table = dedup.DedupTable(batches_per_producer=2, producers_max=10)
    for b in range(5):
        table.record("p", 0, b, [(1, b, 0)], [b])
    with pytest.raises(OutcomeUnknownError, match="may or may not be in the log"):
        table.plan("p", 0, 0, 1)
    assert table.plan("p", 0, 4, 1).duplicates == [(1, 4, 0)]


class _Rec:
    _next_offset = 0

    def __init__(self, dlsn: tuple[int, int, int], marker: dedup.Marker | None) -> None:
        self.dlsn = dlsn
        self.marker = marker
        self.sequence_id = _Rec._next_offset  # records of one test's log: 0, 1, 2, ...
        _Rec._next_offset += 1


def test_rebuild_from_log_markers_including_partial_batches() -> None:
    log = [
        _Rec((1, 0, 0), dedup.Marker("p", 0, 0, 2)),
        _Rec((1, 0, 1), None),
        _Rec((1, 1, 0), None),  # written without a producer
        _Rec((1, 1, 1), dedup.Marker("q", 0, 10, 3)),
        _Rec((1, 1, 2), None),
        # q's third record never made it (the writer failed): a partial batch
        _Rec((2, 0, 0), dedup.Marker("p", 0, 2, 1)),
    ]
    table = dedup.DedupTable(batches_per_producer=8, producers_max=8)
    assert dedup.rebuild(table, [(r, r.marker) for r in log]) == 3
    first = log[0].sequence_id
    plan_p = table.plan("p", 0, 0, 3)
    assert plan_p.duplicates == [(1, 0, 0), (1, 0, 1), (2, 0, 0)]
    assert plan_p.offsets == [first, first + 1, first + 5]
    plan = table.plan("q", 0, 10, 3)
    assert plan.duplicates == [(1, 1, 1), (1, 1, 2)]
    assert plan.first_new_seq == 12


def test_rebuild_recovers_epochs_and_fences_older_ones() -> None:
    """The epoch travels in the batch marker (absent = 0, as in logs from before
    epochs), so a new owner knows which epoch of a producer is current."""
    log = [
        _Rec((1, 0, 0), dedup.Marker("p", 0, 0, 2)),
        _Rec((1, 0, 1), None),
        _Rec((1, 1, 0), dedup.Marker("p", 1, 0, 1)),
    ]
    table = dedup.DedupTable(batches_per_producer=8, producers_max=8)
    assert dedup.rebuild(table, [(r, r.marker) for r in log]) == 2
    state = table.state("p")
    assert state is not None
    assert (state.epoch, state.last_seq) == (1, 0)
    assert table.plan("p", 1, 0, 1).duplicates == [(1, 1, 0)]  # the new epoch's retry
    assert table.plan("p", 1, 1, 1) == dedup.Plan([], 0, 1)
    assert table.plan("p", 0, 0, 2).duplicates == [(1, 0, 0), (1, 0, 1)]  # written: answered
    with pytest.raises(ProducerFencedError):
        table.plan("p", 0, 2, 1)  # never written, and now never will be
    assert table.plan("p", 2, 0, 1) == dedup.Plan([], 0, 0)  # a newer epoch starts over


def test_limiter_refuses_over_limits_and_releases() -> None:
    lim = InflightLimiter(
        stream_bytes_max=100, stream_requests_max=2, proxy_bytes_max=150, proxy_requests_max=3
    )
    lim.admit("a", 60)
    with pytest.raises(TooManyRequestsError):
        lim.admit("a", 60)
    lim.admit("b", 60)
    with pytest.raises(TooManyRequestsError):
        lim.admit("c", 60)
    lim.release("a", 60)
    lim.admit("a", 80)
    lim.release("a", 80)
    lim.release("b", 60)
    assert lim.total_bytes == 0
    assert lim.total_requests == 0
    assert lim.rejected == 2


def test_openapi_document_is_current() -> None:
    doc = build_document()
    assert doc["openapi"].startswith("3.")
    kept = json.loads((Path(__file__).parent.parent / "docs" / "openapi.json").read_text())
    assert kept == doc, "regenerate: python -m httpapi.openapi > docs/openapi.json"


# -- one record-size limit (issue 12 defect 11) ---------------------------------------


def test_the_proxy_and_the_client_use_the_one_record_limit() -> None:
    """The client, the write proxy and the core writer refuse the same records: one
    number (foundation.limits.RECORD_BYTES_MAX), counted the same way (header names in
    UTF-8 bytes, as limits.record_bytes counts them)."""
    assert WriteProxyConfig().record_bytes_max == RECORD_BYTES_MAX
    assert ClientConfig().record_bytes_max == RECORD_BYTES_MAX
    rec = writes.WireRecord(b"v" * 10, key=b"k", headers=[("größe", b"12")])
    assert rec.size_bytes == record_bytes(rec.payload, rec.key, rec.headers)
    with pytest.raises(ConfigError, match="record_bytes_max"):
        WriteProxyConfig(record_bytes_max=RECORD_BYTES_MAX + 1)
    with pytest.raises(ConfigError, match="record_bytes_max"):
        ClientConfig(record_bytes_max=RECORD_BYTES_MAX + 1)
