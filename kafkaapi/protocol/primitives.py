"""Kafka's primitive types, read from and written to bytes (no I/O).

Fixed width, big-endian: int8, int16, uint16, int32, uint32, int64, float64; bool is
one byte (0 = false). uuid is 16 bytes. Variable width (the record format and flexible
versions): unsigned varint (7 bits a byte, low group first, high bit = more follows,
at most 5 bytes for 32 bits / 10 for 64), and varint/varlong = zigzag of a signed value
then unsigned varint.

Lengths: a classic string is int16 length + UTF-8 (-1 = null), classic bytes and arrays
an int32 length or count (-1 = null). A compact (flexible-version) string, bytes or array
carries unsigned varint ``length + 1`` (0 = null).

:class:`Reader` checks every length against the bytes left before slicing, so a
truncated or lying input raises :class:`KafkaProtocolError` (CORRUPT_MESSAGE), never an
IndexError, a struct.error or a huge allocation.
"""

from __future__ import annotations

import struct
import uuid

from kafkaapi.protocol.errors import CORRUPT_MESSAGE, KafkaProtocolError

__all__ = [
    "Reader",
    "uvarint",
    "varint",
    "varlong",
    "zigzag",
]

_I8 = struct.Struct(">b")
_I16 = struct.Struct(">h")
_U16 = struct.Struct(">H")
_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
_I64 = struct.Struct(">q")
_F64 = struct.Struct(">d")

# Bytes of a varint holding 32 / 64 bits; a longer one is corrupt, not merely big.
_VARINT32_BYTES_MAX = 5
_VARINT64_BYTES_MAX = 10


def zigzag(value: int, bits: int) -> int:
    """Signed -> unsigned so small magnitudes stay short: 0, -1, 1, -2 -> 0, 1, 2, 3."""
    return ((value << 1) ^ (value >> (bits - 1))) & ((1 << bits) - 1)


def uvarint(value: int) -> bytes:
    """An unsigned varint (value >= 0)."""
    if value < 0:
        raise ValueError(f"unsigned varint of negative {value}")
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def varint(value: int) -> bytes:
    """A zigzag varint of a signed 32-bit value."""
    if not -(1 << 31) <= value < (1 << 31):
        raise ValueError(f"varint out of int32 range: {value}")
    return uvarint(zigzag(value, 32))


def varlong(value: int) -> bytes:
    """A zigzag varint of a signed 64-bit value."""
    if not -(1 << 63) <= value < (1 << 63):
        raise ValueError(f"varlong out of int64 range: {value}")
    return uvarint(zigzag(value, 64))


def corrupt(message: str) -> KafkaProtocolError:
    return KafkaProtocolError(CORRUPT_MESSAGE, message)


class Reader:
    """A cursor over bytes; every read is bounds-checked."""

    __slots__ = ("_data", "_end", "pos")

    def __init__(self, data: bytes | memoryview, pos: int = 0, end: int | None = None) -> None:
        self._data = memoryview(data) if not isinstance(data, memoryview) else data
        self.pos = pos
        self._end = len(self._data) if end is None else end

    def remaining(self) -> int:
        return self._end - self.pos

    def take(self, size: int) -> memoryview:
        """The next ``size`` bytes, checked against what is left."""
        if size < 0:
            raise corrupt(f"negative length {size}")
        if size > self._end - self.pos:
            raise corrupt(f"length {size} past the end ({self._end - self.pos} bytes left)")
        start = self.pos
        self.pos = start + size
        return self._data[start : self.pos]

    def _fixed(self, codec: struct.Struct) -> int:
        if codec.size > self._end - self.pos:
            raise corrupt(f"truncated: {codec.size}-byte field, {self._end - self.pos} left")
        (value,) = codec.unpack_from(self._data, self.pos)
        self.pos += codec.size
        return int(value)

    def int8(self) -> int:
        return self._fixed(_I8)

    def int16(self) -> int:
        return self._fixed(_I16)

    def uint16(self) -> int:
        return self._fixed(_U16)

    def int32(self) -> int:
        return self._fixed(_I32)

    def uint32(self) -> int:
        return self._fixed(_U32)

    def int64(self) -> int:
        return self._fixed(_I64)

    def float64(self) -> float:
        if self._end - self.pos < 8:
            raise corrupt("truncated float64")
        (value,) = _F64.unpack_from(self._data, self.pos)
        self.pos += 8
        return float(value)

    def boolean(self) -> bool:
        return self._fixed(_I8) != 0

    def uuid(self) -> uuid.UUID:
        return uuid.UUID(bytes=bytes(self.take(16)))

    def uvarint(self, bytes_max: int = _VARINT32_BYTES_MAX) -> int:
        value = 0
        for index in range(bytes_max):
            if self.pos >= self._end:
                raise corrupt("truncated varint")
            byte = self._data[self.pos]
            self.pos += 1
            value |= (byte & 0x7F) << (7 * index)
            if byte < 0x80:
                return value
        raise corrupt(f"varint longer than {bytes_max} bytes")

    def varint(self) -> int:
        raw = self.uvarint(_VARINT32_BYTES_MAX) & 0xFFFFFFFF
        return (raw >> 1) ^ -(raw & 1)

    def varlong(self) -> int:
        raw = self.uvarint(_VARINT64_BYTES_MAX) & 0xFFFFFFFFFFFFFFFF
        return (raw >> 1) ^ -(raw & 1)

    # Lengths: each returns -1 for null, else a length already checked to fit.

    def _fitting(self, length: int) -> int:
        if length < -1:
            raise corrupt(f"negative length {length}")
        if length > self._end - self.pos:
            raise corrupt(f"length {length} past the end ({self._end - self.pos} bytes left)")
        return length

    def classic_string_length(self) -> int:
        return self._fitting(self.int16())

    def classic_bytes_length(self) -> int:
        return self._fitting(self.int32())

    def compact_length(self) -> int:
        return self._fitting(self.uvarint() - 1)

    def array_count(self, compact: bool) -> int:
        """An array's element count (-1 = null). Every element takes at least one byte,
        so a count over the bytes left is corrupt: a lying count never allocates."""
        count = self.uvarint() - 1 if compact else self.int32()
        return self._fitting(count)

    def text(self, length: int) -> str:
        try:
            return str(self.take(length), "utf-8")
        except UnicodeDecodeError as exc:
            raise corrupt(f"string is not UTF-8: {exc}") from exc


def pack_int8(value: int) -> bytes:
    return _I8.pack(value)


def pack_int16(value: int) -> bytes:
    return _I16.pack(value)


def pack_uint16(value: int) -> bytes:
    return _U16.pack(value)


def pack_int32(value: int) -> bytes:
    return _I32.pack(value)


def pack_uint32(value: int) -> bytes:
    return _U32.pack(value)


def pack_int64(value: int) -> bytes:
    return _I64.pack(value)


def pack_float64(value: float) -> bytes:
    return _F64.pack(value)
