"""``bookline local`` and ``bookline demo``: a local cluster that watches its children.

:class:`Supervisor` looks at every child process (:class:`ops.cluster.local.LocalCluster`) five
times a second. A child that exited is reaped at once (no zombie), its exit is logged
with its status (``bookie-2 (pid 4242) exited: killed by SIGKILL``), and
``cluster.json`` says so (``"state": "down"``, ``exit_status``, ``exited_at``) -- which
``bookline status`` shows. With ``--restart`` it is started again on the same ports and
directories after a back-off (1 s, doubling to 30 s; back to 1 s once a child ran for a
minute), ``starting`` until its ready line, then ``running`` again.

Defaults that survive a lost bookie: 4 bookies for ledgers of E=Qw=3, Qa=2. With only
3 bookies, a dead one leaves the writer no bookie to replace it with (an ensemble needs
E distinct bookies): its adds time out and every write fails with NOT_ENOUGH_BOOKIES.
With a fourth, the writer swaps the dead bookie out (an ensemble change) and goes on,
and the autorecovery child (the auditor and a replication worker) copies the dead
bookie's entries to the others, so every entry is back to Qw copies. In a local cluster
autorecovery acts fast: a bookie absent for 3 s is lost (``--grace-ms``), and a ledger
whose writer still has the lost bookie in its ensemble 10 s after being marked is
recovered so it can be repaired (``--open-ledger-grace-ms``; BookKeeper's default is
30 s) -- its writer then moves to a new segment, which clients only see as a retried
request. A writer that swapped the bookie out itself is left alone; the segments before
its swap are re-replicated under it.

A bookie retired with ``bookline bookie retire`` (decommissioned, stopped, its cookie
deleted) is dropped: the supervisor, looking while a bookie is down, removes it from
``cluster.json`` and never restarts it, and later starts skip it (its directories
hold a cookie ZooKeeper no longer has). Its ports stay in ``ports.json``, so its id is
never reused by accident; ``--bookies`` counts it, so add one to start a replacement.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Protocol

from foundation.backoff import Backoff, BackoffPolicy
from ops.cluster.local import SERVICE_SESSION_TIMEOUT_MS, LocalCluster, ProcessInfo, Quorums

log = logging.getLogger("bookline.local")

__all__ = [
    "Supervised",
    "Supervisor",
    "add_cluster_flags",
    "describe_exit",
    "run_demo",
    "run_local",
]

# How often children are looked at: an exit is noticed (and cluster.json updated) this fast.
TICK_S: Final = 0.2
# Restart back-off: first wait, doubling up to the max; reset after a stable run.
BACKOFF_INITIAL_S: Final = 1.0
BACKOFF_MAX_S: Final = 30.0
RESTART_BACKOFF: Final = BackoffPolicy(delay_s=BACKOFF_INITIAL_S, max_delay_s=BACKOFF_MAX_S)
STABLE_S: Final = 60.0
# A child that does not print its ready line this long after a restart is killed and
# counts as another failed start.
RESTART_READY_TIMEOUT_S: Final = 90.0
# Autorecovery in a local cluster (see the module docstring).
LOCAL_AUTORECOVERY_ARGS: Final = ("--grace-ms", "3000", "--open-ledger-grace-ms", "10000")
DEFAULT_BOOKIES: Final = 4
# How often a down bookie is looked up in ZooKeeper (retired: dropped, not restarted).
RETIRED_POLL_S: Final = 5.0


def describe_exit(status: int | None) -> str:
    """``exit status 3`` / ``killed by SIGKILL`` for a Popen return code."""
    if status is None:
        return "still running"
    if status < 0:
        try:
            return f"killed by {signal.Signals(-status).name}"
        except ValueError:
            return f"killed by signal {-status}"
    return f"exit status {status}"


@dataclass
class _Watch:
    """Restart bookkeeping of one child (by name)."""

    backoff: Backoff = field(default_factory=lambda: Backoff(RESTART_BACKOFF))
    restart_at: float | None = None  # when to start it again (None: not scheduled)
    started_at: float = 0.0  # last (re)start; ready deadline and stability from here


class Supervised(Protocol):
    """What the supervisor needs of a cluster (:class:`LocalCluster` has it)."""

    def children(self) -> list[ProcessInfo]: ...

    def is_ready(self, info: ProcessInfo) -> bool: ...

    def note_exit(self, info: ProcessInfo) -> None: ...

    def respawn(self, info: ProcessInfo) -> ProcessInfo: ...

    def write_cluster_json(self, doc: dict[str, Any] | None = None) -> Path: ...

    def forget_retired(self) -> bool: ...


class Supervisor:
    """Watches a started cluster's children; :meth:`tick` does one round."""

    def __init__(
        self,
        cluster: Supervised,
        *,
        restart: bool,
        clock: Callable[[], float] = time.monotonic,
        on_change: Callable[[], None] | None = None,
    ) -> None:
        self.cluster = cluster
        self.restart = restart
        self._clock = clock
        self._watches: dict[str, _Watch] = {}
        self._on_change = on_change or cluster.write_cluster_json
        self._retired_checked = -RETIRED_POLL_S
        now = clock()
        for info in cluster.children():
            self._watches[info.name] = _Watch(started_at=now)

    def tick(self) -> None:
        now = self._clock()
        changed = self._look_for_retired(now)
        for info in self.cluster.children():
            watch = self._watches.setdefault(info.name, _Watch(started_at=now))
            changed |= self._look_at(info, watch, now)
        if changed:
            self._on_change()

    def _look_for_retired(self, now: float) -> bool:
        """While a bookie is down, every RETIRED_POLL_S: was it retired (`bookline
        bookie retire`)? Then it is dropped: never restarted, no longer listed."""
        down = any(i.kind == "bookie" and i.state == "down" for i in self.cluster.children())
        if not down or now < self._retired_checked + RETIRED_POLL_S:
            return False
        self._retired_checked = now
        try:
            return self.cluster.forget_retired()
        except Exception as exc:  # noqa: BLE001 - ZooKeeper down: the next look tries again
            log.warning("could not look for retired bookies: %s", exc)
            return False

    def _look_at(self, info: ProcessInfo, watch: _Watch, now: float) -> bool:
        """One child; True when cluster.json should be written again."""
        if info.state == "down":
            if watch.restart_at is not None and now >= watch.restart_at:
                self._start_again(info, watch, now)
                return True
            return False
        if info.proc.poll() is not None:  # reaped here: no zombie
            self._exited(info, watch, now)
            return True
        if info.state == "starting":
            if self.cluster.is_ready(info):
                info.state = "running"
                log.info("%s (pid %d) is running again", info.name, info.proc.pid)
                return True
            if now - watch.started_at > RESTART_READY_TIMEOUT_S:
                log.warning("%s (pid %d) not ready in time; killing it", info.name, info.proc.pid)
                from ops.cluster import procs

                procs.kill9(info.proc)  # the next tick sees the exit
            return False
        if now - watch.started_at > STABLE_S:
            watch.backoff.reset()
        return False

    def _exited(self, info: ProcessInfo, watch: _Watch, now: float) -> None:
        was = info.state
        self.cluster.note_exit(info)
        what = describe_exit(info.exit_status)
        if was == "starting":
            what += " while starting"
        if not self.restart:
            log.warning(
                "%s (pid %d) exited: %s; not restarted (run with --restart to restart "
                "children); see %s",
                info.name,
                info.proc.pid,
                what,
                info.extra.get("log", "its log"),
            )
            return
        if was == "starting":
            watch.backoff.grow()
        watch.restart_at = now + watch.backoff.delay_s
        log.warning(
            "%s (pid %d) exited: %s; restarting in %.0f s; see %s",
            info.name,
            info.proc.pid,
            what,
            watch.backoff.delay_s,
            info.extra.get("log", "its log"),
        )

    def _start_again(self, info: ProcessInfo, watch: _Watch, now: float) -> None:
        watch.restart_at = None
        watch.started_at = now
        try:
            fresh = self.cluster.respawn(info)
        except Exception as exc:  # noqa: BLE001 - any failure to start is one more failed start
            watch.backoff.grow()
            watch.restart_at = now + watch.backoff.delay_s
            log.error("%s could not be started again: %s; retrying in %.0f s", info.name, exc,
                      watch.backoff.delay_s)  # fmt: skip
            return
        log.info("%s started again as pid %d (restart %d)", fresh.name, fresh.proc.pid,
                 fresh.restarts)  # fmt: skip

    def run(self, stop: threading.Event) -> None:
        while not stop.wait(TICK_S):
            self.tick()


