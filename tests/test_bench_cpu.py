"""ops.cpu: the CPU a benchmark's processes used while it measured (Linux /proc)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from ops.cpu import CpuWindow, cpu_seconds

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")

SPIN = "import time\nend = time.perf_counter() + 30\nwhile time.perf_counter() < end: pass\n"
SLEEP = "import time\ntime.sleep(30)\n"


def _start(code: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", code])


def test_busy_and_idle_processes_are_told_apart_per_role() -> None:
    busy, idle = _start(SPIN), _start(SLEEP)
    try:
        time.sleep(0.3)  # past interpreter start-up
        window = CpuWindow({"busy": [busy.pid], "idle": [idle.pid]})
        window.start()
        time.sleep(1.0)
        report = window.stop()
    finally:
        for proc in (busy, idle):  # stopped by pid, also on failure
            proc.kill()
            proc.wait(10)
    # A spinning process gets most of a core even on a loaded 2-core machine; a
    # sleeping one next to nothing. The total is the roles' sum.
    assert report["busy"] > 30.0
    assert report["idle"] < 5.0
    assert report["total"] == pytest.approx(report["busy"] + report["idle"], abs=0.2)


def test_a_process_gone_during_the_window_is_left_out() -> None:
    proc = _start(SLEEP)
    time.sleep(0.2)
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
