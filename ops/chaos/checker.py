"""The chaos checker: a run's history in, its anomalies out (pure, standard library only).

A *history* is what the workload saw, one JSON object per line in files under one
directory (each writer process appends to its own file, so ``kill -9`` of a writer
loses nothing it recorded; an attempt is written *before* its request is sent):

* ``{"t": "attempt", "value", "client", "producer", "stream", "seq", "time"}`` -- a
  write of the unique ``value``; ``seq`` orders one producer's attempts.
* ``{"t": "outcome", "value", "status", "position", "stream", "error", "time"}`` --
  ``status`` is ``ok`` (acknowledged at ``position``, a DLSN ``"s:e:slot"`` or
  ``"offset:N"`` for topic sends, in ``stream`` -- a topic send learns its partition
  here), ``failed`` (refused; certainly not written) or ``unknown`` (timeout, lost
  connection, OUTCOME_UNKNOWN: maybe written). No outcome at all (the writer was
  killed) counts as unknown.
* ``{"t": "read", "reader", "kind", "stream", "position", "value"}`` -- one record as
  one read path saw it in the final reads (positions in a topic's partitions are
  offsets, what topic sends are acknowledged with; DLSNs elsewhere). ``kind`` is ``full`` (a read of
  the whole stream: read proxy, core library) or ``replica`` (one bookie's copies of
  the entries it holds: partial by nature).
* ``{"t": "read_end", "reader", "kind", "stream", "complete", "error"}`` -- whether that
  reader read the stream to its end; an incomplete full read checks nothing.
* ``{"t": "consumed", "consumer", "stream", "position", "value"}`` -- one record a
  consumer of a group (the Kafka workload's) was handed, recorded before it commits.
* ``{"t": "group_end", "group", "stream", "committed", "end"}`` -- after the final drain,
  the group's committed offset of one partition and that partition's end offset.

:func:`check` reports, per Jepsen's queue and Kafka checkers:

* ``lost`` -- acknowledged, yet missing from a complete full read of its stream;
* ``duplicated`` -- one value at two positions (any reader);
* ``reordered`` -- one producer's acknowledged values on one stream appear in the log
  out of the order it wrote them (each value found before an earlier one counts once);
* ``inconsistent`` -- one position with two values across readers or replicas, a
  position one complete full read has and another lacks, or an acknowledgement naming
  a position where the log holds something else;
* ``unexpected`` -- read, but never attempted;
* ``failed_present`` -- refused for certain, yet read;
* ``recovered`` -- unknown outcome, yet present (allowed: the write did happen);
* ``consumed_phantom`` -- a group member consumed a value the complete full reads do
  not hold at that position;
* ``unconsumed`` -- a record of a partition the group drained that no member ever
  consumed (commits follow what was recorded, so at-least-once covers every record);
* ``commit_behind`` -- after the final drain, the group's committed offset of a
  partition is below its end.

``unverified`` counts acknowledged values whose stream had no complete full read (the
check could not judge them) and ``read_errors`` the incomplete full reads: both make a
run fail, since a check that could not look is no evidence.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

__all__ = [
    "ANOMALIES",
    "Attempt",
    "CheckResult",
    "Consumed",
    "Event",
    "GroupEnd",
    "History",
    "HistoryWriter",
    "Outcome",
    "Read",
    "ReadEnd",
    "check",
    "load_history",
    "parse_position",
]

Status = Literal["ok", "failed", "unknown"]
ReaderKind = Literal["full", "replica"]
# A position comparable across readers: a DLSN's three parts, or (offset,) for offsets.
Position = tuple[int, ...]

# The counts that make a run fail (``recovered`` is allowed).
ANOMALIES: Final = (
    "lost",
    "duplicated",
    "reordered",
    "inconsistent",
    "unexpected",
    "failed_present",
    "consumed_phantom",
    "unconsumed",
    "commit_behind",
)
# Values kept per anomaly as examples in the report (the counts are exact).
SAMPLES_MAX: Final = 10
# The file suffix of history files in a history directory.
HISTORY_SUFFIX: Final = ".jsonl"


@dataclass(frozen=True, slots=True)
class Attempt:
    value: str
    client: str  # the writer (process) that made it
    producer: str  # the producer id (a restarted writer is a new producer)
    stream: str  # the stream, or the topic for a topic send
    seq: int  # the producer's attempt number (its write order)
    time: float


@dataclass(frozen=True, slots=True)
class Outcome:
    value: str
    status: Status
    position: str | None = None  # "s:e:slot" or "offset:N" when ok
    stream: str | None = None  # where it was acknowledged (a topic send's partition)
    error: str | None = None
    time: float = 0.0


@dataclass(frozen=True, slots=True)
class Read:
    reader: str  # "readproxy", "core", "replica:bookie-1", ...
    kind: ReaderKind
    stream: str
    position: str  # "s:e:slot"; "offset:N" in topic partitions (what acks name there)
    value: str


@dataclass(frozen=True, slots=True)
class ReadEnd:
    reader: str
    kind: ReaderKind
    stream: str
    complete: bool
    error: str | None = None


@dataclass(frozen=True, slots=True)
class Consumed:
    consumer: str  # the consumer process (incarnation) of the group
    stream: str  # the partition's stream, ``TOPIC~P``
    position: str  # "offset:N"
    value: str


@dataclass(frozen=True, slots=True)
class GroupEnd:
    group: str
    stream: str
    committed: int  # the group's committed offset after the final drain
    end: int  # the partition's end offset (its high watermark) then


Event = Attempt | Outcome | Read | ReadEnd | Consumed | GroupEnd
_TAGS: Final[dict[type, str]] = {
    Attempt: "attempt",
    Outcome: "outcome",
    Read: "read",
    ReadEnd: "read_end",
    Consumed: "consumed",
    GroupEnd: "group_end",
}
_CLASSES: Final[dict[str, type]] = {tag: cls for cls, tag in _TAGS.items()}


def parse_position(text: str) -> Position:
    """``"s:e:slot"`` -> (s, e, slot); ``"offset:N"`` -> (N,). ValueError otherwise."""
    if text.startswith("offset:"):
        return (int(text[len("offset:") :]),)
    parts = text.split(":")
    if len(parts) != 3:
        raise ValueError(f"position must be 's:e:slot' or 'offset:N', got {text!r}")
    return tuple(int(p) for p in parts)


def encode_event(event: Event) -> str:
    """One history line (no newline)."""
    doc: dict[str, Any] = {"t": _TAGS[type(event)]}
    doc.update({name: getattr(event, name) for name in event.__slots__})
    return json.dumps(doc, separators=(",", ":"))


def decode_event(line: str) -> Event:
    """The event of one history line; ValueError naming what is wrong."""
    doc = json.loads(line)
    if not isinstance(doc, dict):
        raise ValueError(f"history line is not an object: {line[:80]!r}")
    cls = _CLASSES.get(doc.pop("t", None))
    if cls is None:
        raise ValueError(f"history line of unknown type: {line[:80]!r}")
    try:
        event: Event = cls(**doc)
    except TypeError as exc:
        raise ValueError(f"history line with wrong fields ({exc}): {line[:80]!r}") from exc
    return event


class HistoryWriter:
    """Appends events to one history file, each line with one ``write(2)`` on an
    ``O_APPEND`` descriptor: once :meth:`record` returns the line is in the kernel, so
    a ``kill -9`` of this process right after still leaves it in the file (fsync is
    not needed: the machine does not lose power in a chaos run, processes do)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._fd: int | None = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def record(self, event: Event) -> None:
        if self._fd is None:
            raise ValueError(f"history {self.path} is closed")
        os.write(self._fd, (encode_event(event) + "\n").encode())

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> HistoryWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


