"""The group log's codec and the coordinator's protocol, in process: a fake log writer
(records kept in memory, durability on the next loop turn) and fake topics, with an
injected clock. No ZooKeeper, no bookies; the real writer and processes are in
tests/test_groups_coordinator_*.py."""

from __future__ import annotations

import asyncio
from collections.abc import Collection

import pytest

from foundation.errors import (
    BadRequestError,
    BooklineError,
    ChecksumError,
    GroupNotEmptyError,
    NotAssignedError,
    NotFoundError,
    OutcomeUnknownError,
    OutOfRangeError,
    OwnershipLostError,
    ProtocolVersionError,
    SessionSuspendedError,
    StaleGenerationError,
    WriterFailedError,
)
from groups import log as group_log
from groups.assignors import TopicPartition
from groups.coordinator import CoordinatorConfig, GroupCoordinator
from groups.state import GroupState
from groups.wire import CommitRequest, HeartbeatRequest, JoinRequest, ResetPlan, ResetRequest
from streams.dlsn import DLSN
from streams.records import LogRecord
from tests.values import value
from tests.waiting import wait_for

SESSION = 6_000


class FakeLog:
    """Records in memory; each becomes durable on the next loop turn (or fails)."""

    def __init__(self) -> None:
        self.payloads: list[bytes] = []
        self.first = 0  # truncated before this index
        self.fail_with: Exception | None = None

    def write_nowait(self, record: LogRecord) -> asyncio.Future[DLSN]:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[DLSN] = loop.create_future()
        self.payloads.append(value(record))
        if self.fail_with is not None:
            loop.call_soon(fut.set_exception, self.fail_with)
        else:
            loop.call_soon(fut.set_result, DLSN(1, len(self.payloads) - 1, 0))
        return fut

    async def truncate(self, dlsn: DLSN) -> bool:
        self.first = dlsn.entry_id
        return True

    def records(self) -> list[group_log.GroupRecord]:
        return [group_log.decode(p) for p in self.payloads[self.first :]]

    def kinds(self) -> list[str]:
        return [type(r).__name__ for r in self.records()]


class FakeTopics:
    def __init__(self, counts: dict[str, int]) -> None:
        self.counts = dict(counts)
        self.ends: dict[TopicPartition, int] = {}
        self.starts: dict[TopicPartition, int] = {}
        self.end_reads = 0

    async def partition_counts(self, topics: Collection[str]) -> dict[str, int]:
        return {t: self.counts[t] for t in topics if t in self.counts}

    async def end_offset(self, tp: TopicPartition) -> int:
        self.end_reads += 1
        return self.ends.get(tp, 0)

    async def start_offset(self, tp: TopicPartition) -> int:
        return self.starts.get(tp, 0)

    async def offset_for_time(self, tp: TopicPartition, ms: int) -> int:
        return ms // 1000  # one record per second from offset 0


class Clock:
    def __init__(self) -> None:
        self.ms = 1_000_000

    def __call__(self) -> int:
        return self.ms


@pytest.fixture
def fakes() -> tuple[FakeLog, FakeTopics, Clock]:
    return FakeLog(), FakeTopics({"t": 4, "u": 2}), Clock()


def _coord(
    fakes: tuple[FakeLog, FakeTopics, Clock], config: CoordinatorConfig | None = None
) -> GroupCoordinator:
    wlog, topics, clock = fakes
    return GroupCoordinator("g", wlog, topics, config=config, clock_ms=clock)


def _join(topics: tuple[str, ...] = ("t",), **kw: object) -> JoinRequest:
    args: dict[str, object] = {"session_timeout_ms": SESSION, **kw}
    return JoinRequest(topics=topics, **args)  # type: ignore[arg-type]


def _replayed(wlog: FakeLog) -> tuple[GroupState, group_log.Replayed]:
    state = GroupState("g")
    return state, group_log.replay(state, wlog.records(), 0)


# -- the codec ---------------------------------------------------------------------------


