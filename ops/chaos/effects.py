"""Has an injected fault taken effect? The nemesis counts a fault only once it has.

Each function looks at the thing the fault was meant to change, from outside the
process it hit, and answers with a line of evidence (or None: not yet, not at all):

* a killed process: its pid is gone (reaped, no ``/proc`` entry);
* a paused one: ``/proc/PID/stat`` says ``T`` (stopped);
* a power cut: the process killed ran under the power-cut overlay (its command line
  says ``--fault-shim power-cut``), so what it had not fsynced is gone with it;
* an fsync error or a full disk: the shim's own ``FAULTS.hits`` counts what it injected
  (bookie/storage/faults.py); a full disk also shows in the bookie's log ("turning
  read-only") or, when a write needed more than the reserve, as a fatal exit;
* a partition, a one-way cut or a link down: a TCP connection from a host that should
  be cut off to the service of the host it is cut from does not get through (times out
  or finds no route; a refusal means the packets got there).
"""

from __future__ import annotations

import itertools
import socket
import subprocess
import tomllib
from pathlib import Path
from typing import Final

from bookie.storage.faults import HITS_FILE

__all__ = ["blocked", "fault_hits", "log_says", "pid_gone", "stopped", "under_power_cut"]

# A connection probe waits this long for a SYN to be answered: a cut host never answers.
PROBE_TIMEOUT_S: Final = 1.5
# The probe's own process (ip netns exec, bash) gets this much longer before it is
# given up on as a failure to probe (not as evidence).
PROBE_PROCESS_S: Final = 20.0
# `timeout`'s exit status when it had to stop the command (the connection hung).
TIMED_OUT: Final = 124


def pid_gone(pid: int | None) -> str | None:
    """Evidence that ``pid`` no longer runs (a zombie counts as gone: it runs nothing);
    None for no pid (the process was not running: nothing was killed)."""
    if pid is None:
        return None
    try:
        state = _proc_state(pid)
    except (FileNotFoundError, ProcessLookupError):
        return f"pid {pid} gone"
    return f"pid {pid} is a zombie" if state == "Z" else None


def stopped(pid: int | None) -> str | None:
    """Evidence that ``pid`` is stopped by a signal (SIGSTOP)."""
    if pid is None:
        return None
    try:
        state = _proc_state(pid)
    except FileNotFoundError:
        return None
    return f"pid {pid} in state T (stopped)" if state == "T" else None


def _proc_state(pid: int) -> str:
    text = Path(f"/proc/{pid}/stat").read_text()
    return text.rsplit(")", 1)[1].split()[0]  # the command name may hold spaces


def cmdline(pid: int) -> list[str]:
    """The command line of ``pid`` ([] when it is gone)."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        return []
    return raw.decode(errors="replace").rstrip("\0").split("\0")


def under_power_cut(argv: list[str]) -> bool:
    """Whether a bookie with this command line keeps unsynced writes in the overlay."""
    return any(a == "--fault-shim" and b == "power-cut" for a, b in itertools.pairwise(argv))


def fault_hits(journal_dir: Path) -> dict[str, int]:
    """What the shim of the bookie with this journal directory has injected so far."""
    try:
        text = (journal_dir / HITS_FILE).read_text()
    except FileNotFoundError:
        return {}
    try:
        return {k: int(v) for k, v in tomllib.loads(text).items()}
    except (tomllib.TOMLDecodeError, ValueError):
        return {}  # replaced while being read: looked at again at the next poll


def log_says(log_path: Path, offset: int, marker: bytes) -> bool:
    """Whether ``marker`` appears in the log after ``offset`` (where the fault began)."""
    try:
        with open(log_path, "rb") as fh:
            fh.seek(offset)
            return marker in fh.read()
    except FileNotFoundError:
        return False


def blocked(address: str, namespace: str | None) -> bool:
    """Whether a TCP connection to ``address`` (host:port) from ``namespace`` (None: the
    root namespace) fails to get through: it times out or finds no route."""
    host, port = address.rsplit(":", 1)
    if namespace is None:
        try:
            with socket.create_connection((host, int(port)), timeout=PROBE_TIMEOUT_S):
                return False
        except ConnectionRefusedError:
            return False  # a refusal came back: the packets got through
        except OSError:
            return True  # timed out, no route, host unreachable
    script = f"exec 3<>/dev/tcp/{host}/{port}"
    argv = ["ip", "netns", "exec", namespace, "timeout", str(PROBE_TIMEOUT_S), "bash", "-c", script]
    done = subprocess.run(argv, capture_output=True, timeout=PROBE_PROCESS_S, check=False)
    if done.returncode == TIMED_OUT:
        return True
    err = done.stderr.decode(errors="replace")
    return done.returncode != 0 and ("No route" in err or "unreachable" in err)
