"""The ``bookline`` command line.

Sub-commands are registered by small modules under :mod:`ops`; this module only builds
the parser, sets up logging (:mod:`foundation.logs`), checks that the cluster a client
command names answers within ``--timeout`` (:func:`ops.cli_common.check_reachable`),
and maps :class:`~foundation.errors.BooklineError` to ``NAME (code): message`` plus a
hint, with the exit status of its class (:data:`ops.cli_common.EXIT_CODES`).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
from collections.abc import Callable, Sequence

from foundation import logs, tls
from foundation.cluster_file import read_cluster_file
from foundation.errors import BooklineError, ConfigError
from foundation.version import __version__
from ops import (
    bench,
    cli_auth,
    cli_autorecovery,
    cli_bookie,
    cli_bookie_admin,
    cli_chaos,
    cli_consume,
    cli_group,
    cli_ledger,
    cli_pipeline,
    cli_status,
    cli_stream,
    cli_subscription,
    cli_zk,
)
from ops.cli_common import (
    EXIT_CODES,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    add_common_flags,
    check_reachable,
    exit_code,
    hint,
)
from ops.cli_topic import register as register_topic
from ops.supervisor import add_cluster_flags as local_flags
from readproxy import main as readproxy_main
from writeproxy import main as writeproxy_main

log = logging.getLogger("bookline")

Handler = Callable[[argparse.Namespace], int]


def _cmd_demo(args: argparse.Namespace) -> int:
    from ops import supervisor

    return supervisor.run_demo(args)


def _cmd_local(args: argparse.Namespace) -> int:
    from ops import supervisor

    return supervisor.run_local(args)


# Commands that run servers or long jobs log at INFO; the others (admin and client
# commands) print their answer and log only warnings unless -v.
_SERVICE_COMMANDS = frozenset(
    {"local", "demo", "bench", "pipeline", "writeproxy", "readproxy", "chaos"}
)


def _runs_a_service(args: argparse.Namespace) -> bool:
    command = getattr(args, "command", None)
    if command in ("bookie", "autorecovery"):  # the bare command runs one; its ops don't
        return getattr(args, f"{command}_op", None) is None
    return command in _SERVICE_COMMANDS


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bookline",
        description="Bookline: a replicated log service (bookies, ledgers, streams, proxies).",
        epilog="exit status: "
        + "; ".join(f"{code} {meaning}" for code, meaning in EXIT_CODES.items()),
    )
    parser.add_argument("--version", action="version", version=f"bookline {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p_local = sub.add_parser(
        "local",
        help="run a local cluster in the foreground until Ctrl-C, watching its processes",
    )
    p_local.add_argument("--dir", required=True, help="state directory (kept across restarts)")
    local_flags(p_local)
    p_local.set_defaults(handler=_cmd_local)

    p_demo = sub.add_parser("demo", help="start a local cluster, show what it holds, stop it")
    p_demo.add_argument("--dir", required=True, help="state directory (kept across restarts)")
    p_demo.add_argument("--keep-running", action="store_true", help="stay up until Ctrl-C")
    local_flags(p_demo)
    p_demo.set_defaults(handler=_cmd_demo)

    # Sub-command groups living in their own modules register here, one line each.
    cli_bookie.add_parser(sub)
    cli_autorecovery.register(sub)  # after `bookie`: adds `bookie decommission`
    cli_bookie_admin.register(sub)  # `bookie list|info|readonly|writable`, `cookie show`
    bench.register(sub)
    writeproxy_main.add_parser(sub)
    readproxy_main.add_parser(sub)
    cli_stream.register(sub)
    register_topic(sub)  # `topic ...` and `produce` (ops/cli_topic.py)
    cli_pipeline.register(sub)
    cli_group.register(sub)
    cli_consume.register(sub)
    cli_status.register(sub)
    cli_ledger.register(sub)
    cli_subscription.register(sub)
    cli_zk.register(sub)
    cli_auth.register(sub)  # `auth token|hash`: credentials (docs/security.md)
    cli_chaos.register(sub)  # `chaos`: workload + nemesis + checker (ops/chaos/)
    add_common_flags(parser)  # -v, --log-format everywhere; --timeout beside --cluster
    return parser


def _tls_settings(args: argparse.Namespace) -> tls.TlsConfig:
    """[tls] of --config and BOOKLINE_TLS_*; when they leave TLS off, a --cluster file
    naming a CA (``bookline local --tls``) turns it on for this client."""
    config = tls.load_tls(getattr(args, "config", None))
    cluster = _cluster_named(args)
    if config.enabled or not cluster:
        return config
    # A missing or stopped cluster file is the command's to report, in its own words.
    with contextlib.suppress(ConfigError):
        return tls.cluster_tls(read_cluster_file(cluster).raw) or config
    return config


def _cluster_named(args: argparse.Namespace) -> str | None:
    """The cluster file this command uses: none when ``--zk`` says where the cluster
    is (``--cluster`` may be just ``$BOOKLINE_CLUSTER``'s default, of another cluster or
    of one not started yet)."""
    if getattr(args, "zk", None):
        return None
    cluster: str | None = getattr(args, "cluster", None)
    return cluster


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logs.setup(verbose=args.verbose, fmt=args.log_format, quiet=not _runs_a_service(args))
    handler: Handler | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return EXIT_USAGE
    try:
        # Every command's TLS ([tls] of --config, BOOKLINE_TLS_*): servers listen with
        # it, clients dial bookies, proxies and ZooKeeper with it (foundation.tls).
        tls.configure(_tls_settings(args))
        cluster = _cluster_named(args)
        if cluster and getattr(args, "timeout", None):
            # Something of the cluster answers, or we say so now (not after 30 s).
            check_reachable(read_cluster_file(cluster), args.timeout)
        return handler(args)
    except BooklineError as exc:
        print(f"bookline: error {exc.name} ({exc.code}): {exc.message}", file=sys.stderr)
        advice = hint(exc)
        if advice:
            print(f"bookline: hint: {advice}", file=sys.stderr)
        return exit_code(exc)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
