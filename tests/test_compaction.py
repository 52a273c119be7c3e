"""Compacted topics (issue 24, item 6): sparse record sets, the planner, and compaction
against real bookies -- the latest value per key, tombstones until
``delete.retention.ms``, offsets kept (sparse, increasing), readers that started before,
seeks into gaps, and a compacting process killed with SIGKILL at random points."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import itertools
import json
import os
import random
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bookline import LogRecord, Namespace, NamespaceConfig, StartPosition, StreamOptions
from foundation.errors import (
    BadRequestError,
    ConnectionLostError,
    NoEntryError,
    NoLedgerError,
    NotFoundError,
)
from foundation.names import partition_stream
from metadata.segments import TAG_STREAM, TAG_WRITER_LOCK
from ops.cli.entry import main as cli_main
from ops.cluster import procs
from ops.cluster.local import LocalCluster
from streams.compaction import COMPACTOR_LOCK_TAG, compact_stream
from streams.compaction_plan import CompactionPolicy, policy_of, survivors
from streams.dlsn import DLSN
from streams.records import ReadRecord
from streams.recordset import (
    decode_read_records,
    encode_record_set,
    encode_sparse_set,
)
from tests.conftest import BookieCluster
from tests.waiting import wait_for

_names = itertools.count()
CONFIG = NamespaceConfig(session_timeout_ms=4000, long_poll_timeout_ms=1000)
POLICY = CompactionPolicy(compact=True, delete_retention_ms=3_600_000)
HOUR_MS = 3_600_000


# -- pure: the sparse set and the planner ---------------------------------------------


def _set(n: int, start_seq: int = 1000) -> tuple[bytes, list[ReadRecord]]:
    data = encode_record_set(
        [b"v%d" % i for i in range(n)], list(range(n)), [5] * n,
        first_index=10, bytes_before=7, last_txid=n - 1,
        keys=[b"k%d" % (i % 3) for i in range(n)],
    )  # fmt: skip
    _h, records, _eos = decode_read_records(data, "s", 1, 4, start_seq)
    return data, records


def test_a_sparse_set_keeps_sequence_ids_and_slots() -> None:
    data, records = _set(8)
    header, _r, _e = decode_read_records(data, "s", 1, 4, 1000)
    kept = [records[i] for i in (2, 3, 6)]
    sparse = encode_sparse_set(header, 1010, kept)
    h2, back, _eos = decode_read_records(sparse, "s", 1, 4, 1000)
    assert h2.sparse and h2.user_count == 8 and h2.count == 3 and h2.first_index == 10
    assert back == kept  # same sequence ids, slots, txids, timestamps, keys, payloads
    # From a slot whose record is gone: the next survivor.
    _h, tail, _e = decode_read_records(sparse, "s", 1, 4, 1000, from_slot=4)
    assert [r.sequence_id for r in tail] == [1016]
    # Nothing kept: a set that still covers its offsets.
    empty = encode_sparse_set(header, 1010, [])
    h3, none, _eos = decode_read_records(empty, "s", 1, 4, 1000)
    assert none == [] and h3.user_count == 8 and h3.count == 0


def test_a_gap_in_a_set_that_is_not_sparse_is_refused() -> None:
    data, records = _set(4)
    header, _r, _e = decode_read_records(data, "s", 1, 4, 1000)
    sparse = bytearray(encode_sparse_set(header, 1010, records[2:]))
    sparse[1] &= ~0x08  # clear the sparse bit (and fix the checksum below)
    import crc32c

    crc = crc32c.crc32c(bytes(sparse[62:]), crc32c.crc32c(bytes(sparse[:58])))
    sparse[58:62] = crc.to_bytes(4, "big")
    with pytest.raises(BadRequestError):
        decode_read_records(bytes(sparse), "s", 1, 4, 1000)


def test_the_planner_keeps_the_latest_per_key_and_tombstones_until_they_expire() -> None:
    def rec(seq: int, key: bytes | None, payload: bytes | None) -> ReadRecord:
        return ReadRecord("s", DLSN(1, 0, seq), seq, seq, 0, payload, key)

    records = [rec(0, b"a", b"1"), rec(1, None, b"x"), rec(2, b"b", b"1"),
               rec(3, b"a", b"2"), rec(4, b"b", None)]  # fmt: skip
    latest = {b"a": 3, b"b": 4}
    assert [r.sequence_id for r in survivors(records, latest, False)] == [1, 3, 4]
    assert [r.sequence_id for r in survivors(records, latest, True)] == [1, 3]


def test_the_policy_comes_from_the_topic_configs() -> None:
    assert not policy_of({}).compact
    p = policy_of({"cleanup.policy": "compact,delete", "delete.retention.ms": "5"})
    assert p.compact and p.delete_retention_ms == 5


# -- against real bookies -------------------------------------------------------------


@pytest.fixture
async def ns(bookie_cluster: BookieCluster) -> AsyncIterator[Namespace]:
    n = await Namespace.open(
        bookie_cluster.zk, bookie_cluster.root, f"c{os.getpid()}-{next(_names)}", CONFIG
    )
    try:
        yield n
    finally:
        await n.close()


def _value(key: int, round_: int) -> bytes:
    return b"%d:%d:" % (key, round_) + b"x" * 40


async def _fill(
    ns: Namespace, name: str, keys: int, rounds: int, *, active: int = 0, tombstones: int = 0
) -> object:
    """``rounds`` values of each of ``keys`` keys over several sealed segments, then
    ``active`` keys written once more into a segment left in progress (its writer is
    returned, open)."""
    await ns.create_stream(name, StreamOptions(segment_rollover_bytes=200_000))
    w = await ns.open_writer(name)
    for r in range(rounds):
        await w.write_many([LogRecord(_value(k, r), key=b"%d" % k) for k in range(keys)])
    if tombstones:  # Kafka's delete: the key with a null value
        await w.write_many([LogRecord(None, key=b"%d" % k) for k in range(tombstones)])
    await w.close()  # seals the last segment
    if active:
        w = await ns.open_writer(name)
        await w.write_many([LogRecord(_value(k, rounds), key=b"%d" % k) for k in range(active)])
    return w


async def _read_all(ns: Namespace, name: str, start: object = "earliest") -> list[ReadRecord]:
    end = await ns.end_offset(name)
    reader = await ns.open_reader(name, start)  # type: ignore[arg-type]
    out: list[ReadRecord] = []
    try:
        while not out or out[-1].sequence_id < end - 1:
            batch = await reader.read_many(10_000, timeout_s=20)
            assert batch, f"no record within 20 s after {len(out)}"
            out.extend(batch)
    finally:
        await reader.close()
    return out


def _latest(records: list[ReadRecord]) -> dict[bytes, bytes | None]:
    seqs = [r.sequence_id for r in records]
    assert seqs == sorted(set(seqs)), "offsets must increase, each once"
    latest: dict[bytes, bytes | None] = {}
    for r in records:
        assert r.key is not None
        latest[r.key] = r.payload
    return latest


@pytest.mark.integration
async def test_compaction_keeps_the_latest_value_of_each_key(ns: Namespace) -> None:
    keys, rounds, deleted = 1_000, 20, 100
    writer = await _fill(ns, "c", keys, rounds, active=10, tombstones=deleted)
    before = await _read_all(ns, "c")
    end = await ns.end_offset("c")
    segs_before = await ns.segments("c")
    assert len(segs_before) >= 3
    # A reader that started before the compaction, part way through.
    early = await ns.open_reader("c", "earliest")
    seen = list(await early.read_many(500, timeout_s=20))

    report = await ns.compact("c", POLICY)
    assert report.segments_rewritten >= 1 and report.bytes_reclaimed > 0
    after = await _read_all(ns, "c")
    # Exactly the latest value per key; the active segment's records as written.
    written = keys * rounds + deleted
    sealed = [r for r in after if r.sequence_id < written]
    latest: dict[bytes, bytes | None] = {b"%d" % k: _value(k, rounds - 1) for k in range(keys)}
    latest.update({b"%d" % k: None for k in range(deleted)})  # tombstones stay for now
    assert len(sealed) == keys
    assert _latest(sealed) == latest
    assert [r.payload for r in after[keys:]] == [_value(k, rounds) for k in range(10)]
    assert report.records_removed == keys * (rounds - 1) + deleted
    assert report.tombstones_removed == 0
    assert await ns.end_offset("c") == end  # offsets kept
    # Every record read after is the record with that offset before.
    by_seq = {r.sequence_id: r for r in before}
    assert all(by_seq[r.sequence_id] == r for r in after)

    # The early reader goes on; no key goes back in time.
    while not seen or seen[-1].sequence_id < end - 1:
        batch = await early.read_many(10_000, timeout_s=20)
        assert batch
        seen.extend(batch)
    await early.close()
    assert _latest(seen) == _latest(after)

    # A seek into a gap lands on the next record kept.
    gap = 5  # rounds 0..18 and the deleted keys' last values are gone: all a gap
    assert after[0].sequence_id == keys * (rounds - 1) + deleted
    first = (await _read_all(ns, "c", StartPosition.sequence(gap)))[0]
    assert first == after[0]

    # Compacting again changes nothing.
    again = await ns.compact("c", POLICY)
    assert again.segments_rewritten == 0 and again.records_removed == 0

    # Past delete.retention.ms the tombstones go, and the keys with them.
    later = ns.context.clock_ms() + POLICY.delete_retention_ms + 1
    expired = await compact_stream(ns.context, "c", POLICY, now_ms=later)
    assert expired.tombstones_removed == deleted == expired.records_removed
    final = [r for r in await _read_all(ns, "c") if r.sequence_id < written]
    assert _latest(final) == {k: v for k, v in latest.items() if v is not None}
    assert len(final) == keys - deleted
    await writer.close()  # type: ignore[attr-defined]


@pytest.mark.integration
async def test_the_active_segment_and_young_segments_are_not_compacted(ns: Namespace) -> None:
    await ns.create_stream("a", StreamOptions())
    w = await ns.open_writer("a")
    await w.write_many([LogRecord(b"v%d" % i, key=b"k") for i in range(100)])
    report = await ns.compact("a", POLICY)  # the only segment is in progress
    assert report.segments_scanned == 0
    await w.close()
    lagging = CompactionPolicy(compact=True, min_compaction_lag_ms=HOUR_MS)
    assert (await ns.compact("a", lagging)).segments_scanned == 0
    assert len(await _read_all(ns, "a")) == 100


def _compactor_child(
    cluster: BookieCluster, ns: Namespace, name: str, log: Path, *, step: bytes, nth: int
) -> subprocess.Popen[bytes]:
    """A process compacting ``name`` that freezes itself (SIGSTOP) right after it logs
    ``step`` for the ``nth`` time, for the test to kill it there with SIGKILL: a kill -9
    at exactly that point, whatever the machine's speed."""
    code = (
        "import asyncio, logging, os, signal, sys\n"
        "from bookline import Namespace, NamespaceConfig\n"
        "from streams.compaction_plan import CompactionPolicy\n"
        "class Freeze(logging.Handler):\n"
        "    seen = 0\n"
        "    def emit(self, record):\n"
        f"        if {step.decode()!r} in record.getMessage():\n"
        "            Freeze.seen += 1\n"
        f"            if Freeze.seen == {nth}:\n"
        "                sys.stdout.flush()\n"
        "                os.kill(os.getpid(), signal.SIGSTOP)\n"
        "logging.basicConfig(level=logging.INFO, stream=sys.stdout)\n"
        "logging.getLogger().addHandler(Freeze())\n"
        "async def main():\n"
        f"    ns = await Namespace.open({cluster.zk!r}, {cluster.root!r}, {ns.name!r},\n"
        "                              NamespaceConfig(session_timeout_ms=4000))\n"
        f"    r = await ns.compact({name!r}, CompactionPolicy(compact=True))\n"
        "    print('done', r, flush=True)\n"
        "    await ns.close()\n"
        "asyncio.run(main())\n"
    )
    return procs.spawn([sys.executable, "-c", code], log_path=log, env=dict(os.environ))


