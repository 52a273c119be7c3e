"""Seeks by time while every bookie is down: an error with a stable code, never "the end".

The time lookups (a consumer's seek to ``time:MS``, a group's reset to a datetime,
Spark's ``startingTimestamp``) read one record with a short timeout and took "nothing
came" for "no record at or after the time": during an outage (or on a loaded machine)
they answered the end offset, and a consumer skipped every record after the time. Here:
records written, every bookie killed (kill -9), each lookup fails with a retriable
error; bookies back, each answers the offset of the first record at or after the time.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import pytest

import streams.namespace
import streams.seek
from foundation.errors import BooklineError
from foundation.names import partition_stream
from groups.coordinator_store import CoreTopics
from groups.fetchers import CoreFetchers
from groups.topics import TopicAdmin
from ops.cluster.local import CLUSTER_ROOT, LocalCluster
from pipeline import client as pipeline_client
from streams.config import NamespaceConfig
from streams.dlsn import DLSN, StartPosition
from streams.namespace import Namespace
from streams.records import LogRecord, ReadRecord
from streams.sync import SyncNamespace
from tests.cluster_support import kill_bookies, restart_bookies
from tests.metadata_support import wait_for

pytestmark = pytest.mark.integration

# Records before the time looked up, and at or after it.
BEFORE = 3
AFTER = 3
# Restarted bookies, connections re-made: a loaded machine gets room.
RECOVERY_S = 90.0
# The errors an outage may be answered with (each retriable).
OUTAGE_CODES = {"CONNECTION_LOST", "NOT_ENOUGH_BOOKIES", "TIMEOUT", "UNAVAILABLE"}
TOPIC = "events"
LOOKUPS = ("consumer seek", "group reset", "Spark startingTimestamp")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    c = LocalCluster(tmp_path_factory.mktemp("lookups"), bookies=3)
    c.start()
    try:
        yield c
    finally:
        c.stop()


async def _write_around_a_time(ns: Namespace, name: str) -> int:
    """BEFORE records, then AFTER records stamped later, the segment sealed; the first
    later record's timestamp."""
    writer = await ns.open_writer(name)
    reader = await ns.open_reader(name, StartPosition.earliest())
    try:
        for j in range(BEFORE):
            await writer.write(LogRecord(f"b{j}".encode()))
        before = [await reader.read_next(RECOVERY_S) or _missing() for _ in range(BEFORE)]
        last_ms = before[-1].timestamp_ms
        # The writer stamps wall-clock ms (never decreasing): wait for a later one.
        await wait_for(lambda: int(time.time() * 1000) > last_ms)
        for j in range(AFTER):
            await writer.write(LogRecord(f"a{j}".encode()))
        first_after = await reader.read_next(RECOVERY_S) or _missing()
    finally:
        await reader.close()
        await writer.close()
    assert first_after.sequence_id == BEFORE and first_after.timestamp_ms > last_ms
    return first_after.timestamp_ms


def _missing() -> ReadRecord:
    raise AssertionError("a record written was not read back")


Lookups = dict[str, "Lookup"]


@pytest.fixture
async def lookups(cluster: LocalCluster) -> AsyncIterator[Lookups]:
    """The three seeks by time of one partition's first record written later than the
    rest (the answer: offset BEFORE)."""
    ns = await Namespace.open(cluster.zk_connect, CLUSTER_ROOT, f"lookup-{uuid.uuid4().hex[:8]}",
                              NamespaceConfig(session_timeout_ms=10_000))  # fmt: skip
    try:
        sync_ns = await asyncio.to_thread(SyncNamespace.open, cluster.zk_connect, CLUSTER_ROOT,
                                          ns.name)  # fmt: skip
        try:
            await TopicAdmin(ns).create_topic(TOPIC, 1)
            name = partition_stream(TOPIC, 0)
            ms = await _write_around_a_time(ns, name)
            yield {
                "consumer seek":
                    lambda: CoreFetchers(ns).offset_at((TOPIC, 0), f"time:{ms}"),
                "group reset":
                    lambda: CoreTopics(ns).offset_for_time((TOPIC, 0), ms),
                "Spark startingTimestamp":
                    lambda: asyncio.to_thread(pipeline_client.sequence_at_timestamp, sync_ns,
                                              name, ms),
            }  # fmt: skip
        finally:
            await asyncio.to_thread(sync_ns.close)
    finally:
        await ns.close()


Lookup = Callable[[], Awaitable[int | None]]


async def _fails_with_an_outage_error(what: str, lookup: Lookup) -> None:
    try:
        answer = await lookup()
    except BooklineError as exc:
        assert exc.name in OUTAGE_CODES and exc.retriable, (what, exc)  # noqa: PT017
        return
    pytest.fail(f"{what} answered {answer} (the end offset is {BEFORE + AFTER}) while the "
                "bookies were down")  # fmt: skip


async def _answers_once_back(what: str, lookup: Lookup) -> None:
    answer: list[int | None] = []

    async def answered() -> bool:
        try:
            answer[:] = [await lookup()]
        except BooklineError as exc:  # still reconnecting
            if not exc.retriable:
                raise
            return False
        return True

    await wait_for(answered, f"{what} to answer", timeout_s=RECOVERY_S, interval_s=0.2)
    assert answer == [BEFORE], (what, answer)


async def test_seeks_by_time_fail_while_every_bookie_is_down_and_answer_after(
    cluster: LocalCluster, lookups: Lookups
) -> None:
    kill_bookies(cluster)
    try:
        for what, lookup in lookups.items():
            await _fails_with_an_outage_error(what, lookup)
    finally:
        await restart_bookies(cluster, RECOVERY_S)
    for what, lookup in lookups.items():
        await _answers_once_back(what, lookup)


def _freeze_bookies(cluster: LocalCluster, signum: int) -> None:
    for bookie in cluster.bookies:
        os.kill(bookie.proc.pid, signum)


@pytest.mark.parametrize("outage", ["killed", "frozen"])
@pytest.mark.parametrize("what", LOOKUPS)
async def test_seeks_by_time_fail_when_the_bookies_stop_after_the_position_is_found(
    cluster: LocalCluster,
    lookups: Lookups,
    monkeypatch: pytest.MonkeyPatch,
    what: str,
    outage: str,
) -> None:
    """The bookies are killed -- or frozen (SIGSTOP: they hold connections and answer
    nothing, as on an overloaded machine) -- between the lookup's position search (which
    read them) and its first record. The reader's reads fail or stay unanswered: either
    way "no record came" is an error, not "none". Before, a frozen outage answered the
    end offset after 0.5-2 s."""
    real = streams.seek.resolve_start
    armed: list[str] = []

    async def resolve_then_stop(*args: Any, **kwargs: Any) -> DLSN:
        position = await real(*args, **kwargs)
        if armed:
            armed.clear()
            if outage == "killed":
                kill_bookies(cluster)
            else:
                _freeze_bookies(cluster, signal.SIGSTOP)
        return position

    monkeypatch.setattr(streams.namespace, "resolve_start", resolve_then_stop)
    lookup = lookups[what]
    armed.append(what)
    try:
        await _fails_with_an_outage_error(what, lookup)
        assert not armed, f"{what} did not look the position up"
    finally:
        if outage == "killed":
            await restart_bookies(cluster, RECOVERY_S)
        else:
            _freeze_bookies(cluster, signal.SIGCONT)
    await _answers_once_back(what, lookup)
