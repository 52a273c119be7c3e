"""The ``bookline`` command line: its table of commands, its parser and ``main``.

Sub-commands are registered by the modules beside this one (:mod:`ops.cli`), by
:mod:`ops.bench.command` and by the proxies' ``main``; this module only builds
the parser, sets up logging (:mod:`foundation.logs`), checks that the cluster a client
command names answers within ``--timeout`` (:func:`ops.cli.common.check_reachable`),
and maps :class:`~foundation.errors.BooklineError` to ``NAME (code): message`` plus a
hint, with the exit status of its class (:data:`ops.cli.common.EXIT_CODES`).
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Final, cast

from foundation.version import __version__
from ops.cli.parser import EXIT_USAGE, Parser

if TYPE_CHECKING:
    from foundation import tls

Handler = Callable[[argparse.Namespace], int]
Registrar = Callable[["argparse._SubParsersAction[argparse.ArgumentParser]"], None]

# Exit status of Ctrl-C (README's table; ops.cli.common.EXIT_INTERRUPTED).
EXIT_INTERRUPTED: Final = 130

# Every command: its name and one-line help for `bookline --help`, and the registrars
# ("module:function", run in order) that build its real parser. Only the registrars of
# the command being run are imported, so `--version`, `--help` and a simple admin
# command do not pay for the servers, ZooKeeper client, benchmarks or Spark below the
# others (issue 22). A registrar may add several commands (`topic` and `produce`); all
# of them name it. tests/test_cli.py checks this help against the registered one.
_BOOKIE: Final = (
    "ops.cli.bookie:add_parser",
    "ops.cli.autorecovery:register",  # after `bookie`: adds `bookie decommission|scrub`
    "ops.cli.bookie_admin:register",  # `bookie list|info|readonly|writable`, `cookie show`
)
_TOPIC: Final = ("ops.cli.topic:register",)  # `topic ...` and `produce`
_LEDGER: Final = ("ops.cli.ledger:register",)  # `ledger ...` and `underreplicated list`
COMMANDS: Final[dict[str, tuple[str, tuple[str, ...]]]] = {
    "local": (
        "run a local cluster in the foreground until Ctrl-C, watching its processes",
        ("ops.cli.entry:register_local",),
    ),
    "demo": (
        "start a local cluster, show what it holds, stop it",
        ("ops.cli.entry:register_local",),
    ),
    "bookie": ("run a bookie (storage node) until SIGTERM", _BOOKIE),
    "autorecovery": ("run the auditor and a replication worker", _BOOKIE),
    "cookie": ("bookie cookies (identity of a bookie's disks)", _BOOKIE),
    "bench": ("benchmarks (last stdout line: one JSON object)", ("ops.bench.command:register",)),
    "writeproxy": (
        "run a write proxy (owns streams, batches writes)",
        ("writeproxy.main:add_parser",),
    ),
    "readproxy": (
        "run a read proxy (range reads, long-poll/WebSocket tails)",
        ("readproxy.main:add_parser",),
    ),
    "stream": (
        "create, list, describe, delete, write and read streams",
        ("ops.cli.stream:register",),
    ),
    "topic": ("create, list, describe, alter and delete topics", _TOPIC),
    "produce": ("send stdin lines to a topic, one record each", _TOPIC),
    "pipeline": (
        "the Spark data pipeline (PySpark data source)",
        ("ops.cli.pipeline:register",),
    ),
    "group": (
        "list, describe, reset the offsets of, delete consumer groups",
        ("ops.cli.group:register",),
    ),
    "consume": (
        "consume a topic as a member of a consumer group",
        ("ops.cli.consume:register",),
    ),
    "status": (
        "cluster health at a glance (exit 3 if something is wrong)",
        ("ops.cli.status:register",),
    ),
    "ledger": ("list, show and read ledgers (below streams)", _LEDGER),
    "underreplicated": ("ledgers autorecovery still has to repair", _LEDGER),
    "subscription": ("a stream's named read positions", ("ops.cli.subscription:register",)),
    "zk": ("look at the cluster's ZooKeeper nodes (debugging)", ("ops.cli.zk:register",)),
    "auth": ("make tokens and bookie credentials (docs/security.md)", ("ops.cli.auth:register",)),
    "chaos": (
        "Jepsen-style test: workload + faults on a fresh cluster, then check the history",
        ("ops.cli.chaos:register",),
    ),
}

# Options of the top level taking a value (to find the command word in argv).
_TOP_VALUED: Final = frozenset({"--log-format"})


def _cmd_demo(args: argparse.Namespace) -> int:
    from ops.cluster import supervisor

    return supervisor.run_demo(args)


def _cmd_local(args: argparse.Namespace) -> int:
    from ops.cluster import supervisor

    return supervisor.run_local(args)


def register_local(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """`local` and `demo`: the supervisor's cluster flags."""
    from ops.cluster.supervisor import add_cluster_flags as local_flags

    p_local = sub.add_parser("local", help=COMMANDS["local"][0])
    p_local.add_argument("--dir", required=True, help="state directory (kept across restarts)")
    local_flags(p_local)
    p_local.set_defaults(handler=_cmd_local)

    p_demo = sub.add_parser("demo", help=COMMANDS["demo"][0])
    p_demo.add_argument("--dir", required=True, help="state directory (kept across restarts)")
    p_demo.add_argument("--keep-running", action="store_true", help="stay up until Ctrl-C")
    local_flags(p_demo)
    p_demo.set_defaults(handler=_cmd_demo)


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


