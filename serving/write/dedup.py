"""Idempotent writes: which producer sequences a stream already holds. Pure, no I/O.

A request carries ``(producer, epoch, seq)``; its record ``i`` has sequence ``seq + i``
within the epoch. Per stream and producer the proxy remembers the current epoch, the
highest sequence written in it and the DLSNs and offsets (sequence ids in the stream) of
the last few batches (of any epoch). A record whose sequence is at or below the highest
written is a retry: it is not written again and its original DLSN and offset are
answered. A batch's records are consecutive in the stream, so its offsets are kept as a
``range`` (no object per record).

Epochs (Kafka's KIP-360): a producer whose batch failed for good cannot fill the hole
it left in its sequence, so it bumps its epoch and starts again at 0. A newer epoch
fences the older ones: from then on a request of an older epoch is answered from the
remembered batches when all of it was written, and refused with PRODUCER_FENCED
otherwise -- never appended after the new epoch's records.

What survives a failover is in the log itself: the first record the proxy writes for a
batch carries the batch's :class:`~streams.records.ProducerMarker` (producer, epoch,
first sequence, record count) in its record-set framing -- never in the user's headers
(format v2, :mod:`streams.recordset_layout`; logs written before carry it as ``bl.*``
headers, which the decoder turns into the same marker) -- and the batch's records are
contiguous in the stream (they are appended without yielding to the event loop). A new
owner reads the tail of the stream with its markers (:func:`rebuild`) and recovers the
same table, epochs included, and batches of which only a prefix made it into the log.
A user header, whatever its name, is never read as a marker.

A request ahead of its producer's next position waits a little for the ones before it
(they may travel over other connections); if they do not come, :func:`ahead_refusal`
says what it gets. A Kafka producer (``strict``) takes a later batch's success as the
acknowledgement of every earlier one, so a first sequence is only accepted where the
producer's history here says it follows: never "go on from here" over a gap.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, cast

from foundation.errors import (
    BooklineError,
    OutcomeUnknownError,
    OutOfOrderSequenceError,
    ProducerFencedError,
)
from foundation.invariants import invariant
from streams.dlsn import DLSNSequence
from streams.records import ProducerMarker, RecordColumns

DlsnT = tuple[int, int, int]

# What the first record of a producer batch says about the batch.
Marker = ProducerMarker

# A producer's position: (epoch, sequence). Every sequence of a later epoch comes after
# every sequence of an earlier one (the later epoch fences the earlier).
Pos = tuple[int, int]


class UnknownProducerError(OutOfOrderSequenceError):
    """A request that does not start a producer's history (sequence > 0) from a producer
    this stream's table does not know, while the table may have forgotten it (a
    takeover scans only the log's recent tail; the least recently used producers are
    dropped): its earlier sequences are neither known to be written nor known not to
    be. Nothing was written. Kafka's UNKNOWN_PRODUCER_ID, on which a producer with
    nothing else outstanding starts a new epoch at sequence 0 and one with earlier
    requests unanswered fails rather than guess. Over HTTP an OUT_OF_ORDER_SEQUENCE."""


def ahead_refusal(
    producer: str,
    stream: str,
    pos: Pos,
    expected: Pos | None,
    *,
    strict: bool,
    complete: bool,
) -> BooklineError | None:
    """What a request at ``pos`` gets when the ones before it did not arrive in time:
    ``expected`` is the producer's next position here (None: the producer is not
    known), ``complete`` whether the table holds every producer that ever wrote to the
    stream. None: write it (a thin-client producer whose history was forgotten goes on
    from here). Nothing of a refused request is written; an OUT_OF_ORDER_SEQUENCE is
    retriable, the gap being the earlier requests' to fill by being sent again."""
    epoch, seq = pos
    if expected is not None:
        if epoch > expected[0]:
            return OutOfOrderSequenceError(
                f"producer {producer} began epoch {epoch} on {stream} at sequence {seq}, "
                "not 0: nothing was written; send the epoch's earlier sequences first"
            )
        return OutOfOrderSequenceError(
            f"producer {producer} sent epoch {epoch} sequence {seq} to {stream} but "
            f"epoch {expected[0]} sequence {expected[1]} has not arrived; resend in order"
        )
    if not strict:
        return None
    if complete:
        # The table holds the whole stream: the producer never wrote here, so its
        # earlier sequences were not written (they failed, or are yet to be retried).
        return OutOfOrderSequenceError(
            f"producer {producer} has nothing in {stream} but sent sequence {seq} of "
            f"epoch {epoch}: its sequences before it were not written; resend in order"
        )
    return UnknownProducerError(
        f"producer {producer} is not known on {stream} (not in the log's recent tail) "
        f"and sent epoch {epoch} sequence {seq}: whether its earlier sequences are "
        "written is not known here; nothing was written"
    )


