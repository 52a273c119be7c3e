"""Idempotent writes: which producer sequences a stream already holds. Pure, no I/O.

A request carries ``(producer, seq)``; its record ``i`` has sequence ``seq + i``. Per
stream and producer the proxy remembers the highest sequence written and the DLSNs of
the last few batches. A record whose sequence is at or below the highest written is a
retry: it is not written again and its original DLSN is answered.

What survives a failover is in the log itself: the first record the proxy writes for a
batch carries the headers ``bl.producer`` (id), ``bl.seq`` (8 bytes big-endian) and
``bl.count`` (4 bytes big-endian), and the batch's records are contiguous in the stream
(they are appended without yielding to the event loop). A new owner reads the tail of
the stream (:func:`rebuild`) and recovers the same table, including batches of which
only a prefix made it into the log.
"""

from __future__ import annotations

import struct
from collections import OrderedDict, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from bookline.errors import OutcomeUnknownError
from bookline.http_api import PRODUCER_COUNT_HEADER, PRODUCER_HEADER, PRODUCER_SEQ_HEADER
from bookline.invariants import invariant

_SEQ = struct.Struct(">Q")
_COUNT = struct.Struct(">I")

DlsnT = tuple[int, int, int]


class HasHeaders(Protocol):
    @property
    def dlsn(self) -> DlsnT: ...

    @property
    def headers(self) -> dict[str, bytes] | None: ...


def marker_headers(producer: str, first_seq: int, count: int) -> dict[str, bytes]:
    return {
        PRODUCER_HEADER: producer.encode(),
        PRODUCER_SEQ_HEADER: _SEQ.pack(first_seq),
        PRODUCER_COUNT_HEADER: _COUNT.pack(count),
    }


def parse_marker(headers: dict[str, bytes] | None) -> tuple[str, int, int] | None:
    if not headers or PRODUCER_HEADER not in headers:
        return None
    try:
        producer = headers[PRODUCER_HEADER].decode()
        (seq,) = _SEQ.unpack(headers[PRODUCER_SEQ_HEADER])
        (count,) = _COUNT.unpack(headers[PRODUCER_COUNT_HEADER])
    except (KeyError, UnicodeDecodeError, struct.error):
        return None  # not one of ours (a user header can't start with bl., but be safe)
    return producer, seq, count


@dataclass
class ProducerState:
    last_seq: int = -1
    # (first_seq, dlsns) of recent batches, oldest first.
    batches: deque[tuple[int, list[DlsnT]]] = field(default_factory=deque)

    def dlsn_of(self, seq: int) -> DlsnT | None:
        for first, dlsns in reversed(self.batches):
            if first <= seq < first + len(dlsns):
                return dlsns[seq - first]
        return None


@dataclass(frozen=True, slots=True)
class Plan:
    """What to do with a request: answer ``duplicates`` for its first records, write
    the rest (``write_from`` onwards), their first sequence being ``first_new_seq``."""

    duplicates: list[DlsnT]
    write_from: int
    first_new_seq: int


class DedupTable:
    """One stream's producers; least recently used forgotten first."""

    def __init__(self, batches_per_producer: int, producers_max: int) -> None:
        self._batches_max = batches_per_producer
        self._producers_max = producers_max
        self._producers: OrderedDict[str, ProducerState] = OrderedDict()

    def __len__(self) -> int:
        return len(self._producers)

    def state(self, producer: str) -> ProducerState | None:
        return self._producers.get(producer)

    def plan(self, producer: str, seq: int, count: int) -> Plan:
        state = self._producers.get(producer)
        if state is None or seq > state.last_seq:
            return Plan([], 0, seq)
        self._producers.move_to_end(producer)
        dups: list[DlsnT] = []
        for s in range(seq, min(seq + count, state.last_seq + 1)):
            dlsn = state.dlsn_of(s)
            if dlsn is None:
                # At or below the highest sequence written, but older than the batches
                # remembered: whether it is in the log is not known here (a producer
                # whose history was forgotten may have skipped it), so not a definite
                # failure.
                raise OutcomeUnknownError(
                    f"producer {producer} sequence {s} is older than the batches this "
                    "proxy remembers: it may or may not be in the log"
                )
            dups.append(dlsn)
        return Plan(dups, len(dups), seq + len(dups))

    def record(self, producer: str, first_seq: int, dlsns: Sequence[DlsnT]) -> None:
        if not dlsns:
            return
        state = self._producers.get(producer)
        if state is None:
            state = self._producers[producer] = ProducerState()
            while len(self._producers) > self._producers_max:
                self._producers.popitem(last=False)
        else:
            self._producers.move_to_end(producer)
        invariant(first_seq > state.last_seq, "producer %s seq %d not after %d",
                  producer, first_seq, state.last_seq)
        state.batches.append((first_seq, list(dlsns)))
        while len(state.batches) > self._batches_max:
            state.batches.popleft()
        state.last_seq = first_seq + len(dlsns) - 1


def rebuild(table: DedupTable, records: Iterable[HasHeaders]) -> int:
    """Feed the stream's tail (in stream order) into ``table``; returns batches found."""
    batches = 0
    current: tuple[str, int, int] | None = None
    dlsns: list[DlsnT] = []

    def close() -> None:
        nonlocal batches
        if current is not None and dlsns:
            state = table.state(current[0])
            if state is None or current[1] > state.last_seq:
                table.record(current[0], current[1], dlsns)
                batches += 1

    for rec in records:
        marker = parse_marker(rec.headers)
        if marker is not None:
            close()
            current, dlsns = marker, [tuple(rec.dlsn)]  # type: ignore[list-item]
        elif current is not None and len(dlsns) < current[2]:
            dlsns.append(tuple(rec.dlsn))  # type: ignore[arg-type]
        else:
            close()
            current, dlsns = None, []
        if current is not None and len(dlsns) == current[2]:
            close()
            current, dlsns = None, []
    close()
    return batches
