"""The chaos checker catches a deliberately broken build (issue 15 acceptance).

A core-library writer of the chaos workload writes to real bookies for a moment while
``LogWriter.write_nowait`` is patched to acknowledge every tenth record without writing
it (a writer that acks what it never wrote); then the workload's final phase (a final
write that recovers the stream, full reads through the core library, every entry read
from each replica) and the checker. The checker must count exactly the dropped records
as ``lost`` and nothing else. The same run without the patch is clean, so the
anomalies are the break's, not the harness's. And bookies acknowledging before fsync
(``--no-journal-sync``) that lose power lose acknowledged records: the checker says so,
also when the power cuts are the chaos nemesis's overlapping ones.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Callable
from pathlib import Path

import pytest

from ops.chaos.checker import CheckResult, check, load_history
from ops.chaos.final import final_phase
from ops.chaos.hosts import BOOKIE_ARGS, ChaosCluster
from ops.chaos.nemesis import Nemesis, Plan, ProcessTarget, Step
from ops.chaos.run import RunConfig, WriterProcess
from ops.chaos.workload import Layout, WriterSpec, run_writer
from streams.dlsn import DLSN
from streams.namespace import Namespace
from streams.records import LogRecord
from streams.writer import LogWriter
from tests.conftest import BookieCluster
from tests.test_power_cut import ShimBookies
from tests.test_power_cut import _configure as configure_shim
from tests.values import value as payload_of
from tests.waiting import wait_for

pytestmark = pytest.mark.integration

RATE_PER_S = 150.0
DROP_EVERY = 10
# The in-process writer writes until it has this many acknowledged (however long that
# takes on this machine); the overlapping power cuts come once the writer process has.
ACKS_WANTED = 120
ACKS_BEFORE_CUT = 100
ACKS_DEADLINE_S = 120.0


async def _write_and_check(
    cluster_file: Path, history: Path, stream: str, during: Callable[[], None] | None = None
) -> CheckResult:
    layout = Layout(thin_streams=(), core_streams=(stream,), partitions=0)
    ns = await Namespace.from_cluster_file(cluster_file)
    try:
        await ns.create_stream(stream)
    finally:
        await ns.close()
    spec = WriterSpec("w-core", "core", 1, cluster_file, history, 7, RATE_PER_S, layout)
    stop = asyncio.Event()
    writing = asyncio.create_task(run_writer(spec, stop))
    try:
        await _wait_for_acks(history, ACKS_WANTED, writing)
    finally:
        stop.set()
        await writing
    if during is not None:
        during()  # the build is fixed again before the final phase
    await final_phase(cluster_file, history, layout, full_readers=("core",))
    return check(load_history(history))


def _counts(result: CheckResult) -> dict[str, int]:
    names = ("lost", "duplicated", "reordered", "inconsistent", "unexpected", "failed_present")
    return {name: getattr(result, name) for name in names}


def test_clean_core_writer_has_no_anomaly(bookie_cluster: BookieCluster, tmp_path: Path) -> None:
    result = asyncio.run(_write_and_check(bookie_cluster.cluster_file(), tmp_path, "chaos-clean"))
    assert result.ok, json.dumps(result.to_json())  # whole, not a shortened repr
    assert result.acked > 100
    assert _counts(result) == dict.fromkeys(_counts(result), 0)


def test_writer_acking_without_writing_is_caught_as_lost(
    bookie_cluster: BookieCluster, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = LogWriter.write_nowait
    dropped: list[str] = []

    def acks_without_writing(self: LogWriter, record: LogRecord) -> asyncio.Future[DLSN]:
        value = payload_of(record).decode()
        if value.startswith("w-core.") and int(value.rsplit(".", 1)[1]) % DROP_EVERY == 3:
            dropped.append(value)
            fut: asyncio.Future[DLSN] = asyncio.get_running_loop().create_future()
            fut.set_result(DLSN(1, 0, 0))
            return fut
        return real(self, record)

    monkeypatch.setattr(LogWriter, "write_nowait", acks_without_writing)
    result = asyncio.run(
        _write_and_check(
            bookie_cluster.cluster_file(), tmp_path, "chaos-broken", during=monkeypatch.undo
        )
    )
    assert len(dropped) >= 10
    assert result.lost == len(dropped), json.dumps(result.to_json())  # whole, not a shortened repr
    assert {v.split(" ")[0] for v in result.samples["lost"]} <= set(dropped)
    assert _counts(result) == {**dict.fromkeys(_counts(result), 0), "lost": len(dropped)}
    assert not result.ok


def test_bookies_acking_before_fsync_are_caught_by_a_power_cut(
    zk_connect: str, cluster_root: str, tmp_path: Path
) -> None:
    """The other broken build: bookies that acknowledge before their journal fsync
    (``--no-journal-sync``) and lose power (the storage fault shim drops what was not
    fsynced; every bookie SIGKILLed at once mid-stream, then restarted). The chaos
    writer, final phase and checker report the acknowledged records as lost."""
    bookies = ShimBookies(zk_connect, cluster_root, tmp_path / "bookies", [], {})
    try:
        configure_shim(bookies, journal_sync=False)
        bookies.start_all()
        cluster_file = tmp_path / "cluster.json"
        cluster_file.write_text(json.dumps({"zk": zk_connect, "root": cluster_root}))
        result = asyncio.run(_cut_and_check(bookies, cluster_file, tmp_path / "history"))
    finally:
        bookies.stop()
    print(f"acknowledged before fsync, power cut: {result.acked} acked, {result.lost} lost")
    assert result.acked > 0
    assert result.lost > 0, json.dumps(result.to_json())  # whole, not a shortened repr
    assert not result.ok


async def _cut_and_check(bookies: ShimBookies, cluster_file: Path, history: Path) -> CheckResult:
    stream = "chaos-unsynced"
    layout = Layout(thin_streams=(), core_streams=(stream,), partitions=0)
    ns = await Namespace.from_cluster_file(cluster_file)
    try:
        await ns.create_stream(stream)
    finally:
        await ns.close()
    spec = WriterSpec("w-core", "core", 1, cluster_file, history, 7, RATE_PER_S, layout)
    stop = asyncio.Event()
    writer = asyncio.create_task(run_writer(spec, stop))
    await _wait_for_acks(history, ACKS_BEFORE_CUT, writer)
    await asyncio.to_thread(bookies.power_cut)
    await asyncio.sleep(0.5)  # answers already on their way still count
    stop.set()
    await writer
    await asyncio.to_thread(bookies.start_all)
    await final_phase(cluster_file, history, layout, full_readers=("core",))
    return check(load_history(history))


def test_every_bookie_acking_before_fsync_is_caught_by_overlapping_power_cuts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 21: the chaos suite's power cuts hit one bookie at a time, so a build
    whose bookies all acknowledge before fsync passed it. The chaos cluster's bookies
    run with ``--no-journal-sync`` (and no checkpoint to fsync their entry logs); while
    the chaos workload's core writer process writes, the nemesis runs one step of
    overlapping faults: every bookie power-cut, each held down for its own time, and
    the writer killed (as a crash would: it closes nothing). After the heal the final
    phase recovers the stream and the checker reports the acknowledged records lost."""
    # Children inherit it: nothing reaches the disk by a checkpoint during the test.
    monkeypatch.setenv("BOOKLINE_BOOKIE_CHECKPOINT_INTERVAL_MS", "600000")
    cluster = ChaosCluster(
        tmp_path / "cluster", namespaces=False, seed=21,
        bookie_args=(*BOOKIE_ARGS, "--no-journal-sync"),
    )  # fmt: skip
    config = RunConfig(duration_s=0, seed=21, directory=tmp_path, namespaces=False,
                       rate_per_s=RATE_PER_S, auth=False)  # fmt: skip
    layout = Layout(thin_streams=(), core_streams=config.layout.core_streams, partitions=0)
    writer = WriterProcess("w-core", "core", config, cluster.cluster_file)
    nemesis = Nemesis(cluster, random.Random(21))
    nemesis.add_target(ProcessTarget(writer.name, writer.current, writer.start))
    try:
        cluster.start()
        result = asyncio.run(_overlapping_cuts_and_check(cluster, nemesis, writer, layout))
    finally:
        writer.stop()
        cluster.stop()
    print(f"acknowledged before fsync, overlapping power cuts: {result.acked} acked, "
          f"{result.lost} lost; {nemesis.overlap_stats()}")  # fmt: skip
    assert nemesis.counts() == {"power-cut": len(cluster.bookies), "kill": 1}
    assert nemesis.overlap_stats()["bookies_down_max"] == len(cluster.bookies)
    assert result.acked > 0
    # Caught either way: as acknowledged records missing from the recovered stream or,
    # when the writer had already replaced a bookie before the cuts (one that missed an
    # add timeout on a loaded machine: see _overlapping_cuts_and_check), as a stream the
    # final phase cannot read whole, every acknowledged record unverifiable. Seen once
    # beside other tests: 115 acknowledged, 0 values read, 0 lost.
    assert result.lost > 0 or (result.read_values == 0 and result.unverified == result.acked), (
        json.dumps(result.to_json())
    )
    assert not result.ok


