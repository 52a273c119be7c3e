"""Pure tests of the Kafka wire codec (kafkaapi/protocol): primitives, the message
tables at every version, headers, frames, and hostile input.

The oracle is kafka-python's own protocol classes: a message this codec encodes is
decoded and re-encoded by kafka-python to the same bytes, and the other way round."""

from __future__ import annotations

import contextlib
import struct
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kafkaapi.protocol import errors as kerr
from kafkaapi.protocol.errors import KafkaProtocolError
from kafkaapi.protocol.frames import NEED_DATA, FrameReader, frame
from kafkaapi.protocol.messages import (
    APIS,
    UnsupportedVersionError,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
)
from kafkaapi.protocol.primitives import Reader, uvarint, varint, varlong
from kafkaapi.protocol.schema import Api, in_range
from tests.kafka_support import kafka_python_classes, struct_of

API_LIST = sorted(APIS.values(), key=lambda api: api.key)
API_IDS = [api.name for api in API_LIST]
THEIRS = kafka_python_classes()
FEW = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def _versions(api: Api) -> st.SearchStrategy[int]:
    return st.integers(*api.versions)


def _subset_equal(sent: Any, got: Any) -> bool:
    """The decoded value holds every field sent, equal (plus defaults of the rest)."""
    if isinstance(sent, dict):
        return all(_subset_equal(v, got[k]) for k, v in sent.items())
    if isinstance(sent, list):
        return len(sent) == len(got) and all(map(_subset_equal, sent, got))
    return bool(sent == got)


# -- primitives ---------------------------------------------------------------------


def test_varints_match_kafkas_examples() -> None:
    assert uvarint(300) == b"\xac\x02"
    assert [varint(v) for v in (0, -1, 1, -2, 2)] == [b"\x00", b"\x01", b"\x02", b"\x03", b"\x04"]
    assert varlong(-(1 << 63)) == b"\xff" * 9 + b"\x01"


@given(st.integers(-(1 << 31), (1 << 31) - 1), st.integers(-(1 << 63), (1 << 63) - 1))
def test_varints_round_trip(small: int, big: int) -> None:
    reader = Reader(varint(small) + varlong(big) + uvarint(abs(small)))
    assert (reader.varint(), reader.varlong(), reader.uvarint()) == (small, big, abs(small))
    assert reader.remaining() == 0


@pytest.mark.parametrize(
    "data", [b"\x80", b"\xff\xff\xff\xff\xff\x01", b"", b"\x80\x80\x80\x80\x80\x80"]
)
def test_bad_varints_are_corrupt_messages(data: bytes) -> None:
    with pytest.raises(KafkaProtocolError) as caught:
        Reader(data).varint()
    assert caught.value.kafka is kerr.CORRUPT_MESSAGE


def test_error_table_has_kafkas_codes() -> None:
    assert kerr.BY_NAME["NOT_LEADER_OR_FOLLOWER"] == kerr.KafkaCode(
        "NOT_LEADER_OR_FOLLOWER", 6, True
    )
    assert kerr.BY_CODE[35].name == "UNSUPPORTED_VERSION"
    assert kerr.BY_CODE[-1].name == "UNKNOWN_SERVER_ERROR"
    assert not kerr.BY_NAME["SASL_AUTHENTICATION_FAILED"].retriable
    assert len(kerr.BY_CODE) == len(kerr.BY_NAME)


# -- every table, every version ------------------------------------------------------


@pytest.mark.parametrize("api", API_LIST, ids=API_IDS)
@FEW
@given(data=st.data())
def test_requests_round_trip(api: Api, data: st.DataObject) -> None:
    version = data.draw(_versions(api))
    flexible = in_range(version, api.flexible)
    body = data.draw(struct_of(api.request, version, flexible))
    raw = encode_request(api, version, 42, "cli", body)
    request = decode_request(raw)
    assert (request.api, request.version, request.correlation_id) == (api, version, 42)
    assert request.client_id == "cli"
    assert _subset_equal(body, request.body)
    assert encode_request(api, version, 42, "cli", request.body) == raw