def _stopped_or_gone(child: subprocess.Popen[bytes]) -> bool:
    if child.poll() is not None:
        return True
    stat = Path(f"/proc/{child.pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0] == "T"  # state: stopped by SIGSTOP


# The steps of a segment's compaction, as the compactor logs them: the new ledger made
# (not written yet), the segment swapped to it (the old one not deleted yet), the old
# ledger deleted (the next segment not started).
_STEPS = (b"created ledger", b"swapped to ledger", b"deleted ledger")


@pytest.mark.integration
async def test_a_compactor_killed_at_random_points_loses_and_duplicates_nothing(
    ns: Namespace, bookie_cluster: BookieCluster, tmp_path: Path
) -> None:
    await _killed_three_times(ns, bookie_cluster, tmp_path, keys=1_000, rounds=20, deleted=100)


@pytest.mark.integration
@pytest.mark.slow
async def test_a_compactor_killed_at_random_points_at_the_issue_size(
    ns: Namespace, bookie_cluster: BookieCluster, tmp_path: Path
) -> None:
    """The issue's size: 10,000 keys written 20 times, 1,000 tombstones."""
    await _killed_three_times(ns, bookie_cluster, tmp_path, keys=10_000, rounds=20, deleted=1_000)


async def _killed_three_times(
    ns: Namespace, bookie_cluster: BookieCluster, tmp_path: Path, *, keys: int, rounds: int,
    deleted: int,
) -> None:  # fmt: skip
    """Three runs, each on a stream of its own (so each has every segment to rewrite):
    kill -9 after a random step of a random segment, read (every key's latest value,
    each record the one written at its offset, nothing twice), then compact again."""
    expected: dict[bytes, bytes | None] = {b"%d" % k: _value(k, rounds - 1) for k in range(keys)}
    expected.update({b"%d" % k: None for k in range(deleted)})
    seed = random.randrange(1 << 30)
    rng = random.Random(seed)
    for run in range(3):
        name = f"k{run}"
        await _fill(ns, name, keys, rounds, tombstones=deleted)
        segments = len(await ns.segments(name))
        assert segments >= 3
        original = {r.sequence_id: r for r in await _read_all(ns, name)}
        log = tmp_path / f"compactor-{run}.log"
        step, nth = rng.choice(_STEPS), rng.randint(1, segments - 1)
        where = f"seed {seed}, run {run}, killed after {step!r} #{nth}"
        child = _compactor_child(bookie_cluster, ns, name, log, step=step, nth=nth)
        try:
            await wait_for(functools.partial(_stopped_or_gone, child), where, timeout_s=120)
        finally:
            procs.kill9(child)
        assert b"done" not in log.read_bytes(), f"{where}: the run ended before the kill"
        after = await _read_all(ns, name)
        assert _latest(after) == expected, where
        assert all(original[r.sequence_id] == r for r in after), where
        # Whatever the kill left, a full run ends compacted.
        await ns.compact(name, CompactionPolicy(compact=True))
        final = await _read_all(ns, name)
        assert len(final) == keys and _latest(final) == expected, where
        assert all(original[r.sequence_id] == r for r in final), where


@pytest.mark.integration
async def test_compaction_against_a_stream_without_keys_keeps_everything(
    ns: Namespace,
) -> None:
    await ns.create_stream("u", StreamOptions())
    w = await ns.open_writer("u")
    await w.write_many([LogRecord(b"v%d" % i) for i in range(50)])
    await w.close()
    report = await compact_stream(ns.context, "u", POLICY)
    assert report.segments_scanned == 1 and report.records_removed == 0
    assert len(await _read_all(ns, "u")) == 50


@pytest.mark.integration
async def test_topic_compact_runs_it_now_and_says_what_it_reclaimed(
    ns: Namespace, bookie_cluster: BookieCluster, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    md = ns.context.md
    await md.topics.create_topic(ns.name, "orders", 2, configs={"cleanup.policy": "compact"})
    await md.topics.create_topic(ns.name, "plain", 1)
    for p in range(2):
        w = await ns.open_writer(partition_stream("orders", p))
        for r in range(5):
            await w.write_many([LogRecord(_value(k, r), key=b"%d" % k) for k in range(100)])
        await w.close()
    cluster = str(bookie_cluster.cluster_file())
    metrics = tmp_path / "compaction.prom"
    argv = ["topic", "compact", "orders", "--cluster", cluster, "--namespace", ns.name,
            "--json", "--metrics-file", str(metrics)]  # fmt: skip
    assert await asyncio.to_thread(cli_main, argv) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["records_removed"] == 2 * 100 * 4 and out["bytes_reclaimed"] > 0
    text = metrics.read_text()
    assert 'bookline_compaction_records_removed_total{topic="orders"} 800.0' in text
    for p in range(2):
        assert len(await _read_all(ns, partition_stream("orders", p))) == 100
    # A topic that is not compacted is refused, with its policy named.
    plain = ["topic", "compact", "plain", "--cluster", cluster, "--namespace", ns.name]
    assert await asyncio.to_thread(cli_main, plain) == 1
    assert "cleanup.policy=delete" in capsys.readouterr().err


@pytest.mark.integration
async def test_a_writer_seals_although_a_compaction_swap_bumped_the_max_txid(
    ns: Namespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A compaction's swap bumps the stream's max-txid version (against the orphan
    collector); a writer sealing in between must not fail for it."""
    await ns.create_stream("race", StreamOptions())
    w = await ns.open_writer("race")
    await w.write_many([LogRecord(b"v", key=b"k")])
    md = ns.context.md
    real = md.streams.get_max_txid
    bumped: list[int] = []

    async def then_a_swap(namespace: str, stream: str) -> tuple[int, int]:
        value = await real(namespace, stream)
        if not bumped:  # a swap commits between the writer's read and its transaction
            path = md.layout.max_txid(namespace, stream)
            data, version = await md.zk.get(path)
            bumped.append(await md.zk.set(path, data, version))
        return value

    monkeypatch.setattr(md.streams, "get_max_txid", then_a_swap)
    await w.close()
    assert bumped
    [segment] = await ns.segments("race")
    assert segment.state == "sealed", segment


@pytest.mark.integration
@pytest.mark.parametrize("via", ["proxy", "core"])
async def test_a_group_consumer_reads_a_compacted_topic(
    proxy_cluster: LocalCluster, via: str
) -> None:
    from groups.consumer import ConsumerConfig, GroupConsumer

    cluster_file = proxy_cluster.dir / "cluster.json"
    async with await Namespace.from_cluster_file(cluster_file) as pns:
        topic = f"compacted-{via}-{os.getpid()}-{next(_names)}"
        await pns.context.md.topics.create_topic(
            pns.name, topic, 2, configs={"cleanup.policy": "compact"}
        )
        for p in range(2):
            w = await pns.open_writer(partition_stream(topic, p))
            for r in range(5):
                await w.write_many([LogRecord(_value(k, r), key=b"%d" % k) for k in range(200)])
            await w.close()
        assert (await pns.compact_topic(topic)).records_removed == 2 * 200 * 4
    config = ConsumerConfig(session_timeout_ms=3_000, auto_offset_reset="earliest",
                            fetch_wait_ms=200)  # fmt: skip
    consumer = await GroupConsumer.from_cluster_file(
        cluster_file, f"g-{topic}", [topic], via=via, config=config
    )
    got: list[object] = []
    try:

        async def all_read() -> bool:
            got.extend(await consumer.poll(timeout_s=0.2))
            return len(got) >= 400

        await wait_for(all_read, lambda: f"400 records, got {len(got)}", timeout_s=60)
        await consumer.commit()
        for p in range(2):
            mine = [r for r in got if r.partition == p]  # type: ignore[attr-defined]
            assert [r.offset for r in mine] == list(range(800, 1000))  # type: ignore[attr-defined]
            assert [r.value for r in mine] == [_value(k, 4) for k in range(200)]  # type: ignore[attr-defined]
        assert await consumer.poll(timeout_s=0.5) == []
    finally:
        await consumer.close()


@pytest.mark.integration
@pytest.mark.slow
async def test_the_issue_acceptance_ten_thousand_keys_twenty_times(ns: Namespace) -> None:
    """The issue's size: 10,000 keys written 20 times; a full read after the
    compaction holds exactly each key's latest value, offsets increasing."""
    keys, rounds = 10_000, 20
    await _fill(ns, "big", keys, rounds)
    report = await ns.compact("big", POLICY)
    assert report.records_removed == keys * (rounds - 1) and report.bytes_reclaimed > 0
    after = await _read_all(ns, "big")
    assert len(after) == keys
    assert _latest(after) == {b"%d" % k: _value(k, rounds - 1) for k in range(keys)}


@pytest.mark.integration
async def test_a_reader_part_way_through_goes_on_in_the_new_ledger(
    ns: Namespace, bookie_cluster: BookieCluster
) -> None:
    """The old ledger is deleted (and its entries collected by the bookies) while a
    reader is part way through its segment: the reader goes on at the same entry of
    the compacted ledger, and sees each key's latest value."""
    keys, rounds = 50, 10
    await ns.create_stream("mid", StreamOptions())
    w = await ns.open_writer("mid")
    for r in range(rounds):  # one entry per record: more than any read-ahead holds
        for k in range(keys):
            await w.write(LogRecord(_value(k, r), key=b"%d" % k))
    await w.close()
    [before] = [s for s, _v in await ns.context.segments("mid")]
    assert before.last_entry_id >= keys * rounds - 1
    config = dataclasses.replace(CONFIG, read_ahead_entries=1)
    slow = await Namespace.open(bookie_cluster.zk, bookie_cluster.root, ns.name, config)
    try:
        reader = await slow.open_reader("mid", "earliest")
        seen = list(await reader.read_many(1, timeout_s=20))
        assert seen
        await ns.compact("mid", POLICY)
        # Wait until the bookies no longer hold the old ledger's last entry.
        old = await slow.context.open_segment_reader(before)  # the reader's cached handle

        async def collected() -> bool:
            try:
                await old.read_entry(before.last_entry_id)
            except (NoEntryError, NoLedgerError):
                return True
            return False

        await wait_for(collected, "the bookies to collect the old ledger", timeout_s=60)
        end = await ns.end_offset("mid")
        while seen[-1].sequence_id < end - 1:
            batch = await reader.read_many(10_000, timeout_s=20)
            assert batch
            seen.extend(batch)
        await reader.close()
    finally:
        await slow.close()
    latest = _latest(seen)
    assert latest == {b"%d" % k: _value(k, rounds - 1) for k in range(keys)}


@pytest.mark.integration
async def test_a_killed_compactors_new_ledger_is_an_orphan_and_collected(ns: Namespace) -> None:
    """A compactor killed between making its new ledger and the swap leaves that ledger
    unreferenced: the orphan collector takes it although the stream's writer is alive
    (the compactor's lock tag names no lock node); a swapped-in one it never takes."""
    from ledger.orphans import LedgerRole, OrphanCollector

    await ns.create_stream("o", StreamOptions())
    w = await ns.open_writer("o")  # a live writer: its own spares are not orphans
    await w.write_many([LogRecord(b"%d" % i, key=b"k") for i in range(10)])
    ctx = ns.context
    tags = {TAG_STREAM: f"{ns.name}/o".encode(), TAG_WRITER_LOCK: COMPACTOR_LOCK_TAG}
    left = await ctx.ledgers.create_ledger(custom=tags)
    await left.close()
    collector = OrphanCollector(ctx.md, min_age_ms=0, reads_in_flight_max=8)
    meta, _v = await ctx.md.ledgers.read(left.ledger_id)
    assert await collector.role(meta) is LedgerRole.ORPHAN
    await collector.collect()
    with pytest.raises(NotFoundError):
        await ctx.md.ledgers.read(left.ledger_id)
    await w.close()
    # A compacted segment's ledger is referenced: never an orphan.
    await ns.compact("o", POLICY)
    [segment] = [s for s, _v in await ctx.segments("o")]
    meta, _v = await ctx.md.ledgers.read(segment.ledger_id)
    assert meta.custom.get(TAG_WRITER_LOCK) == COMPACTOR_LOCK_TAG
    assert await collector.role(meta) is LedgerRole.SEGMENT


@pytest.mark.integration
async def test_a_swap_whose_answer_is_lost_keeps_the_new_ledger(
    ns: Namespace, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ZooKeeper committed the swap but its answer was lost (the connection dropped): the
    segment now references the new ledger, so it must not be deleted -- that would lose
    every record of the segment (the old ledger is no longer referenced)."""
    keys, rounds = 200, 20
    await _fill(ns, "lost", keys, rounds)
    before = await _read_all(ns, "lost")
    segments = ns.context.md.segments
    replace = segments.replace_ledger

    async def committed_then_lost(*args: object, **kwargs: object) -> None:
        await replace(*args, **kwargs)  # type: ignore[arg-type]
        raise ConnectionLostError("ZooKeeper's answer to the swap was lost")

    monkeypatch.setattr(segments, "replace_ledger", committed_then_lost)
    with pytest.raises(ConnectionLostError):
        await ns.compact("lost", POLICY)
    monkeypatch.undo()
    after = await _read_all(ns, "lost")
    assert _latest(after) == _latest(before)
    by_seq = {r.sequence_id: r for r in before}
    assert all(by_seq[r.sequence_id] == r for r in after)
