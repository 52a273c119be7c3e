"""``bookline autorecovery``, ``bookline bookie decommission`` and ``bookline bookie scrub``.

* ``autorecovery --zk ZK --root ROOT [--id ID] [--grace-ms N] ...`` -- stand for auditor
  election and run a replication worker until SIGTERM/SIGINT
  (:class:`ledger.autorecovery.Autorecovery`);
* ``autorecovery status|enable|disable`` -- whether re-replication runs, the elected
  auditor, how many ledgers are under-replicated and which are being repaired; pause
  or resume the replication workers (a znode they look at; the auditor keeps marking);
* ``bookie decommission ID --zk ZK --root ROOT`` -- move every replica the bookie holds
  to other bookies (a progress bar on a terminal), print a summary, exit 0; the bookie
  can then be stopped;
* ``bookie scrub [--ledger ID] --zk ZK --root ROOT [--repair] [--json]`` -- the replica
  check by hand (:func:`ledger.autorecovery.scrub`): compare every closed ledger's (or
  one ledger's) replicas and print what live bookies lack or hold damaged. Read-only
  unless ``--repair``, which marks the findings as work items and re-copies them in
  this process (running autorecovery workers may help) before exiting. Exit status 0:
  nothing wrong (or all of it repaired) and every bookie answered; 3: something found
  and not repaired, or some bookie could not be checked; 1: an error (with its code).

Where the cluster is: ``--zk ZK --root ROOT``, or ``--cluster FILE`` (default
``$BOOKLINE_CLUSTER``). Settings come from ``--config`` ([autorecovery] section),
``BOOKLINE_AUTORECOVERY_*`` and flags, in that order of precedence (flags win).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import signal
from typing import TYPE_CHECKING, Any, Final

from foundation.cluster_file import read_cluster_file
from foundation.config import MetadataConfig, load_config
from foundation.errors import ConfigError
from foundation.names import validate_name
from foundation.service import add_config_flags
from ledger.autorecovery_config import ENV_PREFIX, AutorecoveryConfig
from ops.cli.common import ENV_CLUSTER, add_cluster_flags, open_metadata, sub_ops, table
from ops.cluster.client_env import use_cluster_credentials
from ops.progress import progress

if TYPE_CHECKING:  # the runtime is imported when a command runs, not to build the CLI
    from ledger.autorecovery import ScrubOutcome

__all__ = ["register"]

# Decommission gives up after this long by default (re-running continues the work).
DECOMMISSION_TIMEOUT_MS_DEFAULT: Final = 3_600_000
# A scrub's repairs give up after this long by default (re-running continues them).
SCRUB_TIMEOUT_MS_DEFAULT: Final = 3_600_000
# Exit status of a scrub that found something it did not repair (1 is an error).
EXIT_SCRUB_FOUND: Final = 3
DEFAULT_ROOT: Final = "/bookline"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("autorecovery", help="run the auditor and a replication worker")
    _common(p)
    p.add_argument("--no-auditor", action="store_true", help="only run a replication worker")
    p.add_argument(
        "--http-port",
        type=int,
        default=-1,
        help="serve /metrics and /health on this port (0 picks one; default -1: off)",
    )
    p.add_argument("--http-host", default="127.0.0.1", help="address of /metrics and /health")
    p.add_argument(
        "--id",
        dest="instance_id",
        metavar="ID",
        help="this process's id in status, the auditor election and logs "
        "(default HOSTNAME-PID; `bookline local` passes its child name)",
    )
    p.set_defaults(handler=_run_autorecovery)
    ar_ops = sub_ops(p, "autorecovery_op")
    for name, text in (
        ("status", "enabled or paused, the auditor, under-replicated ledgers, repairs under way"),
        ("enable", "resume re-replication (workers take under-replicated ledgers again)"),
        ("disable", "pause re-replication (the auditor still marks; nothing is copied)"),
    ):
        q = ar_ops.add_parser(name, help=text)
        add_cluster_flags(q, token=False)
        q.set_defaults(handler=_run_admin)

    # `bookline bookie` itself runs a bookie; `bookline bookie decommission` hangs off it.
    bookie = sub.choices.get("bookie")
    if bookie is None:
        raise ConfigError("register `bookie` before autorecovery's `bookie decommission`")
    ops = sub_ops(bookie, "bookie_op")
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

    s = ops.add_parser(
        "scrub", help="compare ledgers' replicas; --repair re-copies what bookies lack"
    )
    s.add_argument("--ledger", type=int, metavar="ID", help="only this ledger (default: all)")
    _common(s)
    s.add_argument(
        "--repair",
        action="store_true",
        help="mark what was found and re-copy it now (default: report only)",
    )
    s.add_argument(
        "--timeout-ms",
        type=int,
        default=SCRUB_TIMEOUT_MS_DEFAULT,
        help="give up repairing after this long (exit 1; re-run to continue)",
    )
    s.add_argument("--json", action="store_true", help="print the report as JSON")
    s.set_defaults(handler=_run_scrub)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--zk", help="ZooKeeper connect string (or --cluster)")
    p.add_argument("--root", help="cluster root znode (default /bookline; or --cluster)")
    p.add_argument(
        "--cluster",
        default=os.environ.get(ENV_CLUSTER),
        help=f"cluster.json naming ZooKeeper and the root (default ${ENV_CLUSTER})",
    )
    p.add_argument("--config", help="TOML file; settings from its [autorecovery] section")
    p.add_argument("--session-timeout-ms", type=int, default=10_000, help="ZooKeeper session")
    # Every setting is a flag too (help: the comment above the field), overriding both.
    add_config_flags(p, AutorecoveryConfig, "autorecovery", config_flag=False)


def _config(args: argparse.Namespace, **extra: object) -> AutorecoveryConfig:
    overrides: dict[str, object] = {
        f.name: getattr(args, f"cfg_{f.name}", None) for f in dataclasses.fields(AutorecoveryConfig)
    }
    overrides.update(extra)
    return load_config(
        AutorecoveryConfig,
        path=args.config,
        section="autorecovery",
        env_prefix=ENV_PREFIX,
        overrides=overrides,
    )


def _metadata(args: argparse.Namespace) -> MetadataConfig:
    """ZooKeeper and root from ``--zk``/``--root``, else from ``--cluster`` (with its
    ZooKeeper digest credentials)."""
    digest = ""  # --zk: $BOOKLINE_METADATA_DIGEST_FILE's, if any
    if args.zk:
        zk, root = args.zk, args.root or DEFAULT_ROOT
    elif args.cluster:
        cluster = read_cluster_file(args.cluster)
        zk, root, digest = cluster.zk, args.root or cluster.root, cluster.zk_digest_file or ""
        use_cluster_credentials(args)  # its token for the bookies, its ledger secret
    else:
        raise ConfigError(
            f"say where the cluster is: --zk ZK [--root ROOT] or --cluster FILE (${ENV_CLUSTER})"
        )
    timeout_s = getattr(args, "timeout", None)  # client commands: how long to wait for ZK
    connect: dict[str, Any] = {"connect_timeout_ms": int(timeout_s * 1000)} if timeout_s else {}
    return MetadataConfig(
        zk=zk,
        root=root,
        session_timeout_ms=args.session_timeout_ms,
        digest_file=digest,
        **connect,
    )


def _run_autorecovery(args: argparse.Namespace) -> int:
    config = _config(args, auditor_enabled=False if args.no_auditor else None)
    http = (args.http_host, args.http_port) if args.http_port >= 0 else None
    if args.instance_id is not None:
        validate_name(args.instance_id, "autorecovery id")
    return asyncio.run(_serve(_metadata(args), config, http, args.instance_id))


async def _serve(
    metadata: MetadataConfig,
    config: AutorecoveryConfig,
    http: tuple[str, int] | None = None,
    instance_id: str | None = None,
) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    from ledger.autorecovery import Autorecovery
    from ops.cluster.autorecovery_http import AutorecoveryHttp

    ar = await Autorecovery.connect(metadata, config, instance_id=instance_id)
    endpoints = AutorecoveryHttp(ar)
    try:
        await ar.start()
        url = await endpoints.start(*http) if http is not None else "-"
        print(f"autorecovery ready id={ar.instance_id} http={url}", flush=True)
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
        await endpoints.stop()
        await ar.stop()
    return 0


def _run_admin(args: argparse.Namespace) -> int:
    return asyncio.run(_admin(args))


async def _admin(args: argparse.Namespace) -> int:
    from ledger.auditor import current_leader

    async with open_metadata(args) as md:
        ur = md.underreplicated
        if args.autorecovery_op in ("enable", "disable"):
            await ur.set_replication_enabled(args.autorecovery_op == "enable")
        status: dict[str, Any] = {
            "enabled": await ur.replication_enabled(),
            "auditor": await current_leader(md),
            "underreplicated": len(await ur.list()),
            "repairing": {str(k): v for k, v in sorted((await ur.list_claims()).items())},
        }
    if args.json:
        print(json.dumps(status, sort_keys=True))
        return 0
    if args.autorecovery_op != "status":
        print(f"re-replication {'resumed' if status['enabled'] else 'paused'}")
    repairing = ", ".join(f"{k} ({v})" for k, v in status["repairing"].items()) or "none"
    table(
        "autorecovery",
        ("what", "value"),
        [
            ("re-replication", "enabled" if status["enabled"] else "PAUSED"),
            ("auditor", status["auditor"] or "none (no autorecovery process runs)"),
            ("under-replicated ledgers", status["underreplicated"]),
            ("being repaired", repairing),
        ],
    )
    return 0


def _run_decommission(args: argparse.Namespace) -> int:
    return asyncio.run(_decommission(args, _config(args)))


async def _decommission(args: argparse.Namespace, config: AutorecoveryConfig) -> int:
    from ledger.autorecovery import connect_parts, decommission

    md, client, lister, _inspector = await connect_parts(_metadata(args))
    try:
        with progress(f"decommission {args.bookie_id}", unit="ledgers moved") as bar:

            def moved(left: int, found: int) -> None:
                bar.total = found
                bar.update(done=found - left)

            summary = await decommission(
                md,
                client,
                args.bookie_id,
                config,
                timeout_ms=args.timeout_ms,
                list_entries=lister,
                on_progress=moved,
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


def _run_scrub(args: argparse.Namespace) -> int:
    return asyncio.run(_scrub(args, _config(args)))


async def _scrub(args: argparse.Namespace, config: AutorecoveryConfig) -> int:
    from foundation.errors import NoLedgerError
    from ledger.autorecovery import connect_parts, scrub

    md, client, lister, inspector = await connect_parts(_metadata(args))
    try:
        outcome = await scrub(
            md,
            client,
            inspector,
            config,
            ledger_ids=None if args.ledger is None else [args.ledger],
            repair=args.repair,
            timeout_ms=args.timeout_ms,
            list_entries=lister,
        )
    finally:
        await client.close()
    summary = outcome.summary
    if args.ledger is not None and summary.ledgers_gone:
        raise NoLedgerError(f"ledger {args.ledger} does not exist")
    if args.json:
        print(json.dumps(_scrub_json(outcome)))
    else:
        _print_scrub(outcome)
    return 0 if outcome.clean else EXIT_SCRUB_FOUND


def _scrub_json(outcome: ScrubOutcome) -> dict[str, object]:
    from ledger.scrub import Problem

    summary = outcome.summary
    reports = summary.reports
    return {
        "ledgers_checked": summary.ledgers_checked,
        "ledgers_skipped": summary.ledgers_skipped,
        "ledgers_gone": summary.ledgers_gone,
        "entries_checked": summary.entries_checked,
        **{p.value: summary.total(p) for p in Problem},
        "unrecoverable": sum(r.unrecoverable for r in reports),
        "conflicts": sum(r.conflicts for r in reports),
        "unchecked": sum(len(r.unchecked) for r in reports),
        "marked": len(outcome.marked),
        "entries_repaired": outcome.entries_repaired,
        "clean": outcome.clean,
        "ledgers": [r.to_json() for r in reports],
    }


def _print_scrub(outcome: ScrubOutcome) -> None:
    from ledger.scrub import Problem

    summary = outcome.summary
    rows = [
        (r.ledger_id, bookie, counts, r.repairs.get(bookie, ()))
        for r in summary.reports
        for bookie, counts in sorted(r.counts.items())
    ]
    if rows:
        print(
            f"{'LEDGER':>10}  {'BOOKIE':<24} {'MISSING':>8} {'DAMAGED':>8} {'MISMATCH':>8}  RANGES"
        )
        for ledger_id, bookie, counts, ranges in rows:
            shown = " ".join(f"{a}-{b}" if a != b else str(a) for a, b in ranges[:8])
            more = f" (+{len(ranges) - 8})" if len(ranges) > 8 else ""
            print(
                f"{ledger_id:>10}  {bookie:<24} {counts.get(Problem.MISSING, 0):>8} "
                f"{counts.get(Problem.DAMAGED, 0):>8} {counts.get(Problem.MISMATCHED, 0):>8}"
                f"  {shown}{more}"
            )
    for r in summary.reports:
        if r.unrecoverable or r.conflicts:
            print(
                f"ledger {r.ledger_id}: {r.unrecoverable} entries without a verified copy, "
                f"{r.conflicts} with conflicting copies (e.g. {r.samples}); not repaired"
            )
        for bookie, error in sorted(r.unchecked.items()):
            print(f"ledger {r.ledger_id}: bookie {bookie} not checked: {error}")
    repaired = (
        f"; {len(outcome.marked)} ledgers repaired ({outcome.entries_repaired} entry copies)"
        if outcome.marked
        else ""
    )
    verdict = "clean" if outcome.clean else "PROBLEMS FOUND"
    print(
        f"scrub: {summary.ledgers_checked} ledgers ({summary.entries_checked} entries) "
        f"checked, {summary.ledgers_skipped} not closed yet (skipped){repaired}: {verdict}"
    )