@pytest.mark.parametrize("api", API_LIST, ids=API_IDS)
@FEW
@given(data=st.data())
def test_responses_round_trip(api: Api, data: st.DataObject) -> None:
    version = data.draw(_versions(api))
    flexible = in_range(version, api.flexible)
    body = data.draw(struct_of(api.response, version, flexible))
    raw = encode_response(api, version, 7, body)
    correlation_id, decoded = decode_response(api, version, raw)
    assert correlation_id == 7
    assert _subset_equal(body, decoded)
    assert encode_response(api, version, 7, decoded) == raw


def _oracle_versions(api: Api, cls: Any) -> st.SearchStrategy[int]:
    return st.integers(api.versions[0], min(api.versions[1], cls.max_version))


def _with_oracle(kind: str) -> list[Api]:
    """The APIs kafka-python has classes for (ConsumerGroupHeartbeat it has not: its
    bytes are pinned by hand below)."""
    return [api for api in API_LIST if api.name + kind in THEIRS]


@pytest.mark.parametrize("api", _with_oracle("Request"), ids=lambda api: api.name)
@FEW
@given(data=st.data())
def test_requests_match_kafka_python(api: Api, data: st.DataObject) -> None:
    theirs = THEIRS[api.name + "Request"]
    version = data.draw(_oracle_versions(api, theirs))
    body = data.draw(struct_of(api.request, version, in_range(version, api.flexible)))
    raw = encode_request(api, version, 9, "cli", body)
    decoded = theirs.decode(raw, version=version, header=True)
    assert decoded.encode(version=version, header=True) == raw
    assert (
        decode_request(raw).body
        == decode_request(decoded.encode(version=version, header=True)).body
    )


@pytest.mark.parametrize("api", _with_oracle("Response"), ids=lambda api: api.name)
@FEW
@given(data=st.data())
def test_responses_match_kafka_python(api: Api, data: st.DataObject) -> None:
    theirs = THEIRS[api.name + "Response"]
    version = data.draw(_oracle_versions(api, theirs))
    body = data.draw(struct_of(api.response, version, in_range(version, api.flexible)))
    if api.name == "ApiVersions":
        # An ApiVersions error answer is always a v0 body (Kafka's rule, which
        # kafka-python applies when decoding): the listener encodes those at v0.
        body["error_code"] = 0
    raw = encode_response(api, version, 9, body)
    decoded = theirs.decode(raw, version=version, header=True)
    assert version == decoded.API_VERSION
    assert decoded.encode(header=True) == raw


def test_api_versions_response_header_is_v0_even_when_flexible() -> None:
    """A client that does not know the broker's versions must read the answer: no
    tagged fields in the header (Kafka's one exception), but in the body."""
    api = APIS[18]
    raw = encode_response(api, 3, 5, {"error_code": 0, "api_keys": []})
    assert raw[:4] == struct.pack(">i", 5)
    assert raw[4:6] == b"\x00\x00"  # error code right after the correlation id
    metadata = APIS[3]
    assert encode_response(metadata, 9, 5, {})[4:5] == b"\x00"  # header tagged fields


def test_metadata_request_matches_kafka_python_object() -> None:
    """A request built with kafka-python's own classes decodes to what it says."""
    theirs = THEIRS["MetadataRequest"]
    request = theirs[12](
        topics=[theirs.MetadataRequestTopic(name="orders")],
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=True,
    )
    request.with_header(correlation_id=3, client_id="kp")
    decoded = decode_request(request.encode(header=True))
    assert (decoded.api.name, decoded.version, decoded.correlation_id) == ("Metadata", 12, 3)
    assert decoded.client_id == "kp"
    assert [t["name"] for t in decoded.body["topics"]] == ["orders"]
    assert decoded.body["allow_auto_topic_creation"] is False
    assert decoded.body["include_topic_authorized_operations"] is True


# -- hostile input -------------------------------------------------------------------


def _sample_request() -> bytes:
    topics = [{"name": "t", "partition_data": [{"index": 0, "records": b"xy"}]}]
    return encode_request(APIS[0], 9, 1, "c", {"acks": -1, "timeout_ms": 5, "topic_data": topics})


def test_every_truncation_is_a_corrupt_message() -> None:
    raw = _sample_request()
    for end in range(len(raw)):
        with pytest.raises(KafkaProtocolError):
            decode_request(raw[:end])


