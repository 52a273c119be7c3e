"""Sampling profiles of a benchmark's processes with py-spy, summarised per role.

``Profiles(roles, seconds, out_dir)`` starts one ``py-spy record`` per process (raw
collapsed stacks, native frames off, ``--nonblocking`` so the process is never paused;
each through :func:`ops.cluster.procs.spawn`, stopped by pid) while a benchmark measures;
``summary()`` then reads the stacks back and gives, per role, the functions holding the
most samples by themselves ("self") and with what they call ("total"), as shares of the
role's samples -- the tables ``docs/benchmarks.md`` quotes. The raw files stay in
``out_dir`` (``flamegraph.pl`` or speedscope read them).
"""

from __future__ import annotations

import collections
import contextlib
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Final

from ops.cluster import procs

#: Samples per second (py-spy's default is 100; more gives steadier shares in 10 s).
RATE_HZ: Final = 250
#: Functions listed per role.
TOP: Final = 12


def py_spy() -> str | None:
    here = Path(sys.executable).parent / "py-spy"
    return str(here) if here.exists() else shutil.which("py-spy")


class Profiles:
    def __init__(self, roles: dict[str, list[int]], seconds: float, out_dir: Path) -> None:
        self._roles = roles
        self._seconds = seconds
        self._dir = out_dir
        self._running: list[tuple[str, Path, subprocess.Popen[bytes]]] = []

    def start(self) -> None:
        binary = py_spy()
        if binary is None:
            raise FileNotFoundError("py-spy not found: install the bench extra (ops/setup.sh)")
        self._dir.mkdir(parents=True, exist_ok=True)
        for role, pids in self._roles.items():
            for pid in pids:
                out = self._dir / f"{role}-{pid}.txt"
                argv = [binary, "record", "--pid", str(pid), "--duration",
                        str(max(1, round(self._seconds))), "--rate", str(RATE_HZ),
                        "--format", "raw", "--nonblocking", "--output", str(out)]  # fmt: skip
                proc = procs.spawn(argv, log_path=self._dir / f"{role}-{pid}.log")
                self._running.append((role, out, proc))

    def stop(self) -> None:
        """Wait for every recorder to write its file (they end after ``seconds``)."""
        for _role, _out, proc in self._running:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=self._seconds + 30)
            procs.stop(proc)

    def summary(self) -> dict[str, Any]:
        stacks: dict[str, collections.Counter[str]] = {}
        for role, out, _proc in self._running:
            counter = stacks.setdefault(role, collections.Counter())
            if out.exists():
                for line in out.read_text(errors="replace").splitlines():
                    stack, _, count = line.rpartition(" ")
                    if stack and count.isdigit():
                        counter[stack] += int(count)
        return {role: top_functions(c) for role, c in stacks.items()}


def _frame_name(frame: str) -> str:
    """``func (path/to/module.py:123)`` -> ``module.py:func``."""
    func, _, where = frame.partition(" (")
    path = where.rstrip(")").rsplit(":", 1)[0]
    return f"{Path(path).name}:{func}" if path else func


def top_functions(stacks: collections.Counter[str]) -> dict[str, Any]:
    """Self and total shares (% of samples) of the busiest functions of one role."""
    total = sum(stacks.values())
    own: collections.Counter[str] = collections.Counter()
    incl: collections.Counter[str] = collections.Counter()
    for stack, n in stacks.items():
        frames = [_frame_name(f) for f in stack.split(";") if f]
        if not frames:
            continue
        own[frames[-1]] += n
        for name in set(frames[1:]):  # the thread's name is the first "frame"
            incl[name] += n

    def shares(c: collections.Counter[str]) -> list[tuple[str, float]]:
        return [(k, round(100.0 * v / total, 1)) for k, v in c.most_common(TOP)] if total else []

    return {"samples": total, "self": shares(own), "total": shares(incl)}
