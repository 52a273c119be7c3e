"""The delivery-guarantee examples (``examples/``) as real processes on the shared
proxy cluster, crashed with ``kill -9`` while a producer in this process keeps writing:

* at-least-once across a consumer crash: every record processed, none skipped;
* at-most-once across a crash: no record processed twice;
* exactly-once consume-transform-produce across three ``kill -9`` of the transformer:
  the output topic holds each input record's result exactly once, in per-key order;
* exactly-once into SQLite across a crash: each record in the table exactly once;
* the exactly-once transform's fault handling (issue 22, 7), against fakes: a partition
  taken away while its writer lock was awaited, an unreadable last result, and a
  consumer session ended by a fault are retried, never the end of the task.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import sqlite3
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from subprocess import Popen

import pytest

from bookline import DLSN, Namespace, NamespaceConfig, ReadRecord, StartPosition
from bookline.errors import BooklineError, NotAssignedError, SessionSuspendedError
from examples import exactly_once_transform as eot
from groups.consumer import ConsumerConfig
from groups.producer import TopicProducer
from groups.topics import TopicAdmin
from ops.cluster import procs
from ops.cluster.local import LocalCluster
from tests.waiting import wait_for

pytestmark = pytest.mark.integration

# A process runs to its first processed record within this on a busy machine.
START_S = 30.0


def _uid() -> str:
    return uuid.uuid4().hex[:8]


@pytest.fixture
async def ns(proxy_cluster: LocalCluster) -> AsyncIterator[Namespace]:
    n = await Namespace.open(
        proxy_cluster.zk_connect, "/bookline", "default", NamespaceConfig(session_timeout_ms=4000)
    )
    try:
        yield n
    finally:
        await n.close()


@pytest.fixture
def spawned() -> Iterator[list[Popen[bytes]]]:
    started: list[Popen[bytes]] = []
    try:
        yield started
    finally:
        for proc in started:
            procs.stop(proc, grace_s=5.0)


_logs: dict[int, Path] = {}  # pid -> the example process's output


def _example(cluster: LocalCluster, tmp: Path, name: str, *args: str) -> Popen[bytes]:
    argv = [
        sys.executable, "-m", f"examples.{name}", "--cluster", str(cluster.dir / "cluster.json"),
        *args,
    ]  # fmt: skip
    log = tmp / f"{name}-{_uid()}.log"
    proc = procs.spawn(argv, log_path=log, cwd=Path.cwd())
    _logs[proc.pid] = log
    return proc


def _tail(proc: Popen[bytes]) -> str:
    log = _logs.get(proc.pid)
    text = log.read_text(errors="replace") if log is not None and log.exists() else ""
    return f"pid {proc.pid} (exit {proc.poll()}):\n{text[-3000:]}"


async def _produce(ns: Namespace, topic: str, start: int, count: int, per_s: float) -> None:
    """Records ``value-i`` keyed ``key-(i % 16)``, at about ``per_s`` a second."""
    producer = TopicProducer(ns)
    try:
        step = max(1, int(per_s / 10))
        for first in range(start, start + count, step):
            await asyncio.gather(*(
                producer.send(topic, f"value-{i}", key=f"key-{i % 16}")
                for i in range(first, min(start + count, first + step))
            ))  # fmt: skip
            await asyncio.sleep(0.1)  # pacing: about per_s records a second
    finally:
        await producer.close()


def _lines(path: Path) -> list[tuple[int, int, str, str]]:
    """``partition offset key value`` lines (a torn last line of a killed process is
    skipped)."""
    out = []
    if path.exists():
        for line in path.read_text().splitlines():
            parts = line.split(" ")
            if len(parts) == 4 and parts[3].startswith("value-"):
                out.append((int(parts[0]), int(parts[1]), parts[2], parts[3]))
    return out


async def _until(what: str, timeout_s: float, check: object) -> None:
    assert callable(check)
    await wait_for(check, what, timeout_s=timeout_s, interval_s=0.1)


async def _exit(proc: Popen[bytes], timeout_s: float) -> int:
    await wait_for(lambda: proc.poll() is not None, lambda: f"the example to exit: {_tail(proc)}",
                   timeout_s=timeout_s, interval_s=0.1)  # fmt: skip
    assert proc.returncode == 0, _tail(proc)
    return int(proc.returncode)


async def _expected(ns: Namespace, topic: str) -> set[tuple[int, int]]:
    ends = await TopicAdmin(ns).end_offsets(topic)
    return {(p, o) for p, end in enumerate(ends) for o in range(end)}


async def test_at_least_once_across_a_consumer_crash(
    proxy_cluster: LocalCluster, ns: Namespace, spawned: list[Popen[bytes]], tmp_path: Path
) -> None:
    topic, group = f"t{_uid()}", f"g{_uid()}"
    await TopicAdmin(ns).create_topic(topic, 4)
    await _produce(ns, topic, 0, 2000, per_s=100_000)
    outs = [tmp_path / "a.txt", tmp_path / "b.txt"]
    common = ("--topic", topic, "--group", group, "--idle-exit-s", "4")
    for out in outs:
        spawned.append(
            _example(proxy_cluster, tmp_path, "at_least_once", *common, "--out", str(out))
        )
    producing = asyncio.ensure_future(_produce(ns, topic, 2000, 3000, per_s=1000))
    try:
        await _until("both consumers processing", START_S,
                     lambda: all(len(_lines(o)) > 0 for o in outs))  # fmt: skip
        procs.kill9(spawned[0])  # mid-run, with processed records not yet committed
        await producing
    finally:
        producing.cancel()
    assert await _exit(spawned[1], 60) == 0
    processed = [(p, o) for out in outs for p, o, _k, _v in _lines(out)]
    expected = await _expected(ns, topic)
    assert len(expected) == 5000
    assert set(processed) == expected, f"skipped: {sorted(expected - set(processed))[:10]}"
    counts = collections.Counter(processed)
    print(f"at-least-once: {len(processed)} processed, {sum(c > 1 for c in counts.values())} twice")


async def test_at_most_once_never_processes_twice(
    proxy_cluster: LocalCluster, ns: Namespace, spawned: list[Popen[bytes]], tmp_path: Path
) -> None:
    topic, group, out = f"t{_uid()}", f"g{_uid()}", tmp_path / "out.txt"
    await TopicAdmin(ns).create_topic(topic, 2)
    # The restarted process waits out the killed one's session (3 s) before it gets
    # the partitions: it must not give up before.
    args = ("--topic", topic, "--group", group, "--idle-exit-s", "8", "--out", str(out))
    producing = asyncio.ensure_future(_produce(ns, topic, 0, 3000, per_s=1000))
    try:
        spawned.append(_example(proxy_cluster, tmp_path, "at_most_once", *args))
        await _until("records processed", START_S, lambda: len(_lines(out)) > 100)
        procs.kill9(spawned[0])
        spawned.append(_example(proxy_cluster, tmp_path, "at_most_once", *args))
        await producing
    finally:
        producing.cancel()
    assert await _exit(spawned[1], 60) == 0
    processed = [(p, o) for p, o, _k, _v in _lines(out)]
    assert len(processed) == len(set(processed)), "a record was processed twice"
    lost = await _expected(ns, topic) - set(processed)
    # At most the batch being processed at the crash (one poll) is lost.
    assert len(lost) <= ConsumerConfig().max_poll_records, len(lost)
    print(f"at-most-once: {len(processed)} processed once, {len(lost)} lost in the crash")


async def test_exactly_once_transform_across_three_kill9(
    proxy_cluster: LocalCluster, ns: Namespace, spawned: list[Popen[bytes]], tmp_path: Path
) -> None:
    topic, output, group = f"t{_uid()}", f"o{_uid()}", f"g{_uid()}"
    admin = TopicAdmin(ns)
    await admin.create_topic(topic, 4)
    await admin.create_topic(output, 4)
    args = ("--topic", topic, "--output", output, "--group", group, "--idle-exit-s", "4")
    total = 6000
    producing = asyncio.ensure_future(_produce(ns, topic, 0, total, per_s=400))

    async def results() -> int:
        return sum(await admin.end_offsets(output))

    async def progress(proc: Popen[bytes], before: int) -> None:
        async def written() -> bool:
            return await results() >= before + 300

        await wait_for(written, lambda: f"300 more results: {_tail(proc)}",
                       timeout_s=START_S, interval_s=0.1)  # fmt: skip

    try:
        for _kill in range(3):
            proc = _example(proxy_cluster, tmp_path, "exactly_once_transform", *args)
            spawned.append(proc)
            await progress(proc, await results())
            procs.kill9(proc)
        spawned.append(_example(proxy_cluster, tmp_path, "exactly_once_transform", *args))
        await producing
    finally:
        producing.cancel()
    assert await _exit(spawned[-1], 90) == 0
    ends = await admin.end_offsets(topic)
    assert sum(ends) == total
    for p, end in enumerate(ends):
        inputs = await _read(ns, f"{topic}~{p}", end)
        outputs = await _read(ns, f"{output}~{p}", end)
        sources = [int(dict(r.headers or [])["source-offset"] or b"") for r in outputs]
        assert sources == list(range(end)), f"partition {p}: {_dups(sources)}"
        assert [r.payload for r in outputs] == [(r.payload or b"").upper() for r in inputs]
        assert [r.key for r in outputs] == [r.key for r in inputs]  # per-key order kept


def _dups(sources: list[int]) -> str:
    c = collections.Counter(sources)
    return f"{len(sources)} results, twice: {[s for s, n in c.items() if n > 1][:10]}"


async def _read(ns: Namespace, stream: str, at_least: int) -> list[ReadRecord]:
    """Every record of ``stream`` (its end offset is at least ``at_least``)."""
    end = await ns.end_offset(stream)
    reader = await ns.open_reader(stream, StartPosition.earliest())
    out: list[ReadRecord] = []
    try:
        while len(out) < end:
            batch = await reader.read_many(1000, timeout_s=5.0)
            assert batch, f"{stream}: {len(out)} of {end} records readable"
            out.extend(batch)
    finally:
        await reader.close()
    assert end >= at_least or end == len(out)
    return out


async def test_exactly_once_sink_across_a_crash(
    proxy_cluster: LocalCluster, ns: Namespace, spawned: list[Popen[bytes]], tmp_path: Path
) -> None:
    topic, group, db = f"t{_uid()}", f"g{_uid()}", tmp_path / "sink.sqlite"
    await TopicAdmin(ns).create_topic(topic, 3)
    args = ("--topic", topic, "--group", group, "--idle-exit-s", "4", "--db", str(db))
    producing = asyncio.ensure_future(_produce(ns, topic, 0, 4000, per_s=1000))

    def stored() -> int:
        if not db.exists():
            return 0
        with contextlib.closing(sqlite3.connect(db, timeout=10)) as conn:
            try:
                return int(conn.execute("SELECT COUNT(*) FROM results").fetchone()[0])
            except sqlite3.OperationalError:
                return 0

    try:
        spawned.append(_example(proxy_cluster, tmp_path, "exactly_once_sink", *args))
        await _until("rows in the sink", START_S, lambda: stored() > 300)
        procs.kill9(spawned[0])
        spawned.append(_example(proxy_cluster, tmp_path, "exactly_once_sink", *args))
        await producing
    finally:
        producing.cancel()
    assert await _exit(spawned[1], 60) == 0
    with contextlib.closing(sqlite3.connect(db)) as conn:
        rows = conn.execute("SELECT partition, offset FROM results").fetchall()
        offsets = dict(conn.execute("SELECT partition, next_offset FROM offsets").fetchall())
    assert len(rows) == len(set(rows)), "a record was stored twice"
    expected = await _expected(ns, topic)
    assert set(map(tuple, rows)) == expected
    assert offsets == {p: end for p, end in enumerate(await TopicAdmin(ns).end_offsets(topic))}


# -- the exactly-once transform's fault handling, against fakes (issue 22, 7) ----------


class _FakeReader:
    def __init__(self, record: object) -> None:
        self.record = record

    async def read_next(self, timeout_s: float) -> object:
        return self.record

    async def close(self) -> None:
        pass


class _FakeWriter:
    closed = False

    async def close(self) -> None:
        self.closed = True


class _FakeNs:
    """An output stream of ``end`` results whose last one is ``last`` (None: not
    readable right now)."""

    def __init__(self, end: int, last: object) -> None:
        self.end, self.last = end, last
        self.opened: list[_FakeWriter] = []

    async def end_offset(self, stream: str) -> int:
        return self.end

    async def open_reader(self, stream: str, start: object) -> _FakeReader:
        return _FakeReader(self.last)

    async def open_writer(self, stream: str, **_kw: object) -> _FakeWriter:
        self.opened.append(_FakeWriter())
        return self.opened[-1]


class _RevokedConsumer:
    """A consumer whose partitions were all taken away during ``on_assign``."""

    def seek(self, tp: tuple[str, int], offset: int) -> None:
        raise NotAssignedError(f"partition {tp[1]} of {tp[0]} is being revoked")


def _result(source_offset: int | None) -> ReadRecord:
    headers = None if source_offset is None else {eot.SOURCE_OFFSET: str(source_offset).encode()}
    return ReadRecord("o~0", DLSN(1, 4, 0), 4, 4, 0, b"X", None, headers)


async def test_transform_survives_a_partition_revoked_while_its_writer_lock_was_awaited() -> None:
    ns = _FakeNs(end=5, last=_result(41))
    task = eot.Transformer(ns, "out")  # type: ignore[arg-type]
    task.consumer = _RevokedConsumer()  # type: ignore[assignment]
    await task.on_assign([("in", 0), ("in", 1)])  # NotAssignedError before the fix
    await task.on_revoke([("in", 0), ("in", 1)])  # what the consumer calls next
    assert [w.closed for w in ns.opened] == [True, True] and not task.writers


async def test_transform_takes_an_unreadable_last_result_for_a_fault_not_a_bad_header() -> None:
    with pytest.raises(BooklineError) as info:
        await eot.last_source_offset(_FakeNs(end=5, last=None), "out~0")  # type: ignore[arg-type]
    assert info.value.retriable and "header" not in str(info.value), info.value
    with pytest.raises(RuntimeError, match="no source-offset header"):
        await eot.last_source_offset(_FakeNs(end=5, last=_result(None)), "o~0")  # type: ignore[arg-type]
    assert await eot.last_source_offset(_FakeNs(end=5, last=_result(41)), "o~0") == 41  # type: ignore[arg-type]


async def test_transform_rejoins_after_a_fault_and_gives_up_only_without_progress(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(eot, "RESTART_BACKOFF_S", 0.0)
    sessions: list[int] = []

    async def flaky() -> None:
        sessions.append(1)
        if len(sessions) <= 2 * eot.RESTARTS_MAX:
            raise SessionSuspendedError("ZooKeeper session lost")

    # Progress between faults (a record written each session) keeps it going.
    await eot.run_with_restarts(flaky, lambda: len(sessions))
    assert len(sessions) == 2 * eot.RESTARTS_MAX + 1

    async def broken() -> None:
        raise SessionSuspendedError("ZooKeeper session lost")

    with pytest.raises(SessionSuspendedError):
        await eot.run_with_restarts(broken, lambda: 0)