class Positioned(Protocol):
    @property
    def dlsn(self) -> DlsnT: ...

    @property
    def sequence_id(self) -> int: ...


def marked(records: RecordColumns, producer: str, epoch: int, first_seq: int) -> RecordColumns:
    """``records`` with the batch's marker on the first record (in the record framing:
    the records' own columns are handed on as they are)."""
    marker = ProducerMarker(producer, epoch, first_seq, len(records))
    return RecordColumns(records.payloads, records.keys, records.headers, records.txids,
                         records.timestamps, marker=marker)  # fmt: skip


@dataclass
class ProducerState:
    epoch: int = 0
    last_seq: int = -1  # the highest sequence written in ``epoch``
    # (epoch, first_seq, dlsns, offsets) of recent batches, oldest first; older epochs'
    # too, so a late retry of a batch that was written is still answered with its
    # positions.
    batches: deque[tuple[int, int, Sequence[DlsnT], Sequence[int]]] = field(default_factory=deque)

    def position_of(self, epoch: int, seq: int) -> tuple[DlsnT, int] | None:
        """The DLSN and offset of sequence ``seq`` of ``epoch``, if remembered."""
        for e, first, dlsns, offsets in reversed(self.batches):
            if e == epoch and first <= seq < first + len(dlsns):
                return dlsns[seq - first], offsets[seq - first]
        return None


@dataclass(frozen=True, slots=True)
class Plan:
    """What to do with a request: answer ``duplicates`` (DLSNs, and ``offsets``) for its
    first records, write the rest (``write_from`` onwards), their first sequence being
    ``first_new_seq``."""

    duplicates: list[DlsnT]
    write_from: int
    first_new_seq: int
    offsets: list[int] = field(default_factory=list)  # the duplicates' offsets


