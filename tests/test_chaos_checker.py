"""The chaos checker judges crafted histories: one test per anomaly, the allowed cases
(recovered, replicas holding a part), the history files (torn tail of a killed writer),
and -- in test_chaos_broken.py -- a deliberately broken build it must catch."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ops.chaos.checker import (
    Attempt,
    CheckResult,
    Event,
    History,
    HistoryWriter,
    Outcome,
    Read,
    ReadEnd,
    check,
    load_history,
    parse_position,
)

S = "s1"
FULL = ("core", "readproxy")


def attempt(value: str, seq: int, producer: str = "p1", stream: str = S) -> Attempt:
    return Attempt(value, "w1", producer, stream, seq, float(seq))


def ok(value: str, position: str, stream: str | None = S) -> Outcome:
    return Outcome(value, "ok", position, stream)


def reads(stream: str, rows: list[tuple[str, str]], readers: tuple[str, ...] = FULL) -> list[Event]:
    """Every reader reads ``rows`` (position, value) of ``stream`` completely."""
    out: list[Event] = []
    for reader in readers:
        out += [Read(reader, "full", stream, pos, value) for pos, value in rows]
        out.append(ReadEnd(reader, "full", stream, True))
    return out


def clean_history(n: int = 5) -> list[Event]:
    events: list[Event] = []
    rows = []
    for i in range(n):
        events += [attempt(f"v{i}", i), ok(f"v{i}", f"1:{i}:0")]
        rows.append((f"1:{i}:0", f"v{i}"))
    return events + reads(S, rows)


def only(result: CheckResult, **expected: int) -> None:
    """The anomalies are exactly ``expected`` (others 0)."""
    counts = {
        name: getattr(result, name)
        for name in (
            "lost",
            "duplicated",
            "reordered",
            "inconsistent",
            "unexpected",
            "failed_present",
            "unverified",
            "read_errors",
        )
    }
    want = dict.fromkeys(counts, 0) | expected
    assert counts == want, result.samples


def test_clean_history_has_no_anomaly() -> None:
    result = check(History.of(clean_history()))
    only(result)
    assert result.ok
    assert (result.attempted, result.acked, result.read_values) == (5, 5, 5)


def test_acknowledged_value_missing_from_the_final_read_is_lost() -> None:
    events = [*clean_history(3), attempt("v9", 9), ok("v9", "1:9:0")]
    result = check(History.of(events))
    only(result, lost=1)
    assert result.samples["lost"] == ["v9 (s1)"]
    assert not result.ok


def test_missing_from_one_full_reader_only_is_lost_and_inconsistent() -> None:
    events: list[Event] = [attempt("a", 0), ok("a", "1:0:0"), attempt("b", 1), ok("b", "1:1:0")]
    events += reads(S, [("1:0:0", "a"), ("1:1:0", "b")], readers=("core",))
    events += reads(S, [("1:0:0", "a")], readers=("readproxy",))
    only(check(History.of(events)), lost=1, inconsistent=1)


def test_value_at_two_positions_is_duplicated() -> None:
    events: list[Event] = [attempt("a", 0), ok("a", "1:0:0")]
    events += reads(S, [("1:0:0", "a"), ("1:1:0", "a")])
    result = check(History.of(events))
    only(result, duplicated=1)


def test_value_in_two_streams_is_duplicated() -> None:
    events: list[Event] = [attempt("a", 0), ok("a", "1:0:0")]
    events += reads(S, [("1:0:0", "a")]) + reads("s2", [("1:0:0", "a")])
    only(check(History.of(events)), duplicated=1)


def test_producer_order_broken_is_reordered() -> None:
    events: list[Event] = [attempt("a", 0), ok("a", "1:1:0"), attempt("b", 1), ok("b", "1:0:0")]
    events += reads(S, [("1:0:0", "b"), ("1:1:0", "a")])
    result = check(History.of(events))
    only(result, reordered=1, inconsistent=0)
    assert result.samples["reordered"] == ["b (p1 on s1)"]


def test_two_producers_interleaving_is_not_reordered() -> None:
    events: list[Event] = [
        attempt("a", 0, "p1"),
        ok("a", "1:1:0"),
        attempt("b", 0, "p2"),
        ok("b", "1:0:0"),
    ]
    events += reads(S, [("1:0:0", "b"), ("1:1:0", "a")])
    only(check(History.of(events)))


def test_order_of_unacknowledged_values_is_not_judged() -> None:
    events: list[Event] = [
        attempt("a", 0),
        Outcome("a", "unknown"),
        attempt("b", 1),
        ok("b", "1:0:0"),
    ]
    events += reads(S, [("1:0:0", "b"), ("1:1:0", "a")])
    result = check(History.of(events))
    only(result)
    assert result.recovered == 1


def test_two_values_at_one_position_across_readers_is_inconsistent() -> None:
    events: list[Event] = [
        attempt("a", 0),
        ok("a", "1:0:0"),
        attempt("b", 1),
        Outcome("b", "unknown"),
    ]
    events += reads(S, [("1:0:0", "a")], readers=("core",))
    events += reads(S, [("1:0:0", "b")], readers=("readproxy",))
    result = check(History.of(events))
    assert result.inconsistent >= 1
    assert not result.ok


def test_replicas_disagreeing_is_inconsistent() -> None:
    events = clean_history(2)
    events += [
        Read("replica:bookie-1", "replica", S, "1:0:0", "v0"),
        Read("replica:bookie-2", "replica", S, "1:0:0", "vX"),
    ]
    result = check(History.of(events))
    assert result.inconsistent == 1
    assert result.unexpected == 1  # vX was never written


def test_replica_holding_part_of_the_stream_is_fine() -> None:
    events = clean_history(3)
    events += [Read("replica:bookie-1", "replica", S, "1:1:0", "v1")]
    only(check(History.of(events)))


def test_acknowledgement_at_another_position_is_inconsistent() -> None:
    events: list[Event] = [attempt("a", 0), ok("a", "1:5:0"), *reads(S, [("1:0:0", "a")])]
    only(check(History.of(events)), inconsistent=1)


def test_topic_acknowledgement_by_offset_is_compared_with_the_read_offset() -> None:
    events: list[Event] = [attempt("a", 0, stream="topic"), ok("a", "offset:7", stream="t~0")]
    for reader in FULL:
        events += [Read(reader, "full", "t~0", "offset:7", "a")]
        events.append(ReadEnd(reader, "full", "t~0", True))
    only(check(History.of(events)))
    events[1] = ok("a", "offset:8", stream="t~0")
    only(check(History.of(events)), inconsistent=1)


def test_read_but_never_written_is_unexpected() -> None:
    events = clean_history(2) + reads("s2", [("1:0:0", "ghost")])
    only(check(History.of(events)), unexpected=1)


def test_certainly_refused_yet_present_is_an_anomaly() -> None:
    events: list[Event] = [attempt("a", 0), Outcome("a", "failed", error="BAD_REQUEST")]
    events += reads(S, [("1:0:0", "a")])
    only(check(History.of(events)), failed_present=1)


def test_unknown_outcome_present_is_recovered_and_absent_is_fine() -> None:
    events: list[Event] = [
        attempt("a", 0),
        Outcome("a", "unknown", error="TIMEOUT"),
        attempt("b", 1),
    ]
    events += reads(S, [("1:0:0", "a")])  # b: the writer died before an answer
    result = check(History.of(events))
    only(result)
    assert (result.recovered, result.unknown, result.acked) == (1, 2, 0)


def test_incomplete_full_read_makes_the_check_invalid() -> None:
    events: list[Event] = [attempt("a", 0), ok("a", "1:0:0")]
    events += [Read("core", "full", S, "1:0:0", "a"), ReadEnd("core", "full", S, False, "TIMEOUT")]
    result = check(History.of(events))
    only(result, unverified=1, read_errors=1)
    assert not result.valid and not result.ok


def test_positions_parse() -> None:
    assert parse_position("3:4:5") == (3, 4, 5)
    assert parse_position("offset:12") == (12,)
    with pytest.raises(ValueError, match="s:e:slot"):
        parse_position("3:4")


def test_history_files_round_trip(tmp_path: Path) -> None:
    events = clean_history(3)
    with HistoryWriter(tmp_path / "h" / "w1.jsonl") as out:
        for event in events:
            out.record(event)
    history = load_history(tmp_path / "h")
    assert sorted(map(repr, History.of(events).attempts)) == sorted(map(repr, history.attempts))
    assert len(history.reads) == len(History.of(events).reads)
    only(check(history))


def test_torn_last_line_of_a_killed_writer_is_left_out(tmp_path: Path) -> None:
    path = tmp_path / "w.jsonl"
    with HistoryWriter(path) as out:
        out.record(attempt("a", 0))
    with open(path, "a") as fh:
        fh.write('{"t":"outcome","value":"a","sta')
    history = load_history(tmp_path)
    assert [a.value for a in history.attempts] == ["a"] and history.outcomes == []


def test_bad_line_in_the_middle_names_the_file_and_line(tmp_path: Path) -> None:
    (tmp_path / "w.jsonl").write_text('{"t":"attempt"}\n{"t":"nope"}\n')
    with pytest.raises(ValueError, match=r"w\.jsonl:1: .*wrong fields"):
        load_history(tmp_path)


def test_attempts_recorded_before_a_kill_9_count(tmp_path: Path) -> None:
    """A writer process killed -9 mid-run: every attempt it recorded is in the file."""
    script = textwrap.dedent(
        f"""
        import os, sys, time
        from pathlib import Path
        from ops.chaos.checker import Attempt, HistoryWriter
        out = HistoryWriter(Path({str(tmp_path / "w.jsonl")!r}))
        for i in range(100):
            out.record(Attempt(f"v{{i}}", "w", "p", "s", i, time.time()))
        print("recorded", flush=True)
        time.sleep(60)
        """
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, cwd=Path.cwd(), text=True
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "recorded"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()
    assert len(load_history(tmp_path).attempts) == 100
