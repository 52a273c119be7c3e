"""Writers in their own processes: kill -9 mid-segment, and a SIGSTOPped writer that is
fenced while paused. Real ZooKeeper and bookies (``bookie_cluster``).

The writer process is this module run as ``python -m tests.test_core_processes
writer ...``: it writes ``r<i>`` records with a window in flight and prints
``ACK <i> <dlsn>`` for each acknowledged one (stdout, flushed), ``ERR <name>`` and
exits when the writer fails. Processes are stopped by pid in ``finally``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.values import value
from tests.waiting import scaled, wait_for, wait_until

ROOT = Path(__file__).resolve().parent.parent
WINDOW = 32  # records in flight in the writer process
# Scaled as each process starts (a loaded machine may not run a ZooKeeper client's
# pings in time: its session would expire under a writer that is not stopped).
SESSION_TIMEOUT_MS = int(scaled(2.0) * 1000)


# -- the writer process ------------------------------------------------------------------


async def _writer_main(cluster_file: str, namespace: str, stream: str, identity: str) -> int:
    from bookline import LogRecord, Namespace, NamespaceConfig
    from foundation.errors import BooklineError

    cfg = NamespaceConfig(session_timeout_ms=SESSION_TIMEOUT_MS)
    ns = await Namespace.from_cluster_file(cluster_file, namespace, cfg)
    w = await ns.open_writer(stream, identity, lock_timeout_s=30)
    print("READY", flush=True)
    pending: list[tuple[int, asyncio.Future[object]]] = []
    i = 0
    try:
        while True:
            while len(pending) < WINDOW:
                pending.append((i, w.write_nowait(LogRecord(b"r%d" % i))))  # type: ignore[arg-type]
                i += 1
            index, fut = pending.pop(0)
            dlsn = await fut
            print(f"ACK {index} {dlsn}", flush=True)
            if index % 64 == 0:
                await asyncio.sleep(0.005)  # a steady stream, not a flood
    except BooklineError as exc:
        print(f"ERR {exc.name} {exc}", flush=True)
        return 2


class WriterProc:
    def __init__(self, cluster_file: Path, namespace: str, stream: str, identity: str) -> None:
        argv = [sys.executable, "-m", "tests.test_core_processes", "writer",
                str(cluster_file), namespace, stream, identity]  # fmt: skip
        self.proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, text=True)
        self.lines: list[str] = []
        self._cv = threading.Condition()
        self._thread = threading.Thread(target=self._pump, daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._cv:
                self.lines.append(line.strip())
                self._cv.notify_all()

    def acks(self) -> list[int]:
        with self._cv:
            return [int(x.split()[1]) for x in self.lines if x.startswith("ACK ")]

    def wait_acks(self, n: int, timeout_s: float = 60) -> None:
        def acked() -> bool:
            assert self.proc.poll() is None, f"writer exited: {self.lines[-5:]}"
            return len(self.acks()) >= n

        wait_until(acked, lambda: f"{n} acks (got {len(self.acks())})", timeout_s=timeout_s)

    def wait_output_end(self) -> None:
        """Every line the (ended) writer printed has been read."""
        wait_until(lambda: not self._thread.is_alive(), "the writer's output to end")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.kill()
        self.proc.wait(10)
        self._thread.join(5)


# -- the tests -----------------------------------------------------------------------

if __name__ != "__main__":
    from bookline import LogRecord, Namespace, NamespaceConfig, StreamOptions
    from tests.conftest import BookieCluster

    pytestmark = pytest.mark.integration

    def config() -> NamespaceConfig:
        return NamespaceConfig(session_timeout_ms=int(scaled(2.0) * 1000))

    @pytest.fixture
    def cluster_file(bookie_cluster: BookieCluster) -> Path:
        return bookie_cluster.cluster_file()

    @pytest.fixture
    def writer_procs() -> Iterator[list[WriterProc]]:
        started: list[WriterProc] = []
        try:
            yield started
        finally:
            for p in started:
                p.stop()

    async def _all_payloads(ns: Namespace, stream: str) -> list[tuple[bytes, int]]:
        info = await ns.stream_info(stream)
        reader = await ns.open_reader(stream)
        out: list[tuple[bytes, int]] = []
        try:
            while len(out) < info.record_count:
                batch = await reader.read_many(10_000, timeout_s=20)
                assert batch
                out.extend((value(r), r.dlsn.segment_seqno) for r in batch)
        finally:
            await reader.close()
        return out

    async def test_kill9_writer_next_writer_recovers_every_acked_record(
        bookie_cluster: BookieCluster, cluster_file: Path, writer_procs: list[WriterProc]
    ) -> None:
        ns = await Namespace.open(bookie_cluster.zk, bookie_cluster.root, "kill9", config())
        try:
            await ns.create_stream("s", StreamOptions(segment_rollover_bytes=3_000))
            old = WriterProc(cluster_file, "kill9", "s", "old-writer")
            writer_procs.append(old)
            old.wait_acks(1500)
            os.kill(old.proc.pid, signal.SIGKILL)
            await asyncio.to_thread(old.proc.wait, scaled(10))
            await asyncio.to_thread(old.wait_output_end)
            acked = old.acks()
            segs_before = await ns.segments("s")
            assert segs_before[-1].state == "in_progress"  # killed mid-segment
            w = await ns.open_writer("s", "new-writer", lock_timeout_s=30)
            assert w.segment_seqno == segs_before[-1].seqno + 1
            await w.write_many([LogRecord(b"n%d" % i) for i in range(100)])
            await w.close()
            records = await _all_payloads(ns, "s")
            old_part = [p for p, _s in records if p.startswith(b"r")]
            new_part = [(p, s) for p, s in records if p.startswith(b"n")]
            # a gap-free prefix r0..rK containing every acknowledged record, in order
            assert old_part == [b"r%d" % i for i in range(len(old_part))]
            assert len(old_part) > max(acked)
            assert records[len(old_part) :] == new_part  # the new writer continues after
            assert [p for p, _s in new_part] == [b"n%d" % i for i in range(100)]
            assert {s for _p, s in new_part} == {w.segment_seqno}
            print(f"acked {len(acked)}, recovered {len(old_part)} old records")
        finally:
            await ns.close()

    async def test_sigstopped_writer_is_fenced_and_gets_nothing_more_acked(
        bookie_cluster: BookieCluster, cluster_file: Path, writer_procs: list[WriterProc]
    ) -> None:
        ns = await Namespace.open(bookie_cluster.zk, bookie_cluster.root, "fence", config())
        try:
            await ns.create_stream("s", StreamOptions(segment_rollover_bytes=50_000))
            old = WriterProc(cluster_file, "fence", "s", "paused-writer")
            writer_procs.append(old)
            old.wait_acks(500)
            os.kill(old.proc.pid, signal.SIGSTOP)
            await asyncio.sleep(0.3)  # acks printed before the stop reach us (count only shown)
            acked_before = len(old.acks())
            # Takes over once the paused writer's session expires; recovery fences it.
            w = await ns.open_writer("s", "new-writer", lock_timeout_s=30)
            first_new = await w.write(LogRecord(b"new-0"))
            os.kill(old.proc.pid, signal.SIGCONT)
            await wait_for(lambda: old.proc.poll() is not None, "the fenced writer to exit")
            assert any(x.startswith("ERR ") for x in old.lines), old.lines[-3:]
            await w.write(LogRecord(b"new-1"))
            await w.close()
            records = await _all_payloads(ns, "s")
            payloads = [p for p, _s in records]
            old_part = payloads[: payloads.index(b"new-0")]
            assert old_part == [b"r%d" % i for i in range(len(old_part))]
            acked = old.acks()
            # whatever the old writer reported acknowledged is in the log before the new
            # writer's records: nothing it wrote after being fenced was acknowledged
            assert max(acked) < len(old_part), (max(acked), len(old_part))
            assert payloads[len(old_part) :] == [b"new-0", b"new-1"]
            assert first_new.segment_seqno > records[len(old_part) - 1][1]
            print(f"acked before stop {acked_before}, in all {len(acked)}; log {len(old_part)}")
        finally:
            await ns.close()


if __name__ == "__main__" and sys.argv[1:2] == ["writer"]:
    sys.exit(asyncio.run(_writer_main(*sys.argv[2:6])))
