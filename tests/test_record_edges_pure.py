"""Issue 24 (2, 3, 4) at the edges, without a cluster: Kafka's record model -- headers as
ordered pairs with repeated names and null values, null values, producer timestamps and
the timestamp type -- in the HTTP bodies, the thin client's and the topic producer's
records, the group consumer's records, the CLI's lines and the Spark rows.

Each of these failed before: headers were a dict (``--header a=1 --header a=2`` kept
``a=2``; a list of pairs raised), ``value=None`` raised, no path took a timestamp and
every record's timestamp type was 0."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

import msgpack
import pytest

from foundation.errors import BadRequestError
from groups.fetchers import ConsumerRecord, records_from_core, records_from_rows
from groups.producer import as_log_record
from httpapi import wire, writes
from httpapi.partitions import decode_page, encode_page, rows_of
from httpapi.views import record_from_view, record_view
from ops.cli.consume import record_line
from ops.cli.topic import _headers as cli_headers
from streams.dlsn import DLSN
from streams.records import LogRecord, ReadRecord
from thinclient.records import as_record, keyed

# Kafka's headers at their hardest: a repeated name, a null value, a non-UTF-8 value.
PAIRS: list[tuple[str, bytes | None]] = [("a", b"1"), ("n", None), ("a", b"2")]
BINARY_PAIRS: list[tuple[str, bytes | None]] = [("a", b"\xff\x00"), ("n", None), ("a", b"t")]


def _record(headers: Any, payload: bytes | None = b"v", ts_type: int = 1) -> ReadRecord:
    return ReadRecord("s", DLSN(1, 2, 3), 7, 9, 1_700_000_000_123, payload, b"k", headers,
                      ts_type)  # fmt: skip


def _json_round_trip(obj: dict[str, Any]) -> dict[str, Any]:
    return wire.decode_body(wire.encode_body(obj, wire.JSON), wire.JSON)


def _msgpack_round_trip(obj: dict[str, Any]) -> dict[str, Any]:
    return wire.decode_body(wire.encode_body(obj, wire.MSGPACK), wire.MSGPACK)


# -- HTTP writes -------------------------------------------------------------------------


def test_a_write_body_keeps_header_order_repeated_names_and_null_values() -> None:
    body = {"records": [{"payload": "x", "headers": [["a", "1"], ["n", None], ["a", "2"]]}]}
    (rec,) = writes.parse_write(body, records_max=10).records
    assert rec.headers == PAIRS
    # an object still works (its items, in order), and base64 values under headers_b64
    old = {"records": [{"payload": "x", "headers": {"a": "1", "b": "2"}}]}
    assert writes.parse_write(old, records_max=10).records[0].headers == [("a", b"1"), ("b", b"2")]
    b64 = {"records": [{"payload": "x", "headers_b64": [["a", "/wA="], ["n", None]]}]}
    assert writes.parse_write(b64, records_max=10).records[0].headers == [
        ("a", b"\xff\x00"),
        ("n", None),
    ]
    for bad in (
        [["bl.producer", "x"]],  # Bookline's reserved prefix
        [["a"]],
        [["", "x"]],
        [["a", 1]],
        "a=1",
        [["a", "x"]] * (writes.HEADERS_PER_RECORD_MAX + 1),
    ):
        with pytest.raises(BadRequestError):
            writes.parse_write({"records": [{"payload": "x", "headers": bad}]}, records_max=10)


def test_a_write_body_carries_null_values_and_producer_timestamps() -> None:
    body = {"records": [{"payload": None, "key": "k", "timestamp": 1_600_000_000_000}]}
    (rec,) = writes.parse_write(body, records_max=10).records
    assert (rec.payload, rec.key, rec.timestamp_ms) == (None, b"k", 1_600_000_000_000)
    one = writes.parse_write({"payload": None, "key": "k"}, records_max=10)
    assert one.records[0].payload is None
    # the compact form: a null among the payloads is a null value too
    compact = writes.parse_write({"payloads": ["a", None], "keys": ["k", "k"]}, records_max=10)
    assert [(r.payload, r.key) for r in compact.records] == [(b"a", b"k"), (None, b"k")]
    for bad in (
        {"records": [{"key": "k"}]},  # no payload at all is not a null value
        {"records": [{"payload": "x", "timestamp": -1}]},
        {"records": [{"payload": "x", "timestamp": "now"}]},
    ):
        with pytest.raises(BadRequestError):
            writes.parse_write(bad, records_max=10)


@pytest.mark.parametrize("pairs", [PAIRS, BINARY_PAIRS])
@pytest.mark.parametrize("media", [wire.JSON, wire.MSGPACK])
def test_the_thin_clients_write_body_round_trips(pairs: Any, media: str) -> None:
    sent = [
        writes.WireRecord(None, b"k", pairs, None, 1_600_000_000_000),
        writes.WireRecord(b"plain"),
    ]
    body = writes.write_body(sent, "p", 0)
    obj = _json_round_trip(body) if media == wire.JSON else _msgpack_round_trip(body)
    got = writes.parse_write(obj, records_max=10).records
    assert got == sent


# -- HTTP and WebSocket reads ------------------------------------------------------------


@pytest.mark.parametrize("pairs", [PAIRS, BINARY_PAIRS])
@pytest.mark.parametrize("payload", [b"v", None])
def test_a_read_record_round_trips_through_both_media(pairs: Any, payload: bytes | None) -> None:
    rec = _record(pairs, payload)
    view = record_view(rec)
    assert view["ts_type"] == "LogAppendTime"
    as_json = _json_round_trip(view)
    if pairs is BINARY_PAIRS:  # one value is not text: all of them base64, nulls kept
        assert as_json["headers_b64"] == [["a", "/wA="], ["n", None], ["a", "dA=="]]
    else:
        assert as_json["headers"] == [["a", "1"], ["n", None], ["a", "2"]]
    assert as_json["payload"] == (None if payload is None else "v")
    assert record_from_view("s", as_json) == rec
    assert record_from_view("s", _msgpack_round_trip(view)) == rec
    # a record without the new fields (an older proxy's) reads as CreateTime
    old = {"dlsn": "1:2:3", "seq": 7, "txid": 9, "ts": 5, "payload": "v"}
    assert record_from_view("s", old).timestamp_type == 0


@pytest.mark.parametrize("media", [wire.JSON, wire.MSGPACK])
def test_a_partition_page_round_trips(media: str) -> None:
    recs = [_record(PAIRS, None), _record(None, b"x", 0), _record(BINARY_PAIRS, b"y")]
    rows = rows_of(recs)
    obj = wire.decode_body(encode_page(rows, 8, media), media)
    assert decode_page(obj) == (rows, 8)
    consumed = records_from_rows("t", 0, decode_page(obj)[0])
    assert consumed == records_from_core("t", 0, recs)
    assert [(c.value, c.headers, c.timestamp_type) for c in consumed] == [
        (None, PAIRS, 1),
        (b"x", None, 0),
        (b"y", BINARY_PAIRS, 1),
    ]


# -- the thin client's and the topic producer's records ----------------------------------


def test_the_thin_client_takes_pairs_null_values_and_timestamps() -> None:
    rec = keyed(None, "k", PAIRS, 1_600_000_000_000)
    assert rec == writes.WireRecord(None, b"k", PAIRS, None, 1_600_000_000_000)
    assert keyed(b"v", None, {"a": "1"}) == writes.WireRecord(b"v", None, [("a", b"1")])
    assert as_record(None) == writes.WireRecord(None)
    log = LogRecord(None, None, b"k", list(PAIRS), 5)
    assert as_record(log) == writes.WireRecord(None, b"k", PAIRS, None, 5)
    with pytest.raises(BadRequestError):
        keyed(b"v", None, [("bl.seq", b"1")])


def test_the_topic_producer_takes_pairs_null_values_and_timestamps() -> None:
    rec = as_log_record(None, "k", [("a", "1"), ("n", None), ("a", b"2")], 1_600_000_000_000)
    assert (rec.payload, rec.key, rec.headers, rec.timestamp_ms) == (
        None,
        b"k",
        PAIRS,
        1_600_000_000_000,
    )
    assert as_log_record(b"v", headers={"a": "1"}).headers == [("a", b"1")]
    bad_calls: list[Callable[[], object]] = [
        lambda: as_log_record(b"v", headers=[("bl.producer", b"x")]),
        lambda: as_log_record(b"v", timestamp_ms=-5),
        lambda: as_log_record(LogRecord(b"v"), timestamp_ms=5),
    ]
    for bad in bad_calls:
        with pytest.raises(BadRequestError):
            bad()


# -- the CLI -------------------------------------------------------------------------------


def test_cli_headers_keep_order_and_repeats_and_name_alone_is_null() -> None:
    assert cli_headers(["a=1", "n", "a=2", "e="]) == [*PAIRS, ("e", b"")]
    with pytest.raises(BadRequestError):
        cli_headers(["=x"])


def test_consume_json_shows_headers_as_pairs_and_the_timestamp_type() -> None:
    rec = ConsumerRecord("t", 1, 4, b"k", None, PAIRS, 1_600_000_000_000, 1)
    assert json.loads(record_line(rec, True)) == {
        "topic": "t",
        "partition": 1,
        "offset": 4,
        "ts": 1_600_000_000_000,
        "ts_type": "LogAppendTime",
        "key": "k",
        "value": None,
        "headers": [["a", "1"], ["n", None], ["a", "2"]],
    }
    assert record_line(rec, False) == ""


def test_stream_read_lines_show_null_values_headers_and_the_timestamp_type() -> None:
    from ops.cli.stream import _line

    rec = _record(PAIRS, None)
    assert _line(rec, False) == ""
    assert json.loads(_line(rec, True)) == {
        "dlsn": "1:2:3",
        "seq": 7,
        "txid": 9,
        "ts": 1_700_000_000_123,
        "ts_type": "LogAppendTime",
        "payload": None,
        "key": "k",
        "headers": [["a", "1"], ["n", None], ["a", "2"]],
    }


def test_produce_parses_null_value_and_timestamp_options() -> None:
    from ops.cli.topic import register

    parser = argparse.ArgumentParser()
    register(parser.add_subparsers())
    args = parser.parse_args(["produce", "t", "--header", "a=1", "--header", "a=2",
                              "--null-value", "NULL", "--timestamp", "5"])  # fmt: skip
    assert (args.header, args.null_value, args.timestamp) == (["a=1", "a=2"], "NULL", 5)


# -- Spark rows ------------------------------------------------------------------------------


def test_spark_rows_carry_the_timestamp_type_null_values_and_header_pairs() -> None:
    from pipeline.planning import Slice
    from pipeline.schema import records_to_tuples

    sl = Slice("s", 1, 0, 10, 0, -1, topic="t", partition=0)
    rec = _record(PAIRS, None, 1)
    (row,) = records_to_tuples([rec], sl, include_headers=True)
    assert row[1] is None  # value
    assert row[6] == 1  # timestampType: LogAppendTime
    assert row[7] == PAIRS  # headers: in order (the sink's tag is never one)


def test_spark_sink_rows_keep_header_order_null_values_and_timestamps() -> None:
    import datetime as dt

    from pipeline.sink_marks import digest
    from pipeline.sink_task import _headers, _timestamp_ms

    # a header named like the sink's old tag header is the user's: kept
    old_tag = [("bookline.spark", b"old")]
    structs = [{"key": k, "value": v} for k, v in [*PAIRS, *old_tag]]
    assert _headers(structs) == [*PAIRS, *old_tag]
    assert _headers({"a": "1"}) == [("a", b"1")]
    when = dt.datetime(2020, 9, 13, 12, 26, 40, tzinfo=dt.UTC)
    assert _timestamp_ms(when) == 1_600_000_000_000 == _timestamp_ms(1_600_000_000_000)
    assert _timestamp_ms(None) is None
    # a row's identity: a null value is not an empty one, header order counts
    assert digest(b"k", None, PAIRS) != digest(b"k", b"", PAIRS)
    assert digest(b"k", b"v", PAIRS) != digest(b"k", b"v", PAIRS[::-1])
    assert digest(b"k", b"v", [*PAIRS, *old_tag]) != digest(b"k", b"v", PAIRS)
    assert digest(b"k", b"v", []) == digest(b"k", b"v", None)


def test_msgpack_rows_decode_headers_as_pairs() -> None:
    """msgpack arrays decode as lists: a consumer still gets (name, value) tuples."""
    rows = rows_of([_record(PAIRS)])
    raw = msgpack.unpackb(msgpack.packb({"rows": rows, "next_offset": 1}))
    assert decode_page(raw)[0][0][4] == PAIRS
