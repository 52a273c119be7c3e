"""Versioned msgpack encoding of every object Bookline stores in ZooKeeper.

Schema of a znode's bytes (one msgpack array, no I/O here)::

    ["BL", kind: str, format_version: int, body: map]

* ``"BL"`` marks Bookline metadata (a foreign or truncated value is rejected up front);
* ``kind`` names the object type ("ledger", "segment", "cookie", ...) so a value read
  from the wrong path is caught instead of misinterpreted;
* ``format_version`` starts at 1 per kind and increases on incompatible changes; a
  reader refuses versions newer than it knows, with a message that says so;
* ``body`` is a map of str keys to msgpack values (bytes stay bytes).

ZooKeeper checksums its own storage and wire, so no checksum is added here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgpack

from foundation.errors import ProtocolVersionError

MAGIC = "BL"
# ZooKeeper's default jute.maxbuffer is 1 MiB; stay well inside it.
VALUE_BYTES_MAX = 512 * 1024


class MetadataFormatError(ProtocolVersionError):
    """Stored bytes are not a Bookline object of the expected kind and version."""


def encode(kind: str, format_version: int, body: Mapping[str, Any]) -> bytes:
    """Pack ``body`` as a ``kind`` object of ``format_version``."""
    data: bytes = msgpack.packb([MAGIC, kind, format_version, dict(body)], use_bin_type=True)
    if len(data) > VALUE_BYTES_MAX:
        raise MetadataFormatError(
            f"{kind} metadata is {len(data)} bytes; at most {VALUE_BYTES_MAX} fit a znode"
        )
    return data


def decode(data: bytes, kind: str, max_version: int, where: str = "") -> tuple[int, dict[str, Any]]:
    """Unpack a ``kind`` object; return ``(format_version, body)``.

    Raises MetadataFormatError when the bytes are not Bookline metadata, hold another
    kind, or carry a format version newer than ``max_version`` (written by a newer build).
    """
    at = f" at {where}" if where else ""
    try:
        obj = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except (ValueError, msgpack.UnpackException) as exc:
        raise MetadataFormatError(f"{kind} metadata{at} is not valid msgpack: {exc}") from exc
    if not (isinstance(obj, list) and len(obj) == 4 and obj[0] == MAGIC):
        raise MetadataFormatError(f"znode{at} does not hold Bookline metadata")
    _magic, stored_kind, version, body = obj
    if stored_kind != kind:
        raise MetadataFormatError(f"znode{at} holds {stored_kind!r} metadata, expected {kind!r}")
    if not isinstance(version, int) or version < 1:
        raise MetadataFormatError(f"{kind} metadata{at} has a bad format version {version!r}")
    if version > max_version:
        raise MetadataFormatError(
            f"{kind} metadata{at} has format version {version}, newer than the "
            f"{max_version} this build understands: upgrade Bookline to read it"
        )
    if not isinstance(body, dict):
        raise MetadataFormatError(f"{kind} metadata{at} has no body map")
    return version, body


def field(body: Mapping[str, Any], name: str, typ: type | tuple[type, ...], where: str = "") -> Any:
    """Fetch a required field, checking its type (a missing or mistyped field is corrupt)."""
    if name not in body:
        raise MetadataFormatError(f"metadata{' at ' + where if where else ''} lacks {name!r}")
    value = body[name]
    if not isinstance(value, typ) or (isinstance(value, bool) and typ is int):
        raise MetadataFormatError(
            f"metadata{' at ' + where if where else ''}: {name!r} has type {type(value).__name__}"
        )
    return value
