"""Positions in a log stream: :class:`DLSN` and :class:`StartPosition` (pure, no I/O).

A **DLSN** (DistributedLog sequence number) is ``(segment seqno, entry id, slot id)``:
the segment (one ledger) a record lives in, the ledger entry (one record set) inside it,
and the record's index inside that set. DLSNs are totally ordered in stream order.

Byte form (24 bytes, big-endian; the docs/core-api.md contract)::

    offset  size  field
    0       8     segment seqno   (signed)
    8       8     entry id        (signed)
    16      8     slot id         (signed)

For non-negative DLSNs (every real position) the bytes sort like the DLSNs, so they can
be used as keys in ordered stores. No version byte: the length is the format, and a
future form will have another length. String form: ``"seg:entry:slot"``.
"""

from __future__ import annotations

import bisect
import dataclasses
import enum
import itertools
import operator
import struct
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, Final, NamedTuple, overload

from foundation.errors import BadRequestError

__all__ = [
    "DLSN",
    "DLSN_BYTES",
    "DLSN_INITIAL",
    "DLSNRun",
    "DLSNSequence",
    "PositionKind",
    "StartPosition",
    "parse_dlsn",
]

_BARE = struct.Struct(">qqq")
DLSN_BYTES = _BARE.size  # 24


class DLSN(NamedTuple):
    """``(segment_seqno, entry_id, slot_id)``; a tuple, so ordering and hashing are free
    and creating one on the hot path is cheap."""

    segment_seqno: int
    entry_id: int
    slot_id: int

    def __bytes__(self) -> bytes:
        return _BARE.pack(*self)

    def __str__(self) -> str:
        return f"{self.segment_seqno}:{self.entry_id}:{self.slot_id}"

    @classmethod
    def from_bytes(cls, data: bytes) -> DLSN:
        if len(data) != DLSN_BYTES:
            raise BadRequestError(f"DLSN bytes must be {DLSN_BYTES} long, got {len(data)}")
        seg, entry, slot = _BARE.unpack(data)
        return cls(seg, entry, slot)

    @classmethod
    def parse(cls, text: str) -> DLSN:
        parts = text.strip().split(":")
        if len(parts) != 3:
            raise BadRequestError(f"DLSN must look like 'seg:entry:slot', got {text!r}")
        try:
            seg, entry, slot = (int(p) for p in parts)
        except ValueError as exc:
            raise BadRequestError(f"DLSN parts must be integers, got {text!r}") from exc
        return cls(seg, entry, slot)

    def next_slot(self) -> DLSN:
        return DLSN(self.segment_seqno, self.entry_id, self.slot_id + 1)


DLSN.__module__ = __name__
# The position before every record of a stream (segment seqnos start at 1).
DLSN_INITIAL = DLSN(1, 0, 0)

# Builds a DLSN (a tuple subclass) from a 3-tuple without a Python-level call.
_NEW_DLSN = tuple.__new__
# ``(segment_seqno, entry_id, first_slot, count)``: ``count`` consecutive slots of one
# entry, the shape in which a writer learns its records' positions.
DLSNRun = tuple[int, int, int, int]


