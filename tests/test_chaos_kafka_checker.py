"""The chaos checker on Kafka-workload histories (issue 25), crafted by hand: keyed
records of idempotent producers in a topic's partitions (acknowledged by partition and
offset, or with an unknown outcome), a consumer group's consumed records and, after the
final drain, its committed offsets. Pure and fast: no cluster."""

from __future__ import annotations

from pathlib import Path

from ops.chaos.checker import (
    ANOMALIES,
    Attempt,
    CheckResult,
    Consumed,
    Event,
    GroupEnd,
    History,
    HistoryWriter,
    Outcome,
    Read,
    ReadEnd,
    check,
    load_history,
)

TOPIC = "chaos-kafka"
P0, P1 = f"{TOPIC}~0", f"{TOPIC}~1"
# Every count the checker fails a run on, and the two it reports beside them.
KAFKA_ANOMALIES = (*ANOMALIES, "unverified", "read_errors")


def sent(producer: str, seq: int) -> Attempt:
    """A keyed record of ``producer``: its value names the producer and sequence."""
    return Attempt(f"{producer}.{seq}", producer, producer, TOPIC, seq, float(seq))


def acked(producer: str, seq: int, stream: str, offset: int) -> Outcome:
    return Outcome(f"{producer}.{seq}", "ok", f"offset:{offset}", stream)


def log(stream: str, values: list[str]) -> list[Event]:
    """Both full readers read ``values`` at offsets 0, 1, ... of ``stream``."""
    out: list[Event] = []
    for reader in ("core", "readproxy"):
        out += [Read(reader, "full", stream, f"offset:{i}", v) for i, v in enumerate(values)]
        out.append(ReadEnd(reader, "full", stream, True))
    return out


def consumed(stream: str, values: list[str], consumer: str = "c1") -> list[Event]:
    return [Consumed(consumer, stream, f"offset:{i}", v) for i, v in enumerate(values)]


def drained(ends: dict[str, int], committed: dict[str, int] | None = None) -> list[Event]:
    committed = committed or ends
    return [GroupEnd("g", s, committed[s], end) for s, end in ends.items()]


def counts(result: CheckResult) -> dict[str, int]:
    return {name: getattr(result, name) for name in KAFKA_ANOMALIES}


def anomalies(result: CheckResult, **expected: int) -> None:
    want = dict.fromkeys(KAFKA_ANOMALIES, 0) | expected
    assert counts(result) == want, result.samples


def clean() -> list[Event]:
    """Two producers, keys on two partitions, every record consumed, commits at the end."""
    events: list[Event] = []
    for seq in range(4):
        events += [sent("a", seq), acked("a", seq, P0, seq)]
        events += [sent("b", seq), acked("b", seq, P1, seq)]
    p0, p1 = [f"a.{i}" for i in range(4)], [f"b.{i}" for i in range(4)]
    events += log(P0, p0) + log(P1, p1)
    events += consumed(P0, p0) + consumed(P1, p1)
    return events + drained({P0: 4, P1: 4})


def test_a_clean_kafka_history_has_no_anomaly() -> None:
    result = check(History.of(clean()))
    anomalies(result)
    assert result.ok and result.acked == 8 and result.consumed == 8


def test_a_lost_a_duplicated_and_a_reordered_record_are_each_found() -> None:
    """The issue's acceptance counts: one of each in one history, all three caught."""
    events: list[Event] = []
    for seq in range(4):
        events.append(sent("a", seq))
    # a.0 and a.1 acknowledged in order, yet the log has them swapped (reordered);
    # a.2 acknowledged but never in the log (lost); a.3 written twice (duplicated).
    events += [acked("a", 0, P0, 1), acked("a", 1, P0, 0), acked("a", 2, P0, 2)]
    events += [acked("a", 3, P0, 2)]
    log_values = ["a.1", "a.0", "a.3", "a.3"]
    events += log(P0, log_values) + consumed(P0, log_values) + drained({P0: 4})
    result = check(History.of(events))
    anomalies(result, lost=1, duplicated=1, reordered=1)
    assert result.samples["lost"] == [f"a.2 ({P0})"]
    assert result.samples["reordered"] == [f"a.1 (a on {P0})"]
    assert not result.ok


def test_unknown_outcome_present_once_or_absent_is_allowed_twice_is_not() -> None:
    """librdkafka's "unknown outcome" (a timed-out or purged idempotent record) may be
    in the log once or not at all; never twice."""
    base: list[Event] = [sent("a", 0), Outcome("a.0", "unknown", error="Local: Message timed out")]
    base += [sent("a", 1), Outcome("a.1", "unknown", error="Local: Purged in flight")]
    once = [*base, *log(P0, ["a.0"]), *consumed(P0, ["a.0"]), *drained({P0: 1})]
    result = check(History.of(once))
    anomalies(result)
    assert (result.unknown, result.recovered) == (2, 1)
    twice = [*base, *log(P0, ["a.0", "a.0"]), *consumed(P0, ["a.0", "a.0"])]
    anomalies(check(History.of([*twice, *drained({P0: 2})])), duplicated=1)


def test_acknowledged_without_an_offset_is_judged_by_presence_alone() -> None:
    """librdkafka acknowledges a retry the broker had written already without its
    offset: present once is fine, absent is lost."""
    events: list[Event] = [sent("a", 0), Outcome("a.0", "ok", None, P0)]
    events += [sent("a", 1), acked("a", 1, P0, 1)]
    anomalies(check(History.of([*events, *log(P0, ["a.0", "a.1"])])))
    anomalies(check(History.of([*events, *log(P0, ["a.9", "a.1"])])), lost=1, unexpected=1)


def test_a_consumed_record_the_log_does_not_hold_is_a_phantom() -> None:
    events = [*clean(), Consumed("c2", P0, "offset:1", "a.9")]
    result = check(History.of(events))
    anomalies(result, consumed_phantom=1)


def test_redelivery_to_another_member_is_allowed() -> None:
    """At least once: a record consumed again after a member died uncommitted."""
    events = [*clean(), *consumed(P0, ["a.0", "a.1"], consumer="c2")]
    result = check(History.of(events))
    anomalies(result)
    assert result.consumed == 10


def test_a_record_no_member_consumed_and_commits_short_of_the_end_are_found() -> None:
    events = [e for e in clean() if not (isinstance(e, Consumed) and e.value == "b.2")]
    events = [e for e in events if not isinstance(e, GroupEnd)]
    events += drained({P0: 4, P1: 4}, committed={P0: 4, P1: 3})
    result = check(History.of(events))
    anomalies(result, unconsumed=1, commit_behind=1)
    assert result.samples["unconsumed"] == [f"b.2 at {P1}@2"]


def test_a_drain_that_never_learnt_the_end_is_no_evidence() -> None:
    events: list[Event] = [e for e in clean() if not isinstance(e, GroupEnd)]
    events += drained({P0: -1, P1: 4}, committed={P0: -1, P1: 4})
    anomalies(check(History.of(events)), commit_behind=1)


def test_consumed_and_group_end_events_round_trip_through_history_files(tmp_path: Path) -> None:
    with HistoryWriter(tmp_path / "h" / "c1.jsonl") as history:
        for event in clean():
            history.record(event)
    loaded = load_history(tmp_path / "h")
    assert len(loaded.consumed) == 8 and len(loaded.group_ends) == 2
    anomalies(check(loaded))
