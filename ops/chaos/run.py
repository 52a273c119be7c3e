"""One chaos run: fresh cluster, workload + nemesis for a while, heal, final reads, check.

:func:`run_chaos` is what ``bookline chaos`` (``ops/cli/chaos.py``) calls. Everything
random comes from the seed: the nemesis's ``random.Random(seed)``, the gaps between its
faults, every writer's choices. A run's directory keeps what is needed to look again:
``cluster/`` (every process's log and data), ``history/`` (the writers' and the final
phase's JSON lines; ``python -c 'from ops.chaos.checker import *; ...'`` re-checks
them), ``faults.jsonl`` (each fault: kind, target, hold, start and heal times) and
``summary.json``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import random
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from foundation.errors import AlreadyExistsError, BooklineError
from ops.chaos.checker import ANOMALIES, check, load_history
from ops.chaos.final import final_phase
from ops.chaos.hosts import ChaosCluster
from ops.chaos.nemesis import Nemesis, ProcessTarget
from ops.chaos.workload import DEFAULT_LAYOUT, DRAIN_S, Layout, writer_argv
from ops.cluster import procs
from thinclient.proxy_client import ProxyClient

log = logging.getLogger(__name__)

__all__ = ["RunConfig", "run_chaos"]

# Writes per second of each writer process (4 writers): enough values to catch
# anomalies, little enough CPU to leave the cluster room on a small machine.
DEFAULT_RATE_PER_S: Final = 25.0
# Pause between two faults (seeded): the cluster gets a moment between them.
GAP_S: Final = (0.1, 0.6)
# Creating the run's streams and topics is retried this long (proxies starting).
SETUP_DEADLINE_S: Final = 120.0
# A writer that ignores SIGTERM this long past its drain is killed.
WRITER_STOP_GRACE_S: Final = DRAIN_S + 15.0


@dataclass(frozen=True, slots=True)
class RunConfig:
    duration_s: float
    seed: int
    directory: Path
    namespaces: bool = True
    rate_per_s: float = DEFAULT_RATE_PER_S
    layout: Layout = DEFAULT_LAYOUT
    # The proxies require tokens; the writers and the final phase use the admin token
    # cluster.json names (the core library goes to ZooKeeper and the bookies).
    auth: bool = True


class WriterProcess:
    """One writer of the workload as a process the nemesis may kill and restart; each
    start is a new incarnation (a new producer id: a restart never reuses one)."""

    def __init__(self, name: str, kind: str, config: RunConfig, cluster_file: Path) -> None:
        self.name, self.kind = name, kind
        self._config = config
        self._cluster_file = cluster_file
        self.incarnation = 0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def history_dir(self) -> Path:
        return self._config.directory / "history"

    def current(self) -> subprocess.Popen[bytes] | None:
        return self.proc

    def start(self) -> None:
        self.incarnation += 1
        argv = writer_argv(
            name=self.name, kind=self.kind, incarnation=self.incarnation,
            cluster_file=self._cluster_file, history=self.history_dir,
            seed=self._config.seed, rate_per_s=self._config.rate_per_s,
        )  # fmt: skip
        log_path = self._config.directory / "writers" / f"{self.name}.log"
        self.proc = procs.spawn(argv, log_path=log_path, cwd=Path.cwd())

    def stop(self) -> None:
        """SIGTERM (the writer drains what is in flight), then stop it by pid."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGCONT)  # a paused writer cannot drain
                proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=WRITER_STOP_GRACE_S)
        procs.stop(proc, grace_s=1.0)


async def _setup(cluster_file: Path, layout: Layout) -> None:
    """Create the run's streams and topics through the proxies (retried while the
    proxies come up)."""
    deadline = time.monotonic() + SETUP_DEADLINE_S
    async with ProxyClient.from_cluster_file(cluster_file) as client:
        topics = [(t, layout.partitions) for t in (layout.topic, layout.core_topic)]
        topics = [(t, n) for t, n in topics if n > 0]
        if layout.kafka_topic is not None:  # Kafka clients see the topics HTTP makes
            topics.append((layout.kafka_topic, layout.kafka_partitions))
        todo: list[Callable[[], Any]] = [
            *(lambda s=s: client.create_stream(s) for s in layout.thin_streams),
            *(lambda s=s: client.create_stream(s) for s in layout.core_streams),
            *(lambda t=t, n=n: client.create_topic(t, n) for t, n in topics),
        ]  # fmt: skip
        for make in todo:
            while True:
                try:
                    await make()
                    break
                except AlreadyExistsError:
                    break
                except BooklineError as exc:
                    if time.monotonic() > deadline:
                        raise
                    log.info("setting up the run's streams: %s; again", exc)
                    await asyncio.sleep(1.0)


