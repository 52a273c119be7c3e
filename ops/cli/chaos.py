"""``bookline chaos --duration S --seed N [--workload bookline|kafka] [--json] [...]``.

A fresh cluster of separate hosts (network namespaces, or loopback with the reason
printed), the workload and the nemesis for ``S`` seconds, then heal, final reads and the
check (:mod:`ops.chaos.run`). ``--workload kafka`` runs librdkafka's idempotent
producers and a consumer group over the proxies' Kafka listeners instead of Bookline's
own clients (:mod:`ops.chaos.kafka_clients`). The seed is printed first; the last line
of stdout is the summary as one JSON object with ``--json``. Exit status 1 when the
checker found an anomaly (or could not judge every acknowledged value), 0 otherwise.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any, Final

from ops.cli.common import EXIT_ERROR, EXIT_OK

__all__ = ["register"]

DURATION_DEFAULT_S: Final = 60.0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "chaos",
        help="Jepsen-style test: workload + faults on a fresh cluster, then check the history",
    )
    p.add_argument("--duration", type=float, default=DURATION_DEFAULT_S,
                   help="seconds of faults under load (default %(default)s)")  # fmt: skip
    p.add_argument("--seed", type=int, default=None, help="replays a run (default: random)")
    p.add_argument("--json", action="store_true", help="last line: the summary as JSON")
    p.add_argument("--no-namespaces", action="store_true",
                   help="run the hosts on loopback (no network faults)")  # fmt: skip
    p.add_argument("--dir", default=None,
                   help="run directory (default: a temp dir)")  # fmt: skip
    p.add_argument("--no-auth", action="store_true",
                   help="no credentials (default: tokens, ZooKeeper digest ACLs)")  # fmt: skip
    p.add_argument("--workload", choices=("bookline", "kafka"), default="bookline",
                   help="bookline: Bookline's own clients (default); kafka: librdkafka "
                        "idempotent producers and a consumer group")  # fmt: skip
    p.add_argument("--rate", type=float, default=None,
                   help="writes per second of each writer process")  # fmt: skip
    p.set_defaults(handler=_run)


def _show(summary: dict[str, Any]) -> None:
    faults = ", ".join(f"{k} {v}" for k, v in sorted(summary["faults"].items())) or "none"
    print(f"acknowledged {summary['acked']} of {summary['attempted']} attempted "
          f"({summary['unknown']} unknown, {summary['failed']} refused)")  # fmt: skip
    names = ["lost", "duplicated", "reordered", "inconsistent", "unexpected", "failed_present"]
    if summary.get("workload") == "kafka":
        print(f"consumed {summary['consumed']} records in the group")
        names += ["consumed_phantom", "unconsumed", "commit_behind"]
    for name in (*names, "recovered", "unverified", "read_errors"):
        print(f"  {name:16} {summary[name]}")
    print(f"faults: {summary['faults_total']} took effect ({faults}); "
          f"{summary.get('faults_overlapping', 0)} overlapping, at most "
          f"{summary.get('bookies_down_max', 0)} bookies down at once; not effective: "
          f"{summary.get('faults_ineffective') or 'none'}")  # fmt: skip
    for name, samples in summary.get("samples", {}).items():
        print(f"  e.g. {name}: {', '.join(samples[:3])}")
    print("OK: no anomaly" if summary["ok"] else "FAILED: see the anomalies above")


def _interrupt(signum: int, _frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _run(args: argparse.Namespace) -> int:
    from ops.chaos.run import DEFAULT_RATE_PER_S, RunConfig, run_chaos
    from ops.chaos.workload import WORKLOADS

    # SIGTERM ends a run like Ctrl-C: the cluster, its namespaces and the writers are
    # stopped on the way out (the default action would leave them all behind).
    signal.signal(signal.SIGTERM, _interrupt)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 31)
    directory = Path(args.dir or tempfile.mkdtemp(prefix=f"bl-chaos-{seed}-"))
    print(f"chaos: seed {seed}, {args.duration:g} s, {args.workload} workload, "
          f"directory {directory}", flush=True)  # fmt: skip
    config = RunConfig(
        duration_s=args.duration,
        seed=seed,
        directory=directory,
        namespaces=not args.no_namespaces,
        rate_per_s=args.rate or DEFAULT_RATE_PER_S,
        auth=not args.no_auth,
        layout=WORKLOADS[args.workload],
    )
    summary = run_chaos(config)
    if args.json:
        sys.stdout.write(json.dumps(summary, sort_keys=True) + "\n")
    else:
        _show(summary)
    return EXIT_OK if summary["ok"] else EXIT_ERROR