def test_every_record_kind_round_trips() -> None:
    g = GroupState("g", {"t": 2})
    g.join(0, member_id=None, instance_id="i", topics=["t"], assignor="range",
           session_timeout_ms=SESSION)  # fmt: skip
    offsets = {("t", 0): 5, ("t", 1): 0, ("x", 7): 2**40}
    records: list[group_log.GroupRecord] = [
        group_log.Snapshot(g.snapshot()),
        group_log.Commit(3, "m-1", offsets),
        group_log.Reset(offsets),
        group_log.Deleted(),
        group_log.Full(g.snapshot(), offsets),
    ]
    for record in records:
        assert group_log.decode(group_log.encode(record)) == record


def test_damaged_or_foreign_records_are_refused_before_decoding() -> None:
    good = group_log.encode(group_log.Reset({("t", 0): 1}))
    flipped = good[:-1] + bytes([good[-1] ^ 1])
    with pytest.raises(ChecksumError, match="checksum"):
        group_log.decode(flipped)
    with pytest.raises(ChecksumError, match="magic"):
        group_log.decode(b"XYZ" + good[3:])
    with pytest.raises(ChecksumError, match="short"):
        group_log.decode(good[:5])
    with pytest.raises(ProtocolVersionError, match="format 2"):
        group_log.decode(good[:3] + b"\x02" + good[4:])
    import crc32c
    import msgpack

    body = msgpack.packb({"k": "future-kind"})
    header = b"BLG\x01" + crc32c.crc32c(body).to_bytes(4, "big")
    with pytest.raises(ProtocolVersionError, match="future-kind"):
        group_log.decode(header + body)
    body = msgpack.packb({"k": "commit", "gen": -1, "member": "m", "offsets": {}})
    header = b"BLG\x01" + crc32c.crc32c(body).to_bytes(4, "big")
    with pytest.raises(ChecksumError, match="malformed"):
        group_log.decode(header + body)


# -- membership --------------------------------------------------------------------------


async def test_join_heartbeat_and_a_second_member_with_cooperative_handoff(
    fakes: tuple[FakeLog, FakeTopics, Clock],
) -> None:
    wlog, _topics, _clock = fakes
    c = _coord(fakes)
    a = await c.join(_join())
    assert (a.generation, a.partitions) == (1, frozenset(("t", p) for p in range(4)))
    assert c.exists and wlog.kinds() == ["Snapshot"]
    await c.heartbeat(HeartbeatRequest(a.member_id, 1, a.partitions))  # consuming them
    b = await c.join(_join())
    assert b.generation == 2 and b.partitions == frozenset()  # a still owns them
    with pytest.raises(StaleGenerationError):
        await c.heartbeat(HeartbeatRequest(a.member_id, 1, a.partitions))
    again = await c.join(_join(member_id=a.member_id, owned=a.partitions))
    assert again.generation == 2 and again.member_id == a.member_id
    kept = again.partitions
    assert len(kept) == 2
    await c.heartbeat(HeartbeatRequest(a.member_id, 2, kept))  # gave the others up
    gen, got = await c.heartbeat(HeartbeatRequest(b.member_id, 2, frozenset()))
    assert gen == 2 and got == frozenset(("t", p) for p in range(4)) - kept
    assert c.rebalances == 2
    assert wlog.kinds() == ["Snapshot", "Snapshot"]  # heartbeats and rejoins log nothing


async def test_bad_joins_change_nothing(fakes: tuple[FakeLog, FakeTopics, Clock]) -> None:
    wlog, _topics, _clock = fakes
    c = _coord(fakes)
    await c.join(_join())
    before = c.state.snapshot()
    for req, match in [
        (_join(assignor="sticky-ish"), "unknown assignor 'sticky-ish'"),
        (_join(("nope",)), "unknown topic"),
        (_join(session_timeout_ms=10), "session timeout"),
        (_join(assignor="range"), "uses the 'cooperative-sticky' assignor"),
    ]:
        with pytest.raises(BadRequestError, match=match):
            await c.join(req)
    assert c.state.snapshot() == before and len(wlog.payloads) == 1


