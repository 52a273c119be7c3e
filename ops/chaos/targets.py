"""What the nemesis crashes and pauses: a cluster node (:class:`ops.chaos.hosts.Node`)
or a process of the caller's (``bookline chaos``'s writers, through
:class:`ProcessTarget`)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Callable
from typing import Protocol

from ops.cluster import procs

__all__ = ["ProcessTarget", "Target"]


class Target(Protocol):
    """A process the nemesis can crash and pause (a cluster node, or a writer)."""

    id: str
    kind: str

    def kill9(self) -> None: ...

    def restart(self, extra_args: list[str] | None = None) -> None: ...

    def pause(self) -> None: ...

    def resume(self) -> None: ...

    def is_running(self) -> bool: ...


class ProcessTarget:
    """Adapts a caller's process (``bookline chaos``'s writers) to :class:`Target`:
    ``current()`` gives its live Popen (None when down), ``start()`` starts it again."""

    def __init__(
        self,
        name: str,
        current: Callable[[], subprocess.Popen[bytes] | None],
        start: Callable[[], None],
        kind: str = "writer",
    ) -> None:
        self.id, self.kind = name, kind
        self._current, self._start = current, start
        self._paused = False

    def is_running(self) -> bool:
        proc = self._current()
        return proc is not None and proc.poll() is None

    def kill9(self) -> None:
        self.resume()
        proc = self._current()
        if proc is not None:
            procs.kill9(proc)

    def restart(self, extra_args: list[str] | None = None) -> None:
        if extra_args:
            raise ValueError(f"{self.id}: a writer restarts without extra arguments")
        self.kill9()
        self._start()

    def pause(self) -> None:
        proc = self._current()
        if proc is None:
            raise ProcessLookupError(f"{self.id} is not running")
        os.killpg(proc.pid, signal.SIGSTOP)
        self._paused = True

    def current_pid(self) -> int | None:
        proc = self._current()
        return None if proc is None else proc.pid

    def resume(self) -> None:
        proc = self._current()
        if self._paused and proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGCONT)
        self._paused = False
