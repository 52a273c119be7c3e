"""``bookline autorecovery`` and ``bookline bookie decommission``.

* ``autorecovery --zk ZK --root ROOT [--grace-ms N] ...`` -- stand for auditor
  election and run a replication worker until SIGTERM/SIGINT
  (:class:`ledger.autorecovery.Autorecovery`);
* ``bookie decommission ID --zk ZK --root ROOT`` -- move every replica the bookie holds
  to other bookies, print a summary, exit 0; the bookie can then be stopped.

Settings come from ``--config`` ([autorecovery] section), ``BOOKLINE_AUTORECOVERY_*``
and flags, in that order of precedence (flags win).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
from typing import TYPE_CHECKING, Final

from bookline.config import MetadataConfig, load_config
from bookline.errors import ConfigError

if TYPE_CHECKING:  # the runtime is imported when a command runs, not to build the CLI
    from ledger.autorecovery import AutorecoveryConfig

__all__ = ["register"]

# Decommission gives up after this long by default (re-running continues the work).
DECOMMISSION_TIMEOUT_MS_DEFAULT: Final = 3_600_000

# flag -> config field; every flag is optional and overrides file and environment.
_FLAGS: Final = {
    "--grace-ms": "grace_ms",
    "--full-check-interval-ms": "full_check_interval_ms",
    "--open-ledger-grace-ms": "open_ledger_grace_ms",
    "--ledgers-in-flight-max": "ledgers_in_flight_max",
    "--entries-in-flight-max": "entries_in_flight_max",
}


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("autorecovery", help="run the auditor and a replication worker")
    _common(p)
    p.add_argument("--no-auditor", action="store_true", help="only run a replication worker")
    p.set_defaults(handler=_run_autorecovery)

    # `bookline bookie` itself runs a bookie; `bookline bookie decommission` hangs off it.
    bookie = sub.choices.get("bookie")
    if bookie is None:
        raise ConfigError("register `bookie` before autorecovery's `bookie decommission`")
    ops = bookie.add_subparsers(dest="bookie_op", metavar="OP")
    d = ops.add_parser("decommission", help="move a bookie's replicas elsewhere, then exit")
    d.add_argument("bookie_id", metavar="ID", help="bookie id as registered (host:port)")
    _common(d)
    d.add_argument(
        "--timeout-ms",
        type=int,
        default=DECOMMISSION_TIMEOUT_MS_DEFAULT,
        help="give up after this long (exit 1; re-run to continue)",
    )
    d.add_argument("--json", action="store_true", help="print the summary as JSON")
    d.set_defaults(handler=_run_decommission)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--zk", required=True, help="ZooKeeper connect string")
    p.add_argument("--root", required=True, help="cluster root znode, e.g. /bookline")
    p.add_argument("--config", help="TOML file; settings from its [autorecovery] section")
    p.add_argument("--session-timeout-ms", type=int, default=10_000, help="ZooKeeper session")
    for flag, field in _FLAGS.items():
        p.add_argument(flag, dest=field, type=int, default=None, help=f"autorecovery.{field}")


def _config(args: argparse.Namespace, **extra: object) -> AutorecoveryConfig:
    from ledger.autorecovery import ENV_PREFIX, AutorecoveryConfig

    overrides: dict[str, object] = {f: getattr(args, f, None) for f in _FLAGS.values()}
    overrides.update(extra)
    return load_config(
        AutorecoveryConfig,
        path=args.config,
        section="autorecovery",
        env_prefix=ENV_PREFIX,
        overrides=overrides,
    )


def _metadata(args: argparse.Namespace) -> MetadataConfig:
    return MetadataConfig(zk=args.zk, root=args.root, session_timeout_ms=args.session_timeout_ms)


def _run_autorecovery(args: argparse.Namespace) -> int:
    config = _config(args, auditor_enabled=False if args.no_auditor else None)
    return asyncio.run(_serve(_metadata(args), config))


async def _serve(metadata: MetadataConfig, config: AutorecoveryConfig) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    from ledger.autorecovery import Autorecovery

    ar = await Autorecovery.connect(metadata, config)
    try:
        await ar.start()
        print(f"autorecovery ready id={ar.instance_id}", flush=True)
        stopped = asyncio.ensure_future(stop.wait())
        failed = asyncio.ensure_future(ar.wait())
        done, pending = await asyncio.wait({stopped, failed}, return_when=asyncio.FIRST_COMPLETED)
        for fut in pending:
            fut.cancel()
            with contextlib.suppress(asyncio.CancelledError):  # cancelled just above
                await fut
        if failed in done:
            failed.result()  # a part died on its own: report its error
    finally:
        await ar.stop()
    return 0


def _run_decommission(args: argparse.Namespace) -> int:
    return asyncio.run(_decommission(args, _config(args)))


async def _decommission(args: argparse.Namespace, config: AutorecoveryConfig) -> int:
    from ledger.autorecovery import connect_parts, decommission

    md, client, lister = await connect_parts(_metadata(args))
    try:
        summary = await decommission(
            md, client, args.bookie_id, config, timeout_ms=args.timeout_ms, list_entries=lister
        )
    finally:
        await client.close()
    if args.json:
        print(json.dumps({
            "bookie_id": summary.bookie_id,
            "ledgers_found": summary.ledgers_found,
            "ledgers_replicated": summary.ledgers_replicated,
            "rounds": summary.rounds,
            "elapsed_ms": summary.elapsed_ms,
        }))  # fmt: skip
    else:
        print(
            f"decommissioned {summary.bookie_id}: {summary.ledgers_found} ledgers referenced "
            f"it, {summary.ledgers_replicated} re-replicated here, {summary.rounds} rounds, "
            f"{summary.elapsed_ms} ms; no ledger references it now"
        )
    return 0
