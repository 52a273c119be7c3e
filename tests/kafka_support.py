"""Test helpers for the Kafka codec: hypothesis strategies drawn from the message
tables themselves (any field of any table is generated at any version), and the
kafka-python classes used as the byte-for-byte oracle."""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

from kafkaapi.protocol.schema import Arr, F, S, in_range

_INTS = {
    "int8": 8,
    "int16": 16,
    "int32": 32,
    "int64": 64,
}


def value_of(kind: str | Arr | S, version: int, flexible: bool) -> st.SearchStrategy[Any]:
    if isinstance(kind, Arr):
        return st.lists(value_of(kind.item, version, flexible), max_size=3)
    if isinstance(kind, S):
        return struct_of(kind, version, flexible)
    if kind in _INTS:
        bits = _INTS[kind]
        return st.integers(-(1 << (bits - 1)), (1 << (bits - 1)) - 1)
    simple: dict[str, st.SearchStrategy[Any]] = {
        "uint16": st.integers(0, 0xFFFF),
        "uint32": st.integers(0, 0xFFFFFFFF),
        "float64": st.floats(allow_nan=False),
        "bool": st.booleans(),
        "string": st.text(max_size=12),
        "bytes": st.binary(max_size=16),
        "records": st.binary(max_size=16),
        "uuid": st.uuids().map(lambda u: uuid.UUID(int=u.int)),
    }
    return simple[kind]


def field_of(f: F, version: int, flexible: bool) -> st.SearchStrategy[Any]:
    value = value_of(f.type, version, flexible)
    if in_range(version, f.nullable):
        return st.none() | value
    return value


def present(f: F, version: int, flexible: bool) -> bool:
    if not in_range(version, f.versions):
        return False
    return f.tag is None or (flexible and in_range(version, f.tagged))


def struct_of(struct: S, version: int, flexible: bool) -> st.SearchStrategy[dict[str, Any]]:
    return st.fixed_dictionaries(
        {
            f.name: field_of(f, version, flexible)
            for f in struct.fields
            if present(f, version, flexible)
        }
    )


def kafka_python_classes() -> dict[str, Any]:
    """kafka-python's message classes by schema name (``MetadataRequest``, ...)."""
    import kafka.protocol.admin
    import kafka.protocol.consumer
    import kafka.protocol.metadata
    import kafka.protocol.producer
    from kafka.protocol.api_message import ApiMessage

    del kafka  # imported for their classes' registration only
    found: dict[str, Any] = {}
    pending: list[Any] = [ApiMessage]
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        if getattr(cls, "_class_version", None) is None and getattr(cls, "_json", None):
            found.setdefault(cls.name, cls)
    return found


# -- fuzz targets (tests/test_kafka_fuzz.py with hypothesis, tests/fuzz/ with atheris) --
# Each feeds bytes to a decoder; returning or raising KafkaProtocolError is fine.


def _api_and_version(selector: bytes) -> tuple[Any, int]:
    from kafkaapi.protocol.messages import APIS

    apis = sorted(APIS.values(), key=lambda api: api.key)
    api = apis[selector[0] % len(apis)]
    low, high = api.versions
    return api, low + selector[1] % (high - low + 1)


def fuzz_request(data: bytes) -> None:
    """A well-formed header for the API and version the first two bytes pick, then the
    fuzzer's body: reaches every table at every version."""
    from kafkaapi.protocol.messages import decode_request

    if len(data) < 2:
        return
    api, version = _api_and_version(data)
    header = struct.pack(">hhih", api.key, version, 1, -1)
    if in_range(version, api.flexible):
        header += b"\x00"
    decode_request(header + data[2:])


def fuzz_response(data: bytes) -> None:
    from kafkaapi.protocol.messages import decode_response

    if len(data) < 2:
        return
    api, version = _api_and_version(data)
    decode_response(api, version, b"\x00\x00\x00\x01" + data[2:])


def fuzz_frames(data: bytes) -> None:
    """Bytes as a connection reads them, cut by the first byte; the buffer stays under
    one frame and its prefix."""
    from kafkaapi.protocol.frames import NEED_DATA, FrameReader

    if not data:
        return
    chunk = data[0] + 1
    reader = FrameReader(frame_bytes_max=1024)
    rest = data[1:]
    for start in range(0, len(rest), chunk):
        reader.feed(rest[start : start + chunk])
        while reader.next_frame() is not NEED_DATA:
            pass
        assert reader.buffered_bytes <= 1024 + 4


def fuzz_batches(data: bytes) -> None:
    from kafkaapi.protocol.records import decode_batches

    decode_batches(data, bytes_max=1 << 20)


def fuzz_batch_sealed(data: bytes) -> None:
    """The fuzzer's attributes and records under a right magic, length and CRC: reaches
    decompression and the record decoder."""
    import crc32c

    from kafkaapi.protocol.records import decode_batch

    tail = data[:40].ljust(40, b"\x00") + data[40:]  # attributes .. records
    head = struct.pack(">qiib", 0, 9 + len(tail), 0, 2)
    decode_batch(head + struct.pack(">I", crc32c.crc32c(tail)) + tail, bytes_max=1 << 20)


class MemberProcess:
    """A group member running ``script`` in a process of its own (so a test can kill -9
    it), printing how many partitions it holds, one line per poll; ``held`` is the last
    count printed. :meth:`stop` kills it (if still running) and closes its pipe."""

    def __init__(self, script: Path, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(script), *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=os.environ.copy(),
        )
        self.held = 0
        threading.Thread(target=self._watch, daemon=True).start()

    def _watch(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.held = int(line)

    def kill(self) -> None:
        """kill -9: the member never leaves its group."""
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def stop(self) -> None:
        self.kill()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