async def test_static_member_restart_takes_its_place_without_a_rebalance(
    fakes: tuple[FakeLog, FakeTopics, Clock],
) -> None:
    wlog, _topics, _clock = fakes
    c = _coord(fakes)
    first = await c.join(_join(instance_id="host-1"))
    second = await c.join(_join(instance_id="host-1"))
    assert second.generation == first.generation and second.member_id != first.member_id
    assert second.partitions == first.partitions
    with pytest.raises(StaleGenerationError):  # the old incarnation is fenced
        await c.commit(CommitRequest(first.member_id, first.generation, {("t", 0): 0}))
    assert len(wlog.payloads) == 2  # the new member id is logged
    state, _r = _replayed(wlog)
    assert set(state.members) == {second.member_id}


async def test_sessions_expire_on_the_injected_clock(
    fakes: tuple[FakeLog, FakeTopics, Clock],
) -> None:
    wlog, _topics, clock = fakes
    c = _coord(fakes)
    a = await c.join(_join())
    b = await c.join(_join())
    clock.ms += SESSION - 1
    await c.heartbeat(HeartbeatRequest(b.member_id, 2, frozenset()))
    assert await c.expire_due() == []
    clock.ms += 2
    assert await c.expire_due() == [a.member_id]
    assert c.state.generation == 3 and list(c.state.members) == [b.member_id]
    assert wlog.kinds()[-1] == "Snapshot"
    with pytest.raises(StaleGenerationError, match="join again"):
        await c.heartbeat(HeartbeatRequest(a.member_id, 3, frozenset()))


async def test_a_grown_topic_rebalances_on_refresh(
    fakes: tuple[FakeLog, FakeTopics, Clock],
) -> None:
    _wlog, topics, _clock = fakes
    c = _coord(fakes)
    a = await c.join(_join())
    topics.counts["t"] = 6
    await c.refresh()
    assert c.state.generation == a.generation + 1
    _gen, got = await c.heartbeat(HeartbeatRequest(a.member_id, c.state.generation, a.partitions))
    assert got == frozenset(("t", p) for p in range(6))
    topics.counts["t"] = 3  # never shrinks: kept, with a warning
    await c.refresh()
    assert c.state.partitions["t"] == 6


# -- offsets -----------------------------------------------------------------------------


async def test_commits_are_checked_and_durable_before_the_answer(
    fakes: tuple[FakeLog, FakeTopics, Clock],
) -> None:
    wlog, topics, _clock = fakes
    c = _coord(fakes)
    a = await c.join(_join())
    b = await c.join(_join(("u",)))
    a = await c.join(_join(member_id=a.member_id, owned=a.partitions))
    topics.ends[("t", 0)] = 10
    await c.commit(CommitRequest(a.member_id, a.generation, {("t", 0): 10}))
    assert c.committed() == {("t", 0): 10} and wlog.kinds()[-1] == "Commit"
    n = len(wlog.payloads)
    refused: list[tuple[CommitRequest, type[Exception], str]] = [
        (CommitRequest(a.member_id, 1, {("t", 0): 1}), StaleGenerationError, "stale"),
        (CommitRequest("who", a.generation, {("t", 0): 1}), StaleGenerationError, "not in"),
        (CommitRequest(a.member_id, a.generation, {("u", 0): 1}), NotAssignedError, "u"),
        (
            CommitRequest(a.member_id, a.generation, {("t", 0): 11}),
            OutOfRangeError,
            "end offset 10",
        ),
    ]
    for req, err, match in refused:
        with pytest.raises(err, match=match):
            await c.commit(req)
    assert len(wlog.payloads) == n and c.committed() == {("t", 0): 10}
    # Beyond the cached end: the end is read again before the commit is refused.
    topics.ends[("t", 0)] = 15
    reads = topics.end_reads
    await c.commit(CommitRequest(a.member_id, a.generation, {("t", 0): 15}))
    assert topics.end_reads == reads + 1
    await c.commit(CommitRequest(a.member_id, a.generation, {("t", 0): 12}))  # cached: no read
    assert topics.end_reads == reads + 1 and c.committed()[("t", 0)] == 12
    assert b.member_id in c.state.members