async def _overlapping_cuts_and_check(
    cluster: ChaosCluster, nemesis: Nemesis, writer: WriterProcess, layout: Layout
) -> CheckResult:
    ns = await Namespace.from_cluster_file(cluster.cluster_file)
    try:
        for stream in layout.core_streams:
            await ns.create_stream(stream)
    finally:
        await ns.close()
    writer.start()
    history = writer.history_dir
    await _wait_for_acks(history, ACKS_BEFORE_CUT, None)
    # Every bookie cut at once, each held down for its own time, and the writer killed
    # with them. (A bookie cut alone first would make the writer change its ensemble,
    # which tells recovery the entries were committed: recovery then refuses the
    # ledger -- NO_ENTRY, a committed entry on no replica -- before the checker sees it.)
    cuts = tuple(Plan("power-cut", b.id, 2.0 + 0.5 * i) for i, b in enumerate(cluster.bookies))
    await nemesis.run_step(Step("bookies-down", (*cuts, Plan("kill", writer.name, 1.0))))
    await asyncio.to_thread(writer.stop)
    await nemesis.heal_all()
    await final_phase(cluster.cluster_file, history, layout, full_readers=("core",))
    return check(load_history(history))


async def _wait_for_acks(history: Path, n: int, writer: asyncio.Future[None] | None) -> None:
    """Until the history holds ``n`` acknowledged records; a writer that ended fails it."""

    def enough() -> bool:
        if writer is not None and writer.done():
            writer.result()  # its error, if it failed
            raise AssertionError(f"the writer stopped before {n} acknowledged records")
        return check(load_history(history)).acked >= n

    await wait_for(enough, f"{n} acknowledged records in {history}", timeout_s=ACKS_DEADLINE_S,
                   interval_s=0.2)  # fmt: skip