# -- the commands ------------------------------------------------------------------------


def add_cluster_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--bookies",
        type=int,
        default=DEFAULT_BOOKIES,
        help=f"bookie processes (default {DEFAULT_BOOKIES}: one more than the ensemble, so "
        "writes go on when a bookie dies)",
    )
    parser.add_argument("--write-proxies", type=int, default=1, help="write proxies (default 1)")
    parser.add_argument("--read-proxies", type=int, default=1, help="read proxies (default 1)")
    parser.add_argument("--ensemble-size", type=int, default=3, help="E of new ledgers (3)")
    parser.add_argument("--write-quorum", type=int, default=3, help="Qw: copies of an entry (3)")
    parser.add_argument("--ack-quorum", type=int, default=2, help="Qa: acks before success (2)")
    parser.add_argument(
        "--restart",
        action="store_true",
        help="start a child that died again, after a back-off (default: log it and leave it)",
    )
    parser.add_argument(
        "--zk-ensemble",
        type=int,
        choices=(1, 3),
        default=1,
        help="ZooKeeper servers (3: the metadata store survives losing one)",
    )
    parser.add_argument(
        "--no-autorecovery", action="store_true", help="do not run the autorecovery process"
    )
    parser.add_argument(
        "--tls",
        action="store_true",
        help="TLS on every hop: a CA and the services' certificate under DIR/tls, "
        "https proxies, ZooKeeper on a TLS port; cluster.json names the CA (docs/security.md)",
    )
    parser.add_argument(
        "--no-auth",
        action="store_true",
        help="no credentials at all: proxies and bookies without tokens, ZooKeeper open "
        "to anyone, no ledger secret (default: tokens required, an admin token printed "
        "once; ZooKeeper digest ACLs; cluster.json names the files; docs/security.md)",
    )