async def test_lag_before_and_after_commits(fakes: tuple[FakeLog, FakeTopics, Clock]) -> None:
    _wlog, topics, _clock = fakes
    c = _coord(fakes)
    a = await c.join(_join(("u",)))
    topics.ends.update({("u", 0): 100, ("u", 1): 40})
    topics.starts[("u", 1)] = 10  # retention dropped 0..9
    d = await c.describe()
    lags = {(p["topic"], p["partition"]): p["lag"] for p in d["partitions"]}
    assert lags == {("u", 0): 100, ("u", 1): 30} and d["lag"] == 130
    assert d["state"] == "stable" and d["members"][0]["member_id"] == a.member_id
    await c.commit(CommitRequest(a.member_id, a.generation, {("u", 0): 60, ("u", 1): 40}))
    assert c.stats().lag == {("u", 0): 40, ("u", 1): 0}
    d = await c.describe()
    assert [p["committed"] for p in d["partitions"]] == [60, 40] and d["lag"] == 40


async def test_reset_is_refused_while_members_live(
    fakes: tuple[FakeLog, FakeTopics, Clock],
) -> None:
    wlog, topics, _clock = fakes
    c = _coord(fakes)
    a = await c.join(_join(("u",)))
    topics.ends.update({("u", 0): 100, ("u", 1): 40})
    topics.starts.update({("u", 0): 5})
    n = len(wlog.payloads)
    with pytest.raises(GroupNotEmptyError, match="live member"):
        await c.reset(ResetRequest("earliest"))
    with pytest.raises(GroupNotEmptyError):
        await c.delete()
    assert len(wlog.payloads) == n
    await c.leave(a.member_id)
    assert (await c.reset(ResetRequest("earliest"))).offsets == {("u", 0): 5, ("u", 1): 0}
    latest = await c.reset(ResetRequest("latest", topics=("u",)))
    assert latest.offsets == {("u", 0): 100, ("u", 1): 40}
    assert (await c.reset(ResetRequest("offset", 20))).offsets == {("u", 0): 20, ("u", 1): 20}
    assert (await c.reset(ResetRequest("datetime", 7_500))).offsets == {("u", 0): 7, ("u", 1): 7}
    n = len(wlog.payloads)
    with pytest.raises(NotFoundError, match="nope"):
        await c.reset(ResetRequest("earliest", topics=("nope",)))
    assert len(wlog.payloads) == n and c.committed() == {("u", 0): 7, ("u", 1): 7}


async def test_reset_dry_run_changes_nothing_and_an_offset_past_the_end_is_clamped(
    fakes: tuple[FakeLog, FakeTopics, Clock],
) -> None:
    """Issue 22 (11): Kafka's tool shows the plan and applies it only with --execute,
    and clamps an offset past a partition's end to that end (saying so)."""
    wlog, topics, _clock = fakes
    c = _coord(fakes)
    a = await c.join(_join(("u",)))
    await c.leave(a.member_id)
    topics.ends.update({("u", 0): 100, ("u", 1): 40})
    before, n = c.committed(), len(wlog.payloads)
    plan = await c.reset(ResetRequest("offset", 41, dry_run=True))
    assert plan.offsets == {("u", 0): 41, ("u", 1): 40} and plan.clamped == {("u", 1)}
    assert plan.dry_run and len(wlog.payloads) == n and c.committed() == before
    applied = await c.reset(ResetRequest("offset", 41))
    assert applied.clamped == {("u", 1)} and not applied.dry_run
    assert c.committed() == {("u", 0): 41, ("u", 1): 40} and len(wlog.payloads) == n + 1


# -- the log: replay, compaction, failures, delete --------------------------------------


