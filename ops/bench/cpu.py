"""CPU used by the processes of a benchmark over its measured window (Linux ``/proc``).

A latency benchmark on a 2-core machine is only readable next to how busy the cores
were: ``bench e2e`` reports, per role (bookies, writer, reader, ZooKeeper), the CPU
time its processes used while records were timed, as a percentage of one core (all
threads, user + system), and the time their threads were ready to run but waited for a
core (the scheduler's run queue, ``/proc/<pid>/task/*/schedstat``): on two cores shared
by six processes that wait, not any timer, was most of a tail's visibility gap at
1,000 records/s (issue 26). Where ``/proc`` is missing the report is empty.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

_TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of ``pid`` (every thread), or None if it is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces; the fields after it are fixed.
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS_PER_S


def run_queue_seconds(pid: int) -> float | None:
    """Seconds the threads of ``pid`` alive now spent runnable but not running (waiting
    for a core), or None if it is gone or the kernel keeps no schedstat."""
    total = 0
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            try:
                total += int(Path(f"/proc/{pid}/task/{task}/schedstat").read_text().split()[1])
            except FileNotFoundError:
                continue  # the thread ended meanwhile
    except OSError:
        return None
    return total / 1e9


class CpuWindow:
    """``start()``, then ``stop()`` returns ``{role: percent of one core, ...,
    "total": ...}`` for ``roles`` (role -> pids), and leaves in :attr:`waited` the same
    for the time their threads waited for a core. A process that ended in between is
    left out of its role's sum."""

    def __init__(self, roles: dict[str, list[int]]) -> None:
        self._roles = roles
        self._started: dict[int, tuple[float, float | None]] = {}
        self._t0 = 0.0
        self.elapsed_s = 0.0  # the window's length once stopped
        self.waited: dict[str, float] = {}

    def start(self) -> None:
        self._t0 = time.perf_counter()
        self._started = {
            pid: (s, run_queue_seconds(pid))
            for pids in self._roles.values()
            for pid in pids
            if (s := cpu_seconds(pid)) is not None
        }

    def stop(self) -> dict[str, float]:
        elapsed = self.elapsed_s = time.perf_counter() - self._t0
        if not self._started or elapsed <= 0:
            return {}
        report: dict[str, float] = {}
        waited: dict[str, float] = {}
        for role, pids in self._roles.items():
            used = queued = 0.0
            for pid in pids:
                now, before = cpu_seconds(pid), self._started.get(pid)
                if now is None or before is None:
                    continue
                used += now - before[0]
                wait_now = run_queue_seconds(pid)
                if wait_now is not None and before[1] is not None:
                    queued += wait_now - before[1]
            report[role] = round(used / elapsed * 100.0, 1)
            waited[role] = round(max(0.0, queued) / elapsed * 100.0, 1)
        report["total"] = round(sum(report.values()), 1)
        waited["total"] = round(sum(waited.values()), 1)
        self.waited = waited
        return report


def bookie_requests(metrics_urls: list[str]) -> dict[str, float]:
    """Requests answered OK per op, summed over the bookies' ``/metrics`` (the counter
    ``bookline_bookie_requests_total``); an unreachable bookie counts nothing."""
    import re
    import urllib.request

    pattern = re.compile(r'^bookline_bookie_requests_total\{op="(\w+)",status="OK"\} (\S+)$', re.M)
    totals: dict[str, float] = {}
    for url in metrics_urls:
        try:
            with urllib.request.urlopen(url, timeout=5) as answer:  # loopback only
                text = answer.read().decode()
        except OSError:
            continue
        for op, value in pattern.findall(text):
            totals[op] = totals.get(op, 0.0) + float(value)
    return totals