def _cluster_from_args(args: argparse.Namespace) -> LocalCluster:
    return LocalCluster(
        Path(args.dir),
        bookies=int(args.bookies),
        write_proxies=int(args.write_proxies),
        read_proxies=int(args.read_proxies),
        autorecovery=not args.no_autorecovery,
        autorecovery_args=LOCAL_AUTORECOVERY_ARGS,
        zk_ensemble=int(args.zk_ensemble),
        quorums=Quorums(args.ensemble_size, args.write_quorum, args.ack_quorum),
        service_session_timeout_ms=SERVICE_SESSION_TIMEOUT_MS,
        auth=not args.no_auth,
        tls=bool(args.tls),
        kafka=True,  # every proxy a Kafka broker too (docs/kafka.md)
    )


def _signals() -> threading.Event:
    stop = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return stop


def _start(cluster: LocalCluster) -> None:
    """Start the cluster, with a progress bar on a terminal."""
    from ops.progress import progress

    with progress("starting local cluster", total=cluster.process_count, unit="processes") as bar:
        cluster.start(on_ready=lambda name: bar.update(advance=1, note=f"{name} ready"))


def _children_log_like_us(args: argparse.Namespace) -> None:
    """Children inherit the environment: pass ``--log-format`` and ``-v`` on."""
    if getattr(args, "log_format", None):
        os.environ["BOOKLINE_LOG_FORMAT"] = args.log_format
    if getattr(args, "verbose", False):
        os.environ["BOOKLINE_LOG_LEVEL"] = "DEBUG"


def run_local(args: argparse.Namespace) -> int:
    stop = _signals()
    _children_log_like_us(args)
    cluster = _cluster_from_args(args)
    _start(cluster)
    try:
        print(json.dumps(cluster.describe(), indent=2), flush=True)
        _print_token(cluster)
        print(
            f"local cluster ready; cluster file {cluster.dir / 'cluster.json'}; "
            "`bookline status` shows it; Ctrl-C stops it",
            flush=True,
        )
        Supervisor(cluster, restart=args.restart).run(stop)
    finally:
        cluster.stop()
    return 0


def _print_token(cluster: LocalCluster) -> None:
    """The admin token, once (clients given cluster.json read it from its file)."""
    if cluster.auth is None:
        return
    print(f"token: {cluster.auth.token}", flush=True)
    print(
        f"(admin; clients using {cluster.dir / 'cluster.json'} send it themselves; "
        f"elsewhere: export BOOKLINE_TOKEN=$(cat {cluster.auth.token_file}) or "
        "`Authorization: Bearer <token>`)",
        flush=True,
    )


def run_demo(args: argparse.Namespace) -> int:
    from ops.cluster import demo

    stop = _signals()
    cluster = _cluster_from_args(args)
    _start(cluster)
    try:
        demo.show(cluster.describe())
        _print_token(cluster)
        demo.write_and_read(cluster.dir / "cluster.json")
        if getattr(args, "keep_running", False):
            print("cluster stays up; Ctrl-C stops it", flush=True)
            Supervisor(cluster, restart=args.restart).run(stop)
    finally:
        cluster.stop()
    return 0