async def test_replay_rebuilds_the_state_the_coordinator_had(
    fakes: tuple[FakeLog, FakeTopics, Clock],
) -> None:
    wlog, topics, _clock = fakes
    c = _coord(fakes)
    topics.ends.update({(t, p): 50 for t in "tu" for p in range(4)})
    a = await c.join(_join(("t", "u")))
    b = await c.join(_join(("t",), instance_id="s"))
    a = await c.join(_join(("t", "u"), member_id=a.member_id, owned=a.partitions))
    await c.commit(CommitRequest(a.member_id, a.generation, dict.fromkeys(a.partitions, 7)))
    await c.leave(b.member_id)  # static: stays
    state, replayed = _replayed(wlog)
    assert replayed.records == len(wlog.payloads) and not replayed.deleted
    assert state.snapshot() == c.state.snapshot() and state.offsets == c.state.offsets


async def test_compaction_writes_a_full_record_and_truncates_before_it(
    fakes: tuple[FakeLog, FakeTopics, Clock],
) -> None:
    wlog, topics, _clock = fakes
    c = _coord(fakes, CoordinatorConfig(compact_records=5))
    topics.ends.update({("t", p): 1000 for p in range(4)})
    a = await c.join(_join())
    for i in range(12):
        await c.commit(CommitRequest(a.member_id, a.generation, {("t", i % 4): i}))
        await asyncio.sleep(0)  # one turn: the compaction task runs between requests
    await wait_for(lambda: wlog.first > 0, "the compaction to truncate the log")
    assert wlog.kinds()[0] == "Full"
    assert len(wlog.records()) <= 6
    state, replayed = _replayed(wlog)
    assert state.offsets == c.state.offsets and state.snapshot() == c.state.snapshot()
    assert replayed.since_full < 5


async def test_a_failed_log_write_fails_the_coordinator(
    fakes: tuple[FakeLog, FakeTopics, Clock],
) -> None:
    wlog, topics, _clock = fakes
    failures: list[BaseException] = []
    c = GroupCoordinator("g", wlog, topics, clock_ms=fakes[2], on_fail=failures.append)
    topics.ends[("t", 0)] = 5
    a = await c.join(_join())
    wlog.fail_with = WriterFailedError("bookies gone")
    with pytest.raises(OutcomeUnknownError, match="log write failed"):
        await c.commit(CommitRequest(a.member_id, a.generation, {("t", 0): 5}))
    assert not c.usable and len(failures) == 1
    with pytest.raises(OwnershipLostError, match="failed; retry"):
        await c.heartbeat(HeartbeatRequest(a.member_id, a.generation, a.partitions))


async def test_delete_logs_the_deletion_and_replay_sees_no_group(
    fakes: tuple[FakeLog, FakeTopics, Clock],
) -> None:
    wlog, topics, _clock = fakes
    c = _coord(fakes)
    topics.ends[("t", 0)] = 5
    a = await c.join(_join())
    await c.commit(CommitRequest(a.member_id, a.generation, {("t", 0): 5}))
    await c.leave(a.member_id)
    generation = c.state.generation
    await c.delete()
    assert wlog.kinds()[-1] == "Deleted" and not c.usable
    state, replayed = _replayed(wlog)
    assert replayed.deleted and state.offsets == {} and state.members == {}
    assert state.generation == generation  # kept: no old member passes for a new one
    fresh = _coord(fakes)
    with pytest.raises(NotFoundError):
        await fresh.describe()


