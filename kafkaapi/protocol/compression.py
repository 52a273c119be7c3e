"""The record batch compression codecs (no I/O), with a bound on decompressed bytes.

Attribute bits 0-2 of a batch name the codec: 0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd.
The compressed part is the batch's records (everything after ``records_count``).

* gzip: a gzip member (RFC 1952).
* snappy: the Java client's framing (snappy-java's ``SnappyOutputStream``, "xerial"):
  magic ``82 'SNAPPY' 00``, int32 version 1, int32 compatible version 1, then blocks of
  int32 compressed length + a raw snappy block. Raw snappy without the framing (what
  some clients write) is read too.
* lz4: an LZ4 frame with independent blocks (the Java client refuses linked blocks).
* zstd: a zstd frame.

Decompression never holds more than ``bytes_max`` bytes: output goes into a buffer that
grows by doubling up to the bound (a stream that does not fit is refused with
RECORD_LIST_TOO_LARGE), and a snappy block's declared length is checked before it is
decompressed. Anything else that fails is CORRUPT_MESSAGE.
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Callable
from typing import Final

import cramjam

from kafkaapi.protocol.errors import (
    RECORD_LIST_TOO_LARGE,
    UNSUPPORTED_COMPRESSION_TYPE,
    KafkaProtocolError,
)
from kafkaapi.protocol.primitives import corrupt

__all__ = ["DECOMPRESSED_BYTES_MAX", "Compression", "compress", "decompress"]

# A batch's records, decompressed, are bounded like a frame: a zip bomb of a few KiB
# must not become gigabytes in memory (64 MiB: 4x the frame bound).
DECOMPRESSED_BYTES_MAX: Final = 64 * 1024 * 1024

_XERIAL_MAGIC: Final = b"\x82SNAPPY\x00"
_XERIAL_HEADER: Final = struct.Struct(">8sii")
_XERIAL_BLOCK_BYTES: Final = 32 * 1024  # the Java client's block size
_I32: Final = struct.Struct(">i")
# The first try of a growing buffer: most batches compress less than 8x.
_FIRST_GUESS_RATIO: Final = 8
_FIRST_GUESS_BYTES_MIN: Final = 64 * 1024


class Compression(enum.IntEnum):
    NONE = 0
    GZIP = 1
    SNAPPY = 2
    LZ4 = 3
    ZSTD = 4


def compress(codec: Compression, data: bytes) -> bytes:
    if codec == Compression.NONE:
        return data
    if codec == Compression.GZIP:
        return bytes(cramjam.gzip.compress(data))
    if codec == Compression.SNAPPY:
        return _xerial_compress(data)
    if codec == Compression.LZ4:
        lz4 = cramjam.lz4.Compressor(block_linked=False, content_checksum=False)
        lz4.compress(data)
        return bytes(lz4.finish())
    return bytes(cramjam.zstd.compress(data))


def decompress(
    codec: int, data: bytes | memoryview, bytes_max: int = DECOMPRESSED_BYTES_MAX
) -> bytes:
    if codec == Compression.NONE:
        return bytes(data)
    if codec == Compression.SNAPPY:
        return _snappy_decompress(bytes(data), bytes_max)
    into = _INTO.get(codec)
    if into is None:
        raise KafkaProtocolError(UNSUPPORTED_COMPRESSION_TYPE, f"compression codec {codec}")
    return _bounded(into, bytes(data), bytes_max, Compression(codec).name)


_INTO: dict[int, Callable[[bytes, bytearray], int]] = {
    Compression.GZIP: cramjam.gzip.decompress_into,
    Compression.LZ4: cramjam.lz4.decompress_into,
    Compression.ZSTD: cramjam.zstd.decompress_into,
}


def _bounded(
    into: Callable[[bytes, bytearray], int], data: bytes, bytes_max: int, name: str
) -> bytes:
    size = min(bytes_max, max(_FIRST_GUESS_BYTES_MIN, len(data) * _FIRST_GUESS_RATIO))
    while True:
        # One spare byte: output that fills the buffer exactly may have been cut short.
        buf = bytearray(size + 1)
        try:
            written = into(data, buf)
        except cramjam.DecompressionError as exc:
            if "whole buffer" not in str(exc):
                raise corrupt(f"{name}: {exc}") from exc
            written = len(buf)
        if written <= size:
            return bytes(buf[:written])
        if size >= bytes_max:
            raise KafkaProtocolError(
                RECORD_LIST_TOO_LARGE, f"{name} records decompress to over {bytes_max} bytes"
            )
        size = min(bytes_max, size * 2)


def _xerial_compress(data: bytes) -> bytes:
    out = bytearray(_XERIAL_HEADER.pack(_XERIAL_MAGIC, 1, 1))
    for start in range(0, len(data), _XERIAL_BLOCK_BYTES):
        block = bytes(cramjam.snappy.compress_raw(data[start : start + _XERIAL_BLOCK_BYTES]))
        out += _I32.pack(len(block)) + block
    return bytes(out)


def _snappy_decompress(data: bytes, bytes_max: int) -> bytes:
    if not data.startswith(_XERIAL_MAGIC):
        return _snappy_block(data, bytes_max)
    if len(data) < _XERIAL_HEADER.size:
        raise corrupt("snappy: truncated xerial header")
    out = bytearray()
    pos = _XERIAL_HEADER.size
    while pos < len(data):
        if len(data) - pos < _I32.size:
            raise corrupt("snappy: truncated block length")
        (length,) = _I32.unpack_from(data, pos)
        pos += _I32.size
        if length < 0 or length > len(data) - pos:
            raise corrupt(f"snappy: block length {length} past the end")
        out += _snappy_block(data[pos : pos + length], bytes_max - len(out))
        pos += length
    return bytes(out)


def _snappy_block(block: bytes, bytes_max: int) -> bytes:
    try:
        declared = cramjam.snappy.decompress_raw_len(block)
    except cramjam.DecompressionError as exc:
        raise corrupt(f"snappy: {exc}") from exc
    if declared > bytes_max:
        raise KafkaProtocolError(
            RECORD_LIST_TOO_LARGE, "snappy records decompress to over the bound"
        )
    try:
        return bytes(cramjam.snappy.decompress_raw(block))
    except cramjam.DecompressionError as exc:
        raise corrupt(f"snappy: {exc}") from exc
