"""The local cluster's supervisor on its own (no cluster): a child that exits is reaped,
logged with its status and marked down; with restarts it comes back after a back-off
that doubles while starts fail and resets after a stable run."""

from __future__ import annotations

import logging
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

from ops.cluster import procs
from ops.cluster.local import ProcessInfo
from ops.cluster.supervisor import BACKOFF_INITIAL_S, STABLE_S, Supervisor, describe_exit


class FakeCluster:
    """Children are `sleep` processes; a restart starts another one."""

    def __init__(self, tmp: Path, count: int) -> None:
        self.tmp = tmp
        self.infos = [self._spawn(f"bookie-{i}") for i in range(1, count + 1)]
        self.writes = 0
        self.ready = True
        self.fail_starts = 0

    def _spawn(self, name: str) -> ProcessInfo:
        proc = procs.spawn([sys.executable, "-c", "import time; time.sleep(60)"],
                           log_path=self.tmp / f"{name}.log")  # fmt: skip
        return ProcessInfo(name, proc, "", {"log": str(self.tmp / f"{name}.log")}, "bookie")

    def children(self) -> list[ProcessInfo]:
        return list(self.infos)

    def is_ready(self, info: ProcessInfo) -> bool:
        return self.ready

    def note_exit(self, info: ProcessInfo) -> None:
        info.state = "down"
        info.exit_status = info.proc.returncode

    def respawn(self, info: ProcessInfo) -> ProcessInfo:
        if self.fail_starts:
            self.fail_starts -= 1
            raise RuntimeError("no disk")
        fresh = self._spawn(info.name)
        fresh.state = "starting"
        fresh.restarts = info.restarts + 1
        self.infos[self.infos.index(info)] = fresh
        return fresh

    def forget_retired(self) -> bool:
        return False  # no bookies here

    def write_cluster_json(self, doc: dict[str, Any] | None = None) -> Path:
        self.writes += 1
        return self.tmp / "cluster.json"

    def stop(self) -> None:
        for info in self.infos:
            procs.stop(info.proc, grace_s=2)


@pytest.fixture
def fake(tmp_path: Path) -> Any:
    cluster = FakeCluster(tmp_path, 2)
    try:
        yield cluster
    finally:
        cluster.stop()


def test_describe_exit() -> None:
    assert describe_exit(-9) == "killed by SIGKILL"
    assert describe_exit(3) == "exit status 3"
    assert describe_exit(None) == "still running"


def test_an_exit_is_reaped_logged_and_shown_without_restart(
    fake: FakeCluster, caplog: pytest.LogCaptureFixture
) -> None:
    now = [100.0]
    sup = Supervisor(fake, restart=False, clock=lambda: now[0])
    victim = fake.infos[0]
    procs.kill9(victim.proc)  # reaps it; the supervisor still sees the status
    caplog.set_level(logging.WARNING, logger="bookline.local")
    sup.tick()
    assert victim.state == "down" and victim.exit_status == -signal.SIGKILL
    assert fake.writes == 1
    assert f"bookie-1 (pid {victim.proc.pid}) exited: killed by SIGKILL; not restarted" in (
        caplog.text
    )
    now[0] += 100
    sup.tick()
    assert fake.infos[0] is victim and victim.state == "down"  # never restarted
    assert fake.writes == 1  # nothing changed, nothing written


def test_restart_with_back_off(fake: FakeCluster) -> None:
    now = [100.0]
    sup = Supervisor(fake, restart=True, clock=lambda: now[0])
    first = fake.infos[1]
    first.proc.send_signal(signal.SIGTERM)
    first.proc.wait(10)
    sup.tick()
    assert first.state == "down"
    now[0] += BACKOFF_INITIAL_S / 2
    sup.tick()
    assert fake.infos[1] is first  # not before the back-off
    now[0] += BACKOFF_INITIAL_S
    sup.tick()
    second = fake.infos[1]
    assert second is not first and second.restarts == 1 and second.state == "starting"
    sup.tick()
    assert second.state == "running"

    # It dies again while starting: the back-off doubles.
    fake.ready = False
    procs.kill9(second.proc)
    sup.tick()
    now[0] += BACKOFF_INITIAL_S + 0.1
    sup.tick()
    third = fake.infos[1]
    assert third.restarts == 2 and third.state == "starting"
    procs.kill9(third.proc)
    sup.tick()
    now[0] += BACKOFF_INITIAL_S + 0.1
    sup.tick()
    assert fake.infos[1] is third  # waits 2 s now
    now[0] += BACKOFF_INITIAL_S
    sup.tick()
    fourth = fake.infos[1]
    assert fourth.restarts == 3
    fake.ready = True
    sup.tick()
    assert fourth.state == "running"
    # A failing start counts as a failure too, and is retried.
    fake.fail_starts = 1
    now[0] += STABLE_S + 1  # ran long enough: back to the first back-off
    sup.tick()
    procs.kill9(fourth.proc)
    sup.tick()
    now[0] += BACKOFF_INITIAL_S + 0.1
    sup.tick()  # the start fails
    assert fake.infos[1] is fourth
    now[0] += 2 * BACKOFF_INITIAL_S + 0.1
    sup.tick()
    assert fake.infos[1].restarts == 4


def test_a_port_another_process_claimed_is_not_handed_out(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Parallel test workers (separate processes) choosing ports at once never get the
    same one: a port another process claimed a moment ago is skipped, one claimed long
    ago (its server bound it, or never will) may be handed out again."""
    monkeypatch.setattr(procs, "_CLAIMS_DIR", tmp_path)
    first, second, third = (procs.free_port() for _ in range(3))
    procs._handed_out.difference_update({first, second, third})  # as if another process
    old = tmp_path / str(second)
    os.utime(old, (0, 0))  # claimed long ago
    drawn = iter([first, second, third])
    monkeypatch.setattr("ops.cluster.procs.random.randint", lambda low, high: next(drawn))
    assert procs.free_port() == second