def command_word(argv: Sequence[str]) -> str | None:
    """The command ``argv`` names (its first word that is not a top-level option)."""
    skip = False
    for word in argv:
        if skip:
            skip = False
        elif word in _TOP_VALUED:
            skip = True
        elif not word.startswith("-"):
            return word
    return None


def _registrar(ref: str) -> Registrar:
    module, _sep, name = ref.partition(":")
    fn: Registrar = getattr(importlib.import_module(module), name)
    return fn


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The CLI's parser: every command's real parser when ``argv`` is None (docs, tests);
    otherwise only the one ``argv`` names, the others listed by name and help."""
    from ops.cli.exit import EXIT_CODES

    parser = Parser(
        prog="bookline",
        description="Bookline: a replicated log service (bookies, ledgers, streams, proxies).",
        epilog="exit status: "
        + "; ".join(f"{code} {meaning}" for code, meaning in EXIT_CODES.items()),
    )
    parser.add_argument("--version", action="version", version=f"bookline {__version__}")
    sub = cast(
        "argparse._SubParsersAction[argparse.ArgumentParser]",
        parser.add_subparsers(dest="command", metavar="COMMAND"),
    )
    wanted = None if argv is None else command_word(argv)
    done: set[str] = set()
    for name, (_help, registrars) in COMMANDS.items():
        if argv is None or name == wanted:
            for ref in registrars:
                if ref not in done:
                    done.add(ref)
                    _registrar(ref)(sub)
    for name, (help_text, _registrars) in COMMANDS.items():
        if name not in sub.choices:  # named in --help; its parser is built when it runs
            sub.add_parser(name, help=help_text, add_help=False)
    if done:
        from ops.cli.common import add_common_flags

        add_common_flags(parser)  # -v, --log-format everywhere; --timeout beside --cluster
    else:
        _top_flags(parser)
    return parser


def _top_flags(parser: argparse.ArgumentParser) -> None:
    """-v and --log-format of the top level alone (no command's parser was built)."""
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    from foundation.logs import FORMATS

    parser.add_argument(
        "--log-format",
        choices=FORMATS,
        default=None,
        help="log lines as plain text (default) or JSON (also $BOOKLINE_LOG_FORMAT)",
    )


def _tls_settings(args: argparse.Namespace) -> tls.TlsConfig:
    """[tls] of --config and BOOKLINE_TLS_*; when they leave TLS off, a --cluster file
    naming a CA (``bookline local --tls``) turns it on for this client."""
    import contextlib

    from foundation import tls
    from foundation.cluster_file import read_cluster_file
    from foundation.errors import ConfigError

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
    words = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(words)
    args = parser.parse_args(words)
    handler: Handler | None = getattr(args, "handler", None)
    if handler is None:
        parser.print_help()
        return EXIT_USAGE
    from foundation import logs, tls
    from foundation.cluster_file import read_cluster_file
    from foundation.errors import BooklineError
    from ops.cli.common import check_reachable, report_error

    logs.setup(verbose=args.verbose, fmt=args.log_format, quiet=not _runs_a_service(args))
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
        return report_error(exc, as_json=bool(getattr(args, "json", False)))
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