async def test_members_get_fresh_sessions_after_the_coordinator_could_not_serve(
    fakes: tuple[FakeLog, FakeTopics, Clock],
) -> None:
    """A suspended ZooKeeper session stops the coordinator answering; nobody could
    heartbeat meanwhile, so nobody is expired for it. A lost stream fails it for good."""
    wlog, topics, clock = fakes
    sick: list[BooklineError] = []
    failures: list[BaseException] = []

    def health() -> None:
        if sick:
            raise sick[0]

    c = GroupCoordinator("g", wlog, topics, clock_ms=clock, health=health, on_fail=failures.append)
    a = await c.join(_join())
    sick.append(SessionSuspendedError("ZooKeeper session not connected"))
    clock.ms += SESSION * 2
    with pytest.raises(SessionSuspendedError):
        await c.heartbeat(HeartbeatRequest(a.member_id, a.generation, a.partitions))
    with pytest.raises(SessionSuspendedError):
        await c.expire_due()
    sick.clear()
    assert await c.expire_due() == []  # fresh sessions from now
    assert list(c.state.members) == [a.member_id] and c.usable
    sick.append(OwnershipLostError("its log stream was dropped"))
    with pytest.raises(OwnershipLostError):
        await c.heartbeat(HeartbeatRequest(a.member_id, a.generation, a.partitions))
    assert c.failed is not None and len(failures) == 1


async def test_the_timers_expire_sessions_and_pick_up_grown_topics() -> None:
    """start(): the expiry timer at the next deadline, the refresh timer re-reading
    partition counts (real monotonic clock, short intervals)."""
    wlog, topics = FakeLog(), FakeTopics({"t": 2})
    config = CoordinatorConfig(refresh_interval_ms=50, expiry_check_max_ms=100)
    c = GroupCoordinator("g", wlog, topics, config=config)
    c.start()
    try:
        a = await c.join(_join(session_timeout_ms=1_000))
        topics.counts["t"] = 3
        await wait_for(lambda: c.state.partitions["t"] == 3, "the refresh to see 3 partitions",
                       interval_s=0.02)  # fmt: skip
        assert c.state.generation == a.generation + 1  # grown: rebalanced
        await wait_for(lambda: not c.state.members, "the session to expire", interval_s=0.02)
        assert c.state.generation == a.generation + 2
    finally:
        await c.close()


def test_cli_group_parses_targets_and_prints_partitions_as_ranges() -> None:
    import argparse

    from ops.cli import group as cli_group

    assert cli_group.parse_datetime_ms("2026-01-31T12:00:00Z") == 1_769_860_800_000
    assert cli_group.parse_datetime_ms("2026-01-31T13:00:00+01:00") == 1_769_860_800_000
    assert cli_group.parse_datetime_ms("1700000000000") == 1_700_000_000_000
    with pytest.raises(BadRequestError, match="ISO 8601"):
        cli_group.parse_datetime_ms("yesterday")
    flags = {"to_earliest": False, "to_latest": False, "to_offset": None, "to_datetime": None}
    assert cli_group.reset_target(argparse.Namespace(**{**flags, "to_offset": 7})) == (
        "offset",
        7,
    )
    with pytest.raises(BadRequestError, match="negative"):
        cli_group.reset_target(argparse.Namespace(**{**flags, "to_offset": -1}))
    # Issue 22 (11): a plan by default (--dry-run accepted), applied only with --execute.
    parser = argparse.ArgumentParser()
    cli_group.register(parser.add_subparsers())
    base = ["group", "reset-offsets", "g", "--to-offset", "5", "--cluster", "c.json"]
    assert not parser.parse_args(base).execute
    assert not parser.parse_args([*base, "--dry-run"]).execute
    assert parser.parse_args([*base, "--execute"]).execute
    plan = ResetPlan({("t", 0): 5, ("t", 1): 3}, frozenset({("t", 1)}), dry_run=True)
    answer = cli_group.reset_answer("g", plan, 5)
    assert not answer["executed"] and [o["clamped"] for o in answer["offsets"]] == [False, True]
    assert "clamped to the end 3" in answer["offsets"][1]["note"]
    assert cli_group.reset_target(argparse.Namespace(**{**flags, "to_latest": True})) == (
        "latest",
        None,
    )
    tps: list[list[object]] = [["t", 5], ["t", 0], ["t", 1], ["t", 2], ["u", 3]]
    assert cli_group._tps(tps) == "t:0-2,5 u:3"
    assert cli_group._tps([]) == "-"