@dataclass
class History:
    attempts: list[Attempt] = field(default_factory=list)
    outcomes: list[Outcome] = field(default_factory=list)
    reads: list[Read] = field(default_factory=list)
    read_ends: list[ReadEnd] = field(default_factory=list)
    consumed: list[Consumed] = field(default_factory=list)
    group_ends: list[GroupEnd] = field(default_factory=list)

    def add(self, event: Event) -> None:
        if isinstance(event, Attempt):
            self.attempts.append(event)
        elif isinstance(event, Outcome):
            self.outcomes.append(event)
        elif isinstance(event, Read):
            self.reads.append(event)
        elif isinstance(event, ReadEnd):
            self.read_ends.append(event)
        elif isinstance(event, Consumed):
            self.consumed.append(event)
        else:
            self.group_ends.append(event)

    @classmethod
    def of(cls, events: Iterable[Event]) -> History:
        history = cls()
        for event in events:
            history.add(event)
        return history


def _lines(path: Path) -> Iterator[str]:
    """A file's complete lines: a last line without its newline is a writer killed
    in the middle of a write and is left out; a bad line elsewhere is an error."""
    text = path.read_text()
    lines = text.split("\n")
    if lines and lines[-1]:
        lines.pop()  # torn tail
    for line in lines:
        if line:
            yield line


def load_history(directory: Path) -> History:
    """Every event of every ``*.jsonl`` file under ``directory``."""
    history = History()
    for path in sorted(directory.rglob(f"*{HISTORY_SUFFIX}")):
        for number, line in enumerate(_lines(path), 1):
            try:
                history.add(decode_event(line))
            except ValueError as exc:
                raise ValueError(f"{path}:{number}: {exc}") from exc
    return history