@settings(max_examples=300, deadline=None)
@given(st.data())
def test_mutated_requests_raise_only_the_protocol_error(data: st.DataObject) -> None:
    raw = bytearray(_sample_request())
    for _ in range(data.draw(st.integers(1, 4))):
        raw[data.draw(st.integers(0, len(raw) - 1))] = data.draw(st.integers(0, 255))
    with contextlib.suppress(KafkaProtocolError):
        decode_request(bytes(raw))


@given(st.binary(max_size=64))
def test_random_bytes_raise_only_the_protocol_error(raw: bytes) -> None:
    with contextlib.suppress(KafkaProtocolError):
        decode_request(raw)


def test_unknown_api_key_is_an_invalid_request() -> None:
    raw = struct.pack(">hhih", 999, 0, 1, -1)
    with pytest.raises(KafkaProtocolError) as caught:
        decode_request(raw)
    assert caught.value.kafka is kerr.INVALID_REQUEST


def test_unknown_version_says_which_for_the_answer() -> None:
    raw = struct.pack(">hhih", 18, 99, 77, -1)
    with pytest.raises(UnsupportedVersionError) as caught:
        decode_request(raw)
    error = caught.value
    assert (error.kafka, error.api_key, error.api_version, error.correlation_id) == (
        kerr.UNSUPPORTED_VERSION,
        18,
        99,
        77,
    )


@pytest.mark.parametrize(
    "tail",
    [
        struct.pack(">i", -5),  # negative array count
        struct.pack(">i", 0x7FFFFFFF),  # huge array count, a few bytes of input
        struct.pack(">ih", 1, -7),  # negative string length
        struct.pack(">ih", 1, 30000) + b"x",  # string length past the end
    ],
)
def test_lying_lengths_are_corrupt_without_allocating(tail: bytes) -> None:
    # DeleteTopics v0: topic_names []string, timeout_ms int32.
    raw = struct.pack(">hhih", 20, 0, 1, -1) + tail
    with pytest.raises(KafkaProtocolError) as caught:
        decode_request(raw)
    assert caught.value.kafka is kerr.CORRUPT_MESSAGE


def test_huge_compact_array_count_is_corrupt() -> None:
    # DeleteTopics v4 (flexible): header tagged fields, then topic_names compact array.
    raw = struct.pack(">hhih", 20, 4, 1, -1) + b"\x00" + uvarint(1 << 31)
    with pytest.raises(KafkaProtocolError) as caught:
        decode_request(raw)
    assert caught.value.kafka is kerr.CORRUPT_MESSAGE


def test_bytes_after_a_request_body_are_ignored_as_kafka_does() -> None:
    """librdkafka 2.16's Metadata v12 request for every topic, byte for byte: three
    bytes follow the body, and a Kafka broker answers it."""
    raw = bytes.fromhex("0003000c00000003000772646b61666b610000000000010000")
    request = decode_request(raw)
    assert (request.api.name, request.version, request.client_id) == ("Metadata", 12, "rdkafka")
    assert request.body["topics"] is None
    assert decode_request(_sample_request() + b"\x00").body["acks"] == -1


def test_bytes_after_a_response_body_are_corrupt() -> None:
    raw = encode_response(APIS[12], 4, 1, {"error_code": 0}) + b"\x00"
    with pytest.raises(KafkaProtocolError):
        decode_response(APIS[12], 4, raw)


# -- frames --------------------------------------------------------------------------


@given(st.lists(st.binary(max_size=40), max_size=5), st.integers(1, 7))
def test_frames_split_anywhere(payloads: list[bytes], step: int) -> None:
    stream = b"".join(frame(p) for p in payloads)
    reader = FrameReader(frame_bytes_max=64)
    got: list[bytes] = []
    for start in range(0, len(stream), step):
        reader.feed(stream[start : start + step])
        while (item := reader.next_frame()) is not NEED_DATA:
            assert isinstance(item, bytes)
            got.append(item)
    assert got == payloads
    assert reader.buffered_bytes == 0


def test_oversized_frame_is_refused_before_its_bytes_arrive() -> None:
    reader = FrameReader(frame_bytes_max=1024)
    with pytest.raises(KafkaProtocolError) as caught:
        reader.feed(struct.pack(">i", 1 << 30))
    assert caught.value.kafka is kerr.INVALID_REQUEST
    with pytest.raises(KafkaProtocolError):  # sticky: the connection is done
        reader.feed(b"more")
    assert reader.buffered_bytes == 4


