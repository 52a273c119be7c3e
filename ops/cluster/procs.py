"""Child processes we start, and the guarantee that we stop them (by pid).

Every long-lived child (ZooKeeper, bookies, proxies) is started through
:func:`spawn`, which puts it in its own session (so a signal to its process group
reaches any grandchildren) and records it. :func:`stop` sends SIGTERM, waits, then
SIGKILLs the group. An ``atexit`` hook stops whatever is still recorded, so a crashing
test run or CLI does not leave servers behind.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import random
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

log = logging.getLogger(__name__)

# How long a child gets to exit after SIGTERM before it is killed.
STOP_GRACE_S = 10.0

_live: dict[int, subprocess.Popen[bytes]] = {}
_lock = threading.Lock()


def spawn(
    argv: Sequence[str],
    *,
    log_path: Path,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> subprocess.Popen[bytes]:
    """Start ``argv`` with stdout+stderr appended to ``log_path`` (mode 0600: a log may
    name streams, principals and files); remember its pid."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    with os.fdopen(fd, "ab") as out:
        os.fchmod(out.fileno(), 0o600)  # a log made 0644 by an older version: tighten it
        proc = subprocess.Popen(
            list(argv),
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=dict(env) if env is not None else None,
            cwd=cwd,
            start_new_session=True,
        )
    with _lock:
        _live[proc.pid] = proc
    log.debug("started pid %d: %s", proc.pid, " ".join(argv))
    return proc


def _signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def stop(proc: subprocess.Popen[bytes], grace_s: float = STOP_GRACE_S) -> int | None:
    """SIGTERM the child's process group, wait up to ``grace_s``, then SIGKILL it."""
    try:
        if proc.poll() is None:
            _signal_group(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                log.warning("pid %d ignored SIGTERM for %.0fs; killing it", proc.pid, grace_s)
                _signal_group(proc.pid, signal.SIGKILL)
                proc.wait(timeout=grace_s)
        # Reap stragglers in its group (a JVM's helper threads are in-process, but be sure).
        _signal_group(proc.pid, signal.SIGKILL)
        return proc.returncode
    finally:
        with _lock:
            _live.pop(proc.pid, None)


def kill9(proc: subprocess.Popen[bytes]) -> None:
    """Crash the child on purpose (tests): SIGKILL, reap, forget."""
    _signal_group(proc.pid, signal.SIGKILL)
    proc.wait(timeout=STOP_GRACE_S)
    with _lock:
        _live.pop(proc.pid, None)


def live_pids() -> list[int]:
    with _lock:
        return [pid for pid, p in _live.items() if p.poll() is None]


def stop_all() -> None:
    with _lock:
        procs = list(_live.values())
    for proc in procs:
        stop(proc, grace_s=3.0)


atexit.register(stop_all)


# Ports handed out by free_port in this process: never handed out twice, so two servers
# started side by side cannot be given the same port before either has bound it.
_handed_out: set[int] = set()
# And across processes (parallel test workers, two clusters started at once): a port
# handed out is claimed by a file here, which other processes respect for a while --
# long enough for the server it was chosen for to bind it.
_CLAIMS_DIR = Path(tempfile.gettempdir()) / "bookline-port-claims"
_CLAIM_S = 600.0
_FALLBACK_EPHEMERAL_LOW = 32768
_LOWEST_PORT = 10000


def _ephemeral_low() -> int:
    """The lowest port the kernel gives outgoing connections."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return _FALLBACK_EPHEMERAL_LOW


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago on ``host`` (loopback only).

    It is drawn at random from below the kernel's ephemeral range, so an outgoing
    connection (which takes an ephemeral port) cannot take it before the server that
    asked for it binds, and it is never handed out twice by this process."""
    top = _ephemeral_low() - 1
    for _ in range(200):
        # With no room below the ephemeral range, port 0 lets the kernel choose.
        candidate = random.randint(_LOWEST_PORT, top) if top > _LOWEST_PORT + 1000 else 0
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind((host, candidate))
            except OSError:
                continue
            port = int(s.getsockname()[1])
        with _lock:
            if port in _handed_out or (candidate and not _claim(port)):
                continue
            _handed_out.add(port)
        return port
    raise OSError(f"no free TCP port found on {host}")


def _claim(port: int) -> bool:
    """Claim ``port`` for this process unless another claimed it within ``_CLAIM_S``."""
    _CLAIMS_DIR.mkdir(exist_ok=True)
    path = _CLAIMS_DIR / str(port)
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        try:
            if time.time() - path.stat().st_mtime < _CLAIM_S:
                return False
            os.utime(path)  # an old claim: the server bound it long ago, or never will
        except FileNotFoundError:
            return False  # being renewed by another process just now: let it have it
        return True
    os.close(fd)
    return True


def wait_for(predicate: object, timeout_s: float, what: str, interval_s: float = 0.1) -> None:
    """Poll ``predicate()`` until true; raise TimeoutError naming ``what`` otherwise."""
    if not callable(predicate):
        raise TypeError("predicate must be callable")
    deadline = time.monotonic() + timeout_s
    while True:
        if predicate():
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout_s:.0f}s waiting for {what}")
        time.sleep(interval_s)