class DedupTable:
    """One stream's producers; least recently used forgotten first."""

    def __init__(
        self, batches_per_producer: int, producers_max: int, *, complete: bool = False
    ) -> None:
        self._batches_max = batches_per_producer
        self._producers_max = producers_max
        self._producers: OrderedDict[str, ProducerState] = OrderedDict()
        # Every producer that ever wrote to the stream is here (its takeover scan read
        # the whole stream, and none was forgotten since): a producer not found never
        # wrote. Cleared for good by the first producer forgotten.
        self.complete = complete

    def __len__(self) -> int:
        return len(self._producers)

    def state(self, producer: str) -> ProducerState | None:
        return self._producers.get(producer)

    def plan(self, producer: str, epoch: int, seq: int, count: int) -> Plan:
        state = self._producers.get(producer)
        if state is None or epoch > state.epoch:
            return Plan([], 0, seq)  # a new producer, or a new epoch of it
        if epoch < state.epoch:
            return self.plan_fenced(producer, epoch, seq, count, state.epoch)
        if seq > state.last_seq:
            return Plan([], 0, seq)
        self._producers.move_to_end(producer)
        dups: list[DlsnT] = []
        offsets: list[int] = []
        for s in range(seq, min(seq + count, state.last_seq + 1)):
            position = state.position_of(epoch, s)
            if position is None:
                # At or below the highest sequence written, but older than the batches
                # remembered: whether it is in the log is not known here (a producer
                # whose history was forgotten may have skipped it), so not a definite
                # failure.
                raise OutcomeUnknownError(
                    f"producer {producer} sequence {s} is older than the batches this "
                    "proxy remembers: it may or may not be in the log"
                )
            dups.append(position[0])
            offsets.append(position[1])
        return Plan(dups, len(dups), seq + len(dups), offsets)

    def plan_fenced(
        self, producer: str, epoch: int, seq: int, count: int, current_epoch: int
    ) -> Plan:
        """A request of an epoch older than ``current_epoch`` (written or on its way to
        the writer): all duplicates, or refused -- never written after the newer epoch."""
        state = self._producers.get(producer)
        found = (
            [] if state is None else [state.position_of(epoch, s) for s in range(seq, seq + count)]
        )
        if state is None or None in found:
            raise ProducerFencedError(
                f"producer {producer} epoch {epoch} is fenced by its epoch {current_epoch}: "
                f"sequences {seq}..{seq + count - 1} are not written by this request nor "
                "will be (what an earlier attempt wrote keeps its position)"
            )
        positions = cast("list[tuple[DlsnT, int]]", found)
        return Plan([d for d, _o in positions], count, seq + count, [o for _d, o in positions])

    def record(
        self,
        producer: str,
        epoch: int,
        first_seq: int,
        dlsns: Sequence[DlsnT],
        offsets: Sequence[int],
    ) -> None:
        """Remember a batch written: its records' DLSNs and offsets, in order."""
        if not dlsns:
            return
        invariant(len(offsets) == len(dlsns), "batch of %s: offsets miss records", producer)
        state = self._producers.get(producer)
        if state is None:
            state = self._producers[producer] = ProducerState(epoch)
            while len(self._producers) > self._producers_max:
                self._producers.popitem(last=False)
                self.complete = False
        else:
            self._producers.move_to_end(producer)
        state.batches.append((epoch, first_seq, _kept(dlsns), _compact(offsets)))
        while len(state.batches) > self._batches_max:
            state.batches.popleft()
        if epoch < state.epoch:
            # A batch of the older epoch was handed to the writer before the new epoch's
            # first one and answered after it: kept for retries, the epoch stays.
            return
        if epoch > state.epoch:
            state.epoch, state.last_seq = epoch, -1
        invariant(
            first_seq > state.last_seq,
            "producer %s epoch %d seq %d not after %d",
            producer,
            epoch,
            first_seq,
            state.last_seq,
        )
        state.last_seq = first_seq + len(dlsns) - 1


def rebuild(table: DedupTable, records: Iterable[tuple[Positioned, Marker | None]]) -> int:
    """Feed the stream's tail (in stream order: each record with the marker it carries,
    or None) into ``table``; returns batches found."""
    batches = 0
    current: Marker | None = None
    dlsns: list[DlsnT] = []
    offsets: list[int] = []

    def close() -> None:
        nonlocal batches
        if current is not None and dlsns:
            state = table.state(current.producer)
            # A producer's epochs never go back in the log (older ones are fenced before
            # the writer); skip anything that would, and what is already recorded.
            if state is None or (current.epoch, current.seq) > (state.epoch, state.last_seq):
                table.record(current.producer, current.epoch, current.seq, dlsns, offsets)
                batches += 1

    for rec, marker in records:
        if marker is not None:
            close()
            current, dlsns = marker, [tuple(rec.dlsn)]  # type: ignore[list-item]
            offsets = [rec.sequence_id]
        elif current is not None and len(dlsns) < current.count:
            dlsns.append(tuple(rec.dlsn))  # type: ignore[arg-type]
            offsets.append(rec.sequence_id)
        else:
            close()
            current, dlsns, offsets = None, [], []
        if current is not None and len(dlsns) == current.count:
            close()
            current, dlsns, offsets = None, [], []
    close()
    return batches


def _kept(dlsns: Sequence[DlsnT]) -> Sequence[DlsnT]:
    """A batch's DLSNs to remember: the writer's answer as it is -- an immutable
    :class:`DLSNSequence`, one run per entry (copying it made a DLSN per record, a fifth
    of a proxy's CPU under batched writes) -- or a copy of anything else."""
    return dlsns if isinstance(dlsns, DLSNSequence) else list(dlsns)


def _compact(offsets: Sequence[int]) -> Sequence[int]:
    """Offsets of one batch as a ``range`` when consecutive (they are, unless the writer
    interleaved another call): one object instead of one per record."""
    if isinstance(offsets, range) or not offsets:
        return offsets
    first, last = offsets[0], offsets[-1]
    if last - first == len(offsets) - 1:
        return range(first, last + 1)
    return list(offsets)
