"""ops.bench.cpu: the CPU a benchmark's processes used while it measured (Linux /proc)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from ops.bench.cpu import CpuWindow, cpu_seconds, run_queue_seconds

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")

# Each child says "ready" once started; the busy one then burns BUSY_CPU_S of its own CPU
# time when told to (a line on stdin) and says "done". CPU time, not wall time: on a
# loaded machine a spinning process gets a fraction of a core, but what it used is
# what the window must report.
BUSY_CPU_S = 0.5
SPIN = f"""
import sys, time
print("ready", flush=True)
sys.stdin.readline()
end = time.process_time() + {BUSY_CPU_S}
while time.process_time() < end:
    pass
print("done", flush=True)
time.sleep(300)
"""
SLEEP = 'import time\nprint("ready", flush=True)\ntime.sleep(300)\n'


def _start(code: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    assert proc.stdout.readline() == "ready\n"  # past interpreter start-up
    return proc


def test_busy_and_idle_processes_are_told_apart_per_role() -> None:
    busy, idle = _start(SPIN), _start(SLEEP)
    try:
        assert busy.stdin is not None and busy.stdout is not None
        t0 = time.perf_counter()
        window = CpuWindow({"busy": [busy.pid], "idle": [idle.pid]})
        window.start()
        busy.stdin.write("go\n")
        busy.stdin.flush()
        assert busy.stdout.readline() == "done\n"
        report = window.stop()
        outer_s = time.perf_counter() - t0
    finally:
        for proc in (busy, idle):  # stopped by pid, also on failure
            proc.kill()
            proc.wait(10)
    # The busy process used at least BUSY_CPU_S within a window no longer than outer_s
    # (less one clock tick of rounding); the sleeping one next to nothing in the same
    # window, however loaded the machine. The total is the roles' sum.
    assert report["busy"] >= (BUSY_CPU_S - 0.02) / outer_s * 100.0, (report, outer_s)
    assert report["idle"] < report["busy"] / 10, report
    assert report["total"] == pytest.approx(report["busy"] + report["idle"], abs=0.2)


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs CPU affinity")
def test_processes_sharing_one_core_are_reported_waiting_for_it() -> None:
    """Two spinning processes pinned to one core: while one runs the other is ready
    and waits, so their waits add up to at least what one of them ran -- accounting,
    not speed (a loaded machine only adds waiting). An idle process waits for none."""
    core = min(os.sched_getaffinity(0))
    spinners = [_start(SPIN), _start(SPIN)]
    idle = _start(SLEEP)
    try:
        for proc in spinners:
            os.sched_setaffinity(proc.pid, {core})
        window = CpuWindow({"spinning": [p.pid for p in spinners], "idle": [idle.pid]})
        window.start()
        for proc in spinners:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        for proc in spinners:
            assert proc.stdout is not None and proc.stdout.readline() == "done\n"
        window.stop()
        waited_s = window.waited["spinning"] / 100.0 * window.elapsed_s
    finally:
        for proc in (*spinners, idle):  # stopped by pid, also on failure
            proc.kill()
            proc.wait(10)
    # The first to finish ran BUSY_CPU_S while the other was ready on the same core
    # (less a clock tick of rounding either side).
    assert waited_s >= BUSY_CPU_S - 0.05, window.waited
    assert window.waited["idle"] <= window.waited["spinning"] / 10, window.waited
    assert run_queue_seconds(idle.pid) is None  # gone


def test_a_process_gone_during_the_window_is_left_out() -> None:
    proc = _start(SLEEP)
    window = CpuWindow({"gone": [proc.pid]})
    window.start()
    proc.kill()
    proc.wait(10)
    assert cpu_seconds(proc.pid) is None
    assert window.stop() == {"gone": 0.0, "total": 0.0}


def test_no_process_gives_an_empty_report() -> None:
    window = CpuWindow({"none": []})
    window.start()
    assert window.stop() == {}
