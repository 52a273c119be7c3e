"""``bookline bookie``'s flags, without the bookie's runtime.

The CLI builds its parser on every start (``bookline --version`` too); importing the
bookie's server, storage engine and ZooKeeper client for that cost a third of a second.
This module holds what the parser needs; the command's handler imports
:mod:`bookie.main` when it runs.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Final

ENV_PREFIX: Final = "BOOKLINE_BOOKIE_"

# flag -> config field; every flag is optional and overrides file and environment.
_FLAGS: Final[Mapping[str, tuple[str, type]]] = {
    "--bookie-id": ("bookie_id", str),
    "--host": ("host", str),
    "--port": ("port", int),
    "--metrics-port": ("metrics_port", int),
    "--zk": ("zk", str),
    "--root": ("root", str),
    "--journal-dir": ("journal_dir", str),
    "--ledgers-dir": ("ledgers_dir", str),
    "--index-dir": ("index_dir", str),
    "--disk-usage-threshold": ("disk_usage_threshold", float),
    "--disk-usage-lwm": ("disk_usage_lwm", float),
    "--disk-check-interval-ms": ("disk_check_interval_ms", int),
    "--session-timeout-ms": ("session_timeout_ms", int),
    "--gil-switch-interval-ms": ("gil_switch_interval_ms", float),
    # Test-only storage fault shim (bookie/storage/faults.py).
    "--fault-shim": ("fault_shim", str),
    "--fault-disk-bytes-max": ("fault_disk_bytes_max", int),
}


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``bookline bookie`` on the CLI's sub-command parser."""
    p = sub.add_parser("bookie", help="run a bookie (storage node) until SIGTERM")
    p.add_argument("--config", help="TOML file; settings come from its [bookie] section")
    for flag, (field, typ) in _FLAGS.items():
        p.add_argument(flag, dest=field, type=typ, default=None, help=f"bookie.{field}")
    p.add_argument(
        "--no-journal-sync",
        dest="journal_sync",
        action="store_const",
        const=False,
        default=None,
        help="skip fsync (benchmarks only; loses acknowledged writes on a crash)",
    )
    p.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from bookie.main import run  # the bookie's runtime, only when it runs

    return run(args)


