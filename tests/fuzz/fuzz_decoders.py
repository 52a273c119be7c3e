"""Long-running, coverage-guided fuzzing of the decoders with atheris (libFuzzer).

The default suite fuzzes the same decoders with hypothesis for a bounded number of
examples (tests/test_fuzz_decoders.py); this harness runs for as long as asked and
keeps a corpus. Each target feeds the bytes to one decoder: returning, or raising a
documented :class:`~foundation.errors.BooklineError`, is fine; any other exception is a
crash that libFuzzer reports with the input that caused it (``crash-<sha1>``). Run from
the repository root, for example::

    .venv/bin/python -m tests.fuzz.fuzz_decoders bookie-frames corpus/frames -max_total_time=3600
    .venv/bin/python -m tests.fuzz.fuzz_decoders --list

docs/security.md ("Hostile input") says more.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable

import atheris
import crc32c

_INSTRUMENTED = ["bookie", "streams", "httpapi", "metadata", "groups", "kafkaapi"]
with atheris.instrument_imports(include=_INSTRUMENTED):
    from bookie import protocol as p
    from bookie.protocol import frames
    from bookie.storage import entrylog_format, index, journal_format
    from foundation.errors import BooklineError
    from groups import log as group_log
    from groups import wire as group_wire
    from httpapi import recordsets, wire, writes
    from kafkaapi.protocol import frames as _kafka_frames  # noqa: F401 - instrumented here
    from kafkaapi.protocol import messages as _kafka_messages  # noqa: F401
    from kafkaapi.protocol import records as _kafka_records  # noqa: F401
    from metadata import serde
    from streams import recordset, recordset_layout
    from tests import kafka_support as kafka

Target = Callable[[bytes], object]


def _frames(data: bytes) -> None:
    """Bytes as a connection reads them, cut by the fuzzer's first byte."""
    if not data:
        return
    chunk = data[0] + 1
    decoder = p.Decoder(responses=bool(data[0] & 1), frame_bytes_max=1 << 16)
    rest = data[1:]
    for i in range(0, len(rest), chunk):
        decoder.feed(rest[i : i + chunk])
        assert decoder.buffered_bytes <= decoder.buffered_bytes_max
        while True:
            try:
                if decoder.next_frame() is p.NEED_DATA:
                    break
            except p.FrameBodyError:
                continue


_OPS = sorted(frames.OPS)


def _frames_sealed(data: bytes) -> None:
    """One frame with magic, version, lengths and CRC made right around the fuzzer's
    op, flags, status, meta and payload: reaches the op table's decoding."""
    if len(data) < 5:
        return
    op = _OPS[data[0] % len(_OPS)]
    responses = bool(data[0] & 0x80)
    kind = frames.KIND_RESPONSE if responses else frames.KIND_REQUEST
    status = int.from_bytes(data[2:4], "big") if responses else 0
    split = 5 + data[4] % max(1, len(data) - 4)
    frame = frames.encode_frame(op, kind, data[1] & frames.FLAGS_KNOWN, status, 1,
                                data[5:split], data[split:])  # fmt: skip
    decoder = p.Decoder(responses=responses)
    decoder.feed(frame)
    with contextlib.suppress(p.FrameBodyError):
        decoder.next_frame()


def _record_set(data: bytes) -> None:
    recordset.decode_read_records(data, "s", 1, 0, 0)


def _record_set_sealed(data: bytes) -> None:
    """The fuzzer's header and body with the CRC made right: reaches the body's parsing."""
    size = recordset_layout.HEADER.size
    if len(data) < size:
        return
    head, body = data[:size], data[size:]
    crc = recordset_layout.CRC.pack(crc32c.crc32c(body, crc32c.crc32c(head)))
    recordset.decode_read_records(head + crc + body, "s", 1, 0, 0)


def _group_log_sealed(data: bytes) -> None:
    group_log.decode(group_log._HEADER.pack(group_log.MAGIC, group_log.FORMAT,
                                            crc32c.crc32c(data)) + data)  # fmt: skip


def _recordsets(data: bytes) -> None:
    recordsets.decode(data)


def _journal(data: bytes) -> None:
    journal_format.scan(data, 0, len(data), name="fuzz", last=True)
    journal_format.scan(data, 0, len(data), name="fuzz", last=False, legacy=True)
    journal_format.decode_mark(data)


def _entry_log(data: bytes) -> None:
    list(entrylog_format.split_records(data))


def _index(data: bytes) -> None:
    try:
        index.decode_state(data)
    finally:
        index.decode_damage(data)


def _serde(data: bytes) -> None:
    serde.decode(data, "ledger", 3)


def _group_log(data: bytes) -> None:
    group_log.decode(data)


def _http_body(data: bytes) -> None:
    media = wire.MSGPACK if data[:1] == b"\x80" else wire.JSON
    body = wire.decode_body(data, media)
    for parse in (group_wire.parse_join, group_wire.parse_commit, group_wire.parse_reset):
        with contextlib.suppress(BooklineError):
            parse(body)
    writes.parse_write(body, records_max=1000)


TARGETS: dict[str, Target] = {
    "bookie-frames": _frames,
    "bookie-frames-sealed": _frames_sealed,
    "record-sets": _record_set,
    "record-sets-sealed": _record_set_sealed,
    "recordsets": _recordsets,
    "journal": _journal,
    "entry-log": _entry_log,
    "index": _index,
    "metadata-serde": _serde,
    "group-log": _group_log,
    "group-log-sealed": _group_log_sealed,
    "http-body": _http_body,
    # Kafka's wire protocol (kafkaapi/protocol): every table at every version, frames,
    # record batches as sent and with a right CRC around fuzzed contents.
    "kafka-requests": kafka.fuzz_request,
    "kafka-responses": kafka.fuzz_response,
    "kafka-frames": kafka.fuzz_frames,
    "kafka-batches": kafka.fuzz_batches,
    "kafka-batches-sealed": kafka.fuzz_batch_sealed,
}


def one_input(target: Target) -> Callable[[bytes], None]:
    def run(data: bytes) -> None:
        with contextlib.suppress(BooklineError):  # documented refusals; else a crash
            target(data)

    return run


def main(argv: list[str]) -> None:
    if len(argv) < 2 or argv[1] not in TARGETS:
        print(f"usage: {argv[0]} TARGET [libFuzzer options]; targets: {', '.join(TARGETS)}")
        sys.exit(0 if "--list" in argv else 2)
    target = TARGETS[argv[1]]
    atheris.Setup([argv[0], *argv[2:]], one_input(target))
    atheris.Fuzz()


if __name__ == "__main__":
    main(sys.argv)