class DLSNSequence(Sequence[DLSN]):
    """The DLSNs of a ``write_many``: an immutable sequence that stores one run per
    ledger entry the records went to and makes each DLSN when it is asked for.

    Why: the records of a batch sit in consecutive slots of a few entries, so the
    runs say everything; building 10,000 DLSN tuples per call was a fifth of the
    batched writer's CPU (docs/benchmarks.md, "Batched path, CPU per record"), mostly
    for callers that look at one of them or none. It behaves like the list it
    replaces: equal to a list of the same DLSNs (and to another DLSNSequence), indexes
    (negative too) and slices alike (a slice is a DLSNSequence, or a list for a step
    other than 1), raises IndexError/TypeError as a list does, ``+`` with a list gives a
    list, and it pickles. Unlike a list it cannot be changed, and is unhashable like one.
    """

    __slots__ = ("_ends", "_len", "_runs")

    def __init__(self, runs: Iterable[DLSNRun] = ()) -> None:
        kept = tuple(r for r in runs if r[3])  # an empty run holds no position
        for seg, entry, first, count in kept:
            if count < 0 or first < 0:
                raise BadRequestError(f"not a run of DLSNs: {(seg, entry, first, count)}")
        self._runs = kept
        # Index just past each run: bisect finds the run of an index.
        self._ends = list(itertools.accumulate(r[3] for r in kept))
        self._len = self._ends[-1] if kept else 0

    @property
    def runs(self) -> tuple[DLSNRun, ...]:
        """The runs, in order: ``(segment_seqno, entry_id, first_slot, count)``."""
        return self._runs

    def __len__(self) -> int:
        return self._len

    @overload
    def __getitem__(self, index: int) -> DLSN: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[DLSN]: ...

    def __getitem__(self, index: int | slice) -> DLSN | Sequence[DLSN]:
        if isinstance(index, slice):
            return self._slice(index)
        try:
            i = operator.index(index)
        except TypeError:
            raise TypeError(
                f"DLSNSequence indices must be integers or slices, not {type(index).__name__}"
            ) from None
        n = self._len
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("DLSNSequence index out of range")
        k = bisect.bisect_right(self._ends, i)
        seg, entry, first, count = self._runs[k]
        return _NEW_DLSN(DLSN, (seg, entry, first + count - (self._ends[k] - i)))

    def _slice(self, index: slice) -> Sequence[DLSN]:
        start, stop, step = index.indices(self._len)
        if step != 1:
            return [self[i] for i in range(start, stop, step)]
        runs: list[DLSNRun] = []
        begin = 0
        for (seg, entry, first, _count), end in zip(self._runs, self._ends, strict=True):
            lo, hi = max(start, begin), min(stop, end)
            if lo < hi:
                runs.append((seg, entry, first + lo - begin, hi - lo))
            begin = end
        return DLSNSequence(runs)

    def __iter__(self) -> Iterator[DLSN]:
        repeat = itertools.repeat
        return itertools.chain.from_iterable(
            map(_NEW_DLSN, repeat(DLSN, count),
                zip(repeat(seg, count), repeat(entry, count), range(first, first + count),
                    strict=True))
            for seg, entry, first, count in self._runs
        )  # fmt: skip

    def __reversed__(self) -> Iterator[DLSN]:
        return reversed(list(self))

    def __contains__(self, value: object) -> bool:
        if not (isinstance(value, tuple) and len(value) == 3):
            return False
        seg, entry, slot = value
        return any(
            seg == s and entry == e and first <= slot < first + count
            for s, e, first, count in self._runs
        )

    def __eq__(self, other: object) -> bool:
        if isinstance(other, DLSNSequence):
            return self._len == other._len and list(self) == list(other)
        if isinstance(other, list):
            return self._len == len(other) and list(self) == other
        return NotImplemented

    def __ne__(self, other: object) -> bool:
        equal = self.__eq__(other)
        return equal if equal is NotImplemented else not equal

    __hash__ = None  # type: ignore[assignment]  # equal to lists, so unhashable like them

    def __add__(self, other: object) -> list[DLSN]:
        if isinstance(other, list | DLSNSequence):
            return [*self, *other]
        return NotImplemented

    def __radd__(self, other: object) -> list[DLSN]:
        if isinstance(other, list):
            return [*other, *self]
        return NotImplemented

    def __repr__(self) -> str:
        return f"DLSNSequence({list(self)!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (DLSNSequence, (self._runs,))


class PositionKind(enum.Enum):
    EARLIEST = "earliest"
    LATEST = "latest"
    DLSN = "dlsn"
    SEQUENCE = "sequence"
    TXID = "txid"
    TIMESTAMP = "timestamp"