# -- the check ---------------------------------------------------------------------------


@dataclass
class CheckResult:
    attempted: int = 0
    acked: int = 0
    failed: int = 0
    unknown: int = 0
    read_values: int = 0
    lost: int = 0
    duplicated: int = 0
    reordered: int = 0
    inconsistent: int = 0
    unexpected: int = 0
    failed_present: int = 0
    consumed_phantom: int = 0
    unconsumed: int = 0
    commit_behind: int = 0
    recovered: int = 0
    consumed: int = 0  # records handed to group members (re-deliveries included)
    unverified: int = 0
    read_errors: int = 0
    samples: dict[str, list[str]] = field(default_factory=dict)

    def note(self, anomaly: str, example: str) -> None:
        setattr(self, anomaly, getattr(self, anomaly) + 1)
        kept = self.samples.setdefault(anomaly, [])
        if len(kept) < SAMPLES_MAX:
            kept.append(example)

    @property
    def anomalies(self) -> int:
        return sum(getattr(self, name) for name in ANOMALIES)

    @property
    def valid(self) -> bool:
        """Could the check judge every acknowledged value?"""
        return self.unverified == 0 and self.read_errors == 0

    @property
    def ok(self) -> bool:
        return self.anomalies == 0 and self.valid

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            name: getattr(self, name)
            for name in (
                "acked",
                *ANOMALIES,
                "recovered",
                "attempted",
                "failed",
                "unknown",
                "read_values",
                "consumed",
                "unverified",
                "read_errors",
            )
        }
        out["samples"] = {k: v for k, v in self.samples.items() if v}
        return out


@dataclass
class _Index:
    """The history arranged for the check."""

    attempts: dict[str, Attempt]
    outcomes: dict[str, Outcome]
    # (reader, stream) -> [(position, value)] in read order, complete reads only
    full: dict[tuple[str, str], list[tuple[Position, str]]]
    # stream -> position -> {reader: value}, every read
    at: dict[str, dict[Position, dict[str, str]]]
    complete_streams: set[str]


def _index(history: History, result: CheckResult) -> _Index:
    attempts = {a.value: a for a in history.attempts}
    outcomes: dict[str, Outcome] = {}
    for outcome in history.outcomes:
        outcomes[outcome.value] = outcome  # the last word on a value counts
    ends: dict[tuple[str, str], bool] = {}
    for end in history.read_ends:
        if end.kind == "full":
            key = (end.reader, end.stream)
            ends[key] = ends.get(key, True) and end.complete
    for (reader, stream), complete in sorted(ends.items()):
        if not complete:
            result.note("read_errors", f"{reader} {stream}")
    full: dict[tuple[str, str], list[tuple[Position, str]]] = defaultdict(list)
    at: dict[str, dict[Position, dict[str, str]]] = defaultdict(lambda: defaultdict(dict))
    for read in history.reads:
        position = parse_position(read.position)
        key = (read.reader, read.stream)
        if read.kind == "full":
            if not ends.get(key, False):
                continue  # incomplete (or never ended): judges nothing
            full[key].append((position, read.value))
        previous = at[read.stream][position].setdefault(read.reader, read.value)
        if previous != read.value:
            result.note("inconsistent", f"{read.reader} {read.stream}@{read.position}")
    complete_streams = {stream for (_r, stream), ok in ends.items() if ok}
    return _Index(attempts, outcomes, full, at, complete_streams)


def _stream_of(attempt: Attempt, outcome: Outcome | None) -> str:
    if outcome is not None and outcome.stream:
        return outcome.stream
    return attempt.stream


def _check_positions(ix: _Index, result: CheckResult) -> None:
    """Two values at one position, or a position one complete full read lacks."""
    for stream, positions in sorted(ix.at.items()):
        full_readers = sorted(r for (r, s) in ix.full if s == stream)
        for position, seen in positions.items():
            values = set(seen.values())
            where = f"{stream}@{':'.join(map(str, position))}"
            if len(values) > 1:
                result.note("inconsistent", f"{where}: {sorted(values)}")
                continue
            # A replica may hold an entry a full read never reached only if that full
            # read is incomplete (then it is not in ix.full).
            missing = [r for r in full_readers if r not in seen]
            if missing and any(r in seen for r in full_readers):
                result.note("inconsistent", f"{where} missing from {missing}")


