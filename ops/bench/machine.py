"""How fast this machine is at the three things every Bookline hop costs.

Benchmark figures only compare across machines with a yardstick: the same commit gave
65,410 bookie adds/s on one 2-core machine and 24,000 on another. The probes:

* ``py_loop_ns``: one iteration of a plain Python loop (``x += i``), the interpreter's
  speed on this CPU;
* ``syscall_ns``: one cheap system call (``getppid``), what the kernel entry costs
  here (a virtual machine's mitigations can make it several times dearer);
* ``process_rtt_us``: a 64-byte ping-pong between two processes over a Unix socket
  pair, median and p99: the wake-up a message from one process to another costs (the
  hop between a writer, a bookie and a reader).

Each probe is the median of several short rounds, so a busy moment skews one round, not
the figure. ``bookline bench disk`` is its counterpart for the disk.
"""

from __future__ import annotations

import os
import socket
import statistics
import time
from typing import Any

from ops.bench.common import percentile_ms

ROUNDS = 5
LOOP_ITERATIONS = 1_000_000
SYSCALLS = 100_000
PING_PONGS = 5_000
MESSAGE = b"x" * 64


def _loop_ns() -> float:
    t0 = time.perf_counter()
    x = 0
    for i in range(LOOP_ITERATIONS):
        x += i
    return (time.perf_counter() - t0) / LOOP_ITERATIONS * 1e9


def _syscall_ns() -> float:
    getppid = os.getppid
    t0 = time.perf_counter()
    for _ in range(SYSCALLS):
        getppid()
    return (time.perf_counter() - t0) / SYSCALLS * 1e9


def _ping_pong_s() -> list[float]:
    """Round trips (seconds, sorted) to a forked child that echoes; the child exits
    when we close."""
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    pid = os.fork()
    if pid == 0:  # the echoing child: no Python-level cleanup, just echo and leave
        parent.close()
        try:
            while data := child.recv(len(MESSAGE)):
                child.sendall(data)
        finally:
            os._exit(0)
    child.close()
    rtts: list[float] = []
    try:
        for _ in range(PING_PONGS):
            t0 = time.perf_counter()
            parent.sendall(MESSAGE)
            got = 0
            while got < len(MESSAGE):
                got += len(parent.recv(len(MESSAGE) - got))
            rtts.append(time.perf_counter() - t0)
    finally:
        parent.close()
        os.waitpid(pid, 0)  # stopped by us: it exits once the socket closes
    rtts.sort()
    return rtts


def measure() -> dict[str, Any]:
    loops = [_loop_ns() for _ in range(ROUNDS)]
    calls = [_syscall_ns() for _ in range(ROUNDS)]
    rtts = _ping_pong_s()
    return {
        "bench": "machine",
        "cpus": os.cpu_count(),
        "py_loop_ns": round(statistics.median(loops), 1),
        "syscall_ns": round(statistics.median(calls), 1),
        "process_rtt_p50_us": round(percentile_ms(rtts, 0.50) * 1000.0, 1),
        "process_rtt_p99_us": round(percentile_ms(rtts, 0.99) * 1000.0, 1),
    }