@dataclasses.dataclass(frozen=True, slots=True)
class StartPosition:
    """Where a reader starts: the first record at or after the given point."""

    kind: PositionKind
    dlsn_value: DLSN | None = None  # for DLSN
    value: int = 0  # sequence id, txid or timestamp (ms)

    @classmethod
    def earliest(cls) -> StartPosition:
        return cls(PositionKind.EARLIEST)

    @classmethod
    def latest(cls) -> StartPosition:
        """After the last record written so far: only new records."""
        return cls(PositionKind.LATEST)

    @classmethod
    def dlsn(cls, dlsn: DLSN) -> StartPosition:
        return cls(PositionKind.DLSN, dlsn_value=DLSN(*dlsn))

    @classmethod
    def sequence(cls, sequence_id: int) -> StartPosition:
        return cls(PositionKind.SEQUENCE, value=_non_negative(sequence_id, "sequence id"))

    @classmethod
    def txid(cls, txid: int) -> StartPosition:
        return cls(PositionKind.TXID, value=txid)

    @classmethod
    def timestamp(cls, ms: int) -> StartPosition:
        return cls(PositionKind.TIMESTAMP, value=ms)

    @classmethod
    def parse(cls, text: str | None) -> StartPosition:
        """A start as text (the HTTP API's ``from``, the CLI's and the consumer's
        targets): ``earliest`` (also "" and None), ``latest``, ``dlsn:S:E:S`` (or a bare
        ``S:E:S``), ``seq:N``, ``txid:N`` or ``time:MS``; BadRequestError otherwise."""
        if text is None or text in {"", "earliest"}:
            return cls.earliest()
        if text == "latest":
            return cls.latest()
        kind, sep, rest = text.partition(":")
        if sep and kind in _TEXT_KINDS:
            try:
                value = int(rest)
            except ValueError as exc:
                raise BadRequestError(f"position {text!r}: {kind} needs an integer") from exc
            if value < 0:
                raise BadRequestError(f"position {text!r} must be non-negative")
            return cls(_TEXT_KINDS[kind], value=value)
        if kind == "dlsn":
            return cls.dlsn(parse_dlsn(rest))
        if text.count(":") == 2:
            return cls.dlsn(parse_dlsn(text))
        raise BadRequestError(
            f"position {text!r}: expected earliest, latest, DLSN, seq:N, txid:N or time:MS"
        )

    def __str__(self) -> str:
        """The text :meth:`parse` reads back (``dlsn:S:E:S``, ``seq:N``, ...)."""
        if self.kind is PositionKind.DLSN:
            return f"dlsn:{self.dlsn_value}"
        if self.kind in (PositionKind.EARLIEST, PositionKind.LATEST):
            return str(self.kind.value)
        return f"{_KIND_TEXT[self.kind]}:{self.value}"

    @classmethod
    def coerce(cls, start: StartPosition | DLSN | str | None) -> StartPosition:
        """Accept what ``open_reader`` accepts: a StartPosition, a DLSN, ``"earliest"``,
        ``"latest"`` or a DLSN string ``"seg:entry:slot"``."""
        if start is None:
            return cls.earliest()
        if isinstance(start, StartPosition):
            return start
        if isinstance(start, DLSN):
            return cls.dlsn(start)
        if isinstance(start, str):
            text = start.strip().lower()
            if text == "earliest":
                return cls.earliest()
            if text == "latest":
                return cls.latest()
            return cls.dlsn(DLSN.parse(text))
        raise BadRequestError(f"not a start position: {start!r}")


# The text prefixes of the integer kinds (``seq:N``, ...).
_TEXT_KINDS: Final = {
    "seq": PositionKind.SEQUENCE,
    "txid": PositionKind.TXID,
    "time": PositionKind.TIMESTAMP,
}
_KIND_TEXT: Final = {kind: text for text, kind in _TEXT_KINDS.items()}


def parse_dlsn(text: str) -> DLSN:
    """``seg:entry:slot`` with non-negative parts, strictly (what the HTTP API and
    :meth:`StartPosition.parse` accept; :meth:`DLSN.parse` also takes negatives)."""
    parts = text.split(":")
    if len(parts) != 3:
        raise BadRequestError(f"{text!r} is not a DLSN 'segment:entry:slot'")
    try:
        seg, entry, slot = (int(p) for p in parts)
    except ValueError as exc:
        raise BadRequestError(f"{text!r} is not a DLSN 'segment:entry:slot'") from exc
    if seg < 0 or entry < 0 or slot < 0:
        raise BadRequestError(f"{text!r}: DLSN parts must be non-negative")
    return DLSN(seg, entry, slot)


def _non_negative(value: int, what: str) -> int:
    if value < 0:
        raise BadRequestError(f"{what} must be >= 0, got {value}")
    return value