def _check_values(ix: _Index, result: CheckResult) -> dict[str, dict[str, Position]]:
    """Duplicates and unexpected values; returns each full reader's value -> position
    per stream (for the lost, order and acknowledgement checks)."""
    places: dict[str, set[tuple[str, Position]]] = defaultdict(set)
    for stream, positions in ix.at.items():
        for position, seen in positions.items():
            for value in set(seen.values()):
                places[value].add((stream, position))
    for value, where in sorted(places.items()):
        result.read_values += 1
        if len(where) > 1:
            result.note("duplicated", f"{value} at {sorted(where)}")
        if value not in ix.attempts:
            result.note("unexpected", value)
    found: dict[str, dict[str, Position]] = {}
    for (reader, stream), rows in ix.full.items():
        table = found.setdefault(f"{reader}\0{stream}", {})
        for position, value in rows:
            table.setdefault(value, position)
    return found


def _positions_in(found: dict[str, dict[str, Position]], stream: str) -> list[dict[str, Position]]:
    return [table for key, table in found.items() if key.split("\0", 1)[1] == stream]


def _ack_matches(outcome: Outcome, position: Position) -> bool:
    """Does the acknowledgement's position name where the value was read?"""
    return outcome.position is None or parse_position(outcome.position) == position


def _check_outcomes(
    ix: _Index, found: dict[str, dict[str, Position]], result: CheckResult
) -> dict[tuple[str, str], list[tuple[int, str]]]:
    """Lost, recovered, failed-yet-present and acknowledgements at the wrong place;
    returns each (producer, stream)'s acknowledged values as (seq, value)."""
    everywhere = {value for table in found.values() for value in table}
    acked_by: dict[tuple[str, str], list[tuple[int, str]]] = defaultdict(list)
    for value, attempt in ix.attempts.items():
        result.attempted += 1
        outcome = ix.outcomes.get(value)
        status = "unknown" if outcome is None else outcome.status
        if status == "failed":
            result.failed += 1
            if value in everywhere:
                result.note("failed_present", value)
            continue
        if status == "unknown":
            result.unknown += 1
            if value in everywhere:
                result.note("recovered", value)
            continue
        assert outcome is not None
        result.acked += 1
        stream = _stream_of(attempt, outcome)
        acked_by[(attempt.producer, stream)].append((attempt.seq, value))
        if stream not in ix.complete_streams:
            result.note("unverified", value)
            continue
        tables = _positions_in(found, stream)
        if not tables:
            result.note("unverified", value)
            continue
        if any(value not in table for table in tables):
            result.note("lost", f"{value} ({stream})")
            continue
        if not all(_ack_matches(outcome, table[value]) for table in tables):
            result.note("inconsistent", f"{value} acknowledged at {outcome.position}")
    return acked_by


def _check_order(
    found: dict[str, dict[str, Position]],
    acked_by: dict[tuple[str, str], list[tuple[int, str]]],
    result: CheckResult,
) -> None:
    """Per producer and stream, acknowledged values in write order must sit at
    increasing positions in every complete full read."""
    for (producer, stream), values in sorted(acked_by.items()):
        values.sort()
        out_of_order: set[str] = set()  # a value is counted once, whatever the readers
        for table in _positions_in(found, stream):
            highest: Position | None = None
            for _seq, value in values:
                position = table.get(value)
                if position is None:
                    continue  # lost: counted already
                if highest is not None and position < highest:
                    out_of_order.add(value)
                    continue
                highest = position
        for value in sorted(out_of_order):
            result.note("reordered", f"{value} ({producer} on {stream})")


def check(history: History) -> CheckResult:
    """Judge a history (see the module docstring for what is counted)."""
    result = CheckResult()
    ix = _index(history, result)
    _check_positions(ix, result)
    found = _check_values(ix, result)
    acked_by = _check_outcomes(ix, found, result)
    _check_order(found, acked_by, result)
    _check_group(history, ix, result)
    return result


def _check_group(history: History, ix: _Index, result: CheckResult) -> None:
    """What the group's members consumed against the complete full reads, and the
    group's end: its commits at every drained partition's end, every record consumed."""
    logs: dict[str, dict[Position, str]] = defaultdict(dict)  # stream -> the log
    for (_reader, stream), rows in ix.full.items():
        logs[stream].update(rows)
    seen: dict[str, set[Position]] = defaultdict(set)
    for c in history.consumed:
        result.consumed += 1
        position = parse_position(c.position)
        seen[c.stream].add(position)
        if c.stream in ix.complete_streams and logs[c.stream].get(position) != c.value:
            result.note("consumed_phantom", f"{c.value} at {c.stream}@{c.position} ({c.consumer})")
    for end in history.group_ends:
        if end.end < 0 or end.committed < end.end:  # an end not learnt is no evidence
            result.note("commit_behind", f"{end.group} {end.stream}: {end.committed} < {end.end}")
        for position, value in sorted(logs[end.stream].items()):
            if position not in seen[end.stream]:
                result.note("unconsumed", f"{value} at {end.stream}@{position[0]}")