async def _unleash(nemesis: Nemesis, config: RunConfig, faults_path: Path) -> tuple[int, list[str]]:
    """Steps one after another until the duration is over; (steps, errors)."""
    gaps = random.Random(f"{config.seed}/gaps")
    deadline = time.monotonic() + config.duration_s
    steps, errors = 0, []
    # Every fault, as it is healed (also the ones of a step that failed).
    nemesis.on_fault = lambda fault: _append_line(faults_path, json.dumps(fault.to_json()))
    while time.monotonic() < deadline:
        try:
            await nemesis.step()
        except (BooklineError, OSError, RuntimeError, TimeoutError) as exc:
            # A fault that could not be started or healed: said, healed, and on.
            log.error("nemesis step failed: %r", exc)
            errors.append(repr(exc)[:300])
            await nemesis.heal_all()
            continue
        steps += 1
        await asyncio.sleep(gaps.uniform(*GAP_S))
    return steps, errors


def _append_line(path: Path, line: str) -> None:
    with open(path, "a") as out:  # a few lines per run: blocking the loop is fine
        out.write(line + "\n")


def _stop_all(writers: list[WriterProcess]) -> None:
    for writer in writers:
        writer.stop()


async def _run(config: RunConfig) -> dict[str, Any]:
    started = time.monotonic()
    config.directory.mkdir(parents=True, exist_ok=True)
    history_dir = config.directory / "history"
    cluster = ChaosCluster(config.directory / "cluster", namespaces=config.namespaces,
                           seed=config.seed, auth=config.auth)  # fmt: skip
    writers: list[WriterProcess] = []
    try:
        await asyncio.to_thread(cluster.start)
        await _setup(cluster.cluster_file, config.layout)
        writers = [
            WriterProcess(name, kind, config, cluster.cluster_file)
            for name, kind in config.layout.writer_names()
        ]
        nemesis = Nemesis(cluster, random.Random(config.seed))
        for writer in writers:
            writer.start()
            nemesis.add_target(ProcessTarget(writer.name, writer.current, writer.start))
        steps, nemesis_errors = await _unleash(nemesis, config, config.directory / "faults.jsonl")
        log.info("healing everything after %d faults", steps)
        await nemesis.heal_all()
        await asyncio.to_thread(_stop_all, writers)
        replicas = await final_phase(cluster.cluster_file, history_dir, config.layout)
        result = check(load_history(history_dir))
    finally:
        for writer in writers:
            writer.stop()
        await asyncio.to_thread(cluster.stop)
    faults = nemesis.counts()
    summary: dict[str, Any] = {
        **result.to_json(),
        "faults": faults,
        "faults_total": sum(faults.values()),
        "faults_ineffective": nemesis.ineffective(),
        **nemesis.overlap_stats(),
        "steps": steps,
        "nemesis_errors": nemesis_errors,
        "seed": config.seed,
        "workload": "kafka" if config.layout.kafka_topic else "bookline",
        "duration_s": config.duration_s,
        "elapsed_s": round(time.monotonic() - started, 1),
        "namespaces": cluster.skip_reason is None,
        "auth": config.auth,
        "skip_reason": cluster.skip_reason,
        "writer_starts": {w.name: w.incarnation for w in writers},
        **replicas,
        "valid": result.valid,
        "ok": result.ok,
        "dir": str(config.directory),
    }
    (config.directory / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def run_chaos(config: RunConfig) -> dict[str, Any]:
    """Run once (blocking); the summary (``ok`` False on any anomaly or when the check
    could not judge every acknowledged value)."""
    return asyncio.run(_run(config))


def anomaly_total(summary: dict[str, Any]) -> int:
    return sum(int(summary[name]) for name in ANOMALIES)