def test_negative_frame_size_is_corrupt() -> None:
    reader = FrameReader()
    with pytest.raises(KafkaProtocolError) as caught:
        reader.feed(struct.pack(">i", -1))
    assert caught.value.kafka is kerr.CORRUPT_MESSAGE


def test_docs_table_matches_the_api_table() -> None:
    """docs/kafka.md's table of APIs and versions is the codec's, row for row."""
    from pathlib import Path

    text = (Path(__file__).parent.parent / "docs" / "kafka.md").read_text()
    for api in API_LIST:
        flexible = api.flexible.rstrip("+")
        row = (
            f"| {api.name} | {api.key} | {api.versions[0]}-{api.versions[1]} "
            f"| {api.advertised[0]}-{api.advertised[1]} | {flexible} |"
        )
        assert row in text, row


def test_consumer_group_heartbeat_bytes_by_hand() -> None:
    """kafka-python has no ConsumerGroupHeartbeat (KIP-848) to compare with: its bytes
    written out by hand from Kafka's schema. A nullable struct is an int8 -1 (null) or
    1 then the struct; compact strings and arrays carry length + 1."""
    import uuid

    api = APIS[68]
    topic = uuid.UUID(int=0x0102)
    body = {
        "member_id": "m",
        "member_epoch": 3,
        "heartbeat_interval_ms": 5000,
        "assignment": {"topic_partitions": [{"topic_id": topic, "partitions": [0, 2]}]},
    }
    expected = (
        struct.pack(">i", 11)  # correlation id
        + b"\x00"  # response header v1: no tagged fields
        + struct.pack(">ih", 0, 0)  # throttle_time_ms, error_code
        + b"\x00"  # error_message null
        + b"\x02m"  # member_id "m"
        + struct.pack(">ii", 3, 5000)
        + b"\x01"  # assignment present
        + b"\x02"  # one topic
        + topic.bytes
        + b"\x03"
        + struct.pack(">ii", 0, 2)  # partitions [0, 2]
        + b"\x00"  # the topic's tagged fields
        + b"\x00"  # the assignment's tagged fields
        + b"\x00"  # the body's tagged fields
    )
    assert encode_response(api, 0, 11, body) == expected
    assert decode_response(api, 0, expected)[1]["assignment"] == body["assignment"]
    no_assignment = encode_response(api, 0, 11, {**body, "assignment": None})
    assert no_assignment.endswith(struct.pack(">ii", 3, 5000) + b"\xff\x00")
    assert decode_response(api, 0, no_assignment)[1]["assignment"] is None


def test_a_misspelt_field_is_refused_not_written_as_its_default() -> None:
    with pytest.raises(ValueError, match="timeout"):
        encode_request(APIS[0], 9, 1, "c", {"acks": -1, "timeout": 5, "topic_data": []})


def test_unknown_tagged_fields_are_skipped_in_headers_and_bodies() -> None:
    """A newer client may send tags this table does not know: skipped, not refused."""
    tags = b"\x02" + b"\x05\x02ab" + b"\x09\x00"  # two fields: tag 5 (2 bytes), tag 9 (empty)
    header = struct.pack(">hhih", 18, 3, 4, -1) + tags
    body = b"\x02x" + b"\x021" + tags  # client software name "x", version "1"
    request = decode_request(header + body)
    assert request.client_id is None
    assert request.body == {"client_software_name": "x", "client_software_version": "1"}


def test_a_known_tagged_field_round_trips_only_when_not_default() -> None:
    api = APIS[18]
    plain = encode_response(api, 3, 1, {"error_code": 0, "api_keys": []})
    tagged = encode_response(
        api, 3, 1, {"error_code": 0, "api_keys": [], "zk_migration_ready": True}
    )
    assert plain.endswith(b"\x00") and len(tagged) == len(plain) + 3  # tag, size, value
    assert decode_response(api, 3, tagged)[1]["zk_migration_ready"] is True
    assert decode_response(api, 3, plain)[1]["finalized_features_epoch"] == -1  # its default
