"""Requests and responses: the API table and the headers (no I/O).

A frame (``frames.py``) holds one request or response; its bytes are a header then the
body of the API's schema at the header's version::

    request header v0  api_key int16, api_version int16, correlation_id int32
                   v1  + client_id: classic nullable string (int16 length), even later
                   v2  + tagged fields                  (flexible versions of the API)
    response header v0 correlation_id int32
                    v1 + tagged fields                  (flexible versions of the API,
                                                         except ApiVersions: always v0, so
                                                         a client that does not know the
                                                         broker's versions can read it)

:func:`decode_request` reads the API key and version first: an unknown key raises
INVALID_REQUEST, a version outside the table UNSUPPORTED_VERSION (the error carries the
key, version and correlation id, so a listener can answer ApiVersions' special case: a
v0 response listing what it does support). Bytes after a request's body are ignored, as
Kafka's broker ignores them (librdkafka 2.x sends three after a Metadata v12 body asking
for every topic); bytes after a response's body are corrupt.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kafkaapi.protocol import apis_admin, apis_cluster, apis_data, apis_groups
from kafkaapi.protocol.codec import decode_struct, encode_struct, plan_of
from kafkaapi.protocol.errors import (
    INVALID_REQUEST,
    UNSUPPORTED_VERSION,
    KafkaProtocolError,
)
from kafkaapi.protocol.primitives import Reader, corrupt, pack_int16, pack_int32, uvarint
from kafkaapi.protocol.schema import Api, in_range

__all__ = [
    "APIS",
    "API_VERSIONS_KEY",
    "Request",
    "UnsupportedVersionError",
    "api_for",
    "decode_request",
    "decode_response",
    "encode_request",
    "encode_response",
]

# One row per API key, each holding its version range and schemas.
APIS: dict[int, Api] = {
    api.key: api
    for module in (apis_cluster, apis_data, apis_groups, apis_admin)
    for api in (getattr(module, name) for name in module.__all__)
}
API_VERSIONS_KEY = apis_cluster.API_VERSIONS.key


class UnsupportedVersionError(KafkaProtocolError):
    """A known API at a version outside the table; says which, for the answer."""

    def __init__(self, api_key: int, api_version: int, correlation_id: int) -> None:
        super().__init__(UNSUPPORTED_VERSION, f"API {api_key} version {api_version}")
        self.api_key = api_key
        self.api_version = api_version
        self.correlation_id = correlation_id


@dataclass(frozen=True, slots=True)
class Request:
    """A decoded request: its header and its body (a dict of the schema's fields)."""

    api: Api
    version: int
    correlation_id: int
    client_id: str | None
    body: dict[str, Any]


def api_for(key: int) -> Api:
    api = APIS.get(key)
    if api is None:
        raise KafkaProtocolError(INVALID_REQUEST, f"unknown API key {key}")
    return api


def _flexible(api: Api, version: int) -> bool:
    return in_range(version, api.flexible)


def _check_version(api: Api, version: int) -> None:
    low, high = api.versions
    if not low <= version <= high:
        raise UnsupportedVersionError(api.key, version, 0)


def encode_request(
    api: Api, version: int, correlation_id: int, client_id: str | None, body: dict[str, Any]
) -> bytes:
    """Header (v1, or v2 for a flexible version) and body, without the size prefix."""
    _check_version(api, version)
    flexible = _flexible(api, version)
    out = bytearray(pack_int16(api.key) + pack_int16(version) + pack_int32(correlation_id))
    if client_id is None:
        out.extend(pack_int16(-1))
    else:
        raw = client_id.encode()
        out.extend(pack_int16(len(raw)) + raw)
    if flexible:
        out.extend(uvarint(0))
    encode_struct(plan_of(api.request, version, flexible), body, out)
    return bytes(out)


def decode_request(frame: bytes | memoryview) -> Request:
    reader = Reader(frame)
    api_key = reader.int16()
    version = reader.int16()
    correlation_id = reader.int32()
    api = api_for(api_key)
    low, high = api.versions
    if not low <= version <= high:
        raise UnsupportedVersionError(api_key, version, correlation_id)
    flexible = _flexible(api, version)
    length = reader.classic_string_length()
    client_id = None if length == -1 else reader.text(length)
    if flexible:
        _skip_tagged(reader)
    body = decode_struct(plan_of(api.request, version, flexible), reader)
    return Request(api, version, correlation_id, client_id, body)


def _response_header_flexible(api: Api, version: int) -> bool:
    return _flexible(api, version) and api.key != API_VERSIONS_KEY


def encode_response(api: Api, version: int, correlation_id: int, body: dict[str, Any]) -> bytes:
    """Header (v0, or v1 for a flexible version but ApiVersions) and body, unprefixed."""
    _check_version(api, version)
    out = bytearray(pack_int32(correlation_id))
    if _response_header_flexible(api, version):
        out.extend(uvarint(0))
    encode_struct(plan_of(api.response, version, _flexible(api, version)), body, out)
    return bytes(out)


def decode_response(
    api: Api, version: int, frame: bytes | memoryview
) -> tuple[int, dict[str, Any]]:
    """(correlation id, body) of a response to a request of ``api`` at ``version``."""
    _check_version(api, version)
    reader = Reader(frame)
    correlation_id = reader.int32()
    if _response_header_flexible(api, version):
        _skip_tagged(reader)
    body = decode_struct(plan_of(api.response, version, _flexible(api, version)), reader)
    _check_consumed(reader)
    return correlation_id, body


def _skip_tagged(reader: Reader) -> None:
    """Header tagged fields: none are defined that Bookline reads; skip them."""
    count = reader.uvarint()
    if count > reader.remaining():
        raise corrupt(f"{count} tagged fields in {reader.remaining()} bytes")
    for _ in range(count):
        reader.uvarint()
        reader.take(reader.uvarint())


def _check_consumed(reader: Reader) -> None:
    if reader.remaining():
        raise corrupt(f"{reader.remaining()} bytes after the message body")
