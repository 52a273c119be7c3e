"""What every ``bookline`` client command shares: where the cluster is, how long to wait
for it, how answers are shown, and what an error means for the exit status.

* :func:`add_common_flags` -- ``-v`` and ``--log-format`` on every (sub-)command, and
  ``--timeout`` on every command that talks to a cluster (those with ``--cluster``);
* :func:`check_reachable` -- before a client command runs, something of the cluster
  must answer within ``--timeout`` (a TCP connect to a ZooKeeper server and to a
  proxy): a stale ``cluster.json`` fails in a moment with a hint instead of retrying
  for the client's 30 s deadline;
* :func:`open_metadata` -- a ZooKeeper session for the admin commands, its connect
  bounded by ``--timeout``;
* :func:`table` / :func:`emit` -- rich tables on a terminal, or one JSON object;
* :data:`EXIT_CODES` / :func:`exit_code` / :func:`hint` -- the exit status of each
  error class (documented in the README) and a hint of what to do next.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import urlsplit

from foundation.auth import TOKEN_ENV
from foundation.cluster_file import ClusterFile, read_cluster_file
from foundation.errors import (
    BooklineError,
    ConfigError,
    ConnectionLostError,
    ForbiddenError,
    MetadataError,
    NoLedgerError,
    NotEnoughBookiesError,
    NotFoundError,
    ReadOnlyError,
    TimeoutError_,
    TooManyRequestsError,
    UnauthenticatedError,
    UnavailableError,
)
from foundation.logs import FORMATS
from ops.cli.exit import (  # exit statuses (README, "Exit status")
    EXIT_CODES,
    EXIT_CONFIG,
    EXIT_ERROR,
    EXIT_FOUND,
    EXIT_INTERRUPTED,
    EXIT_OK,
    EXIT_UNKNOWN_OUTCOME,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
)
from ops.cluster.client_env import ENV_CLUSTER

if TYPE_CHECKING:
    from metadata.client import MetadataClient

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "ENV_CLUSTER",
    "EXIT_CODES",
    "EXIT_CONFIG",
    "EXIT_ERROR",
    "EXIT_FOUND",
    "EXIT_INTERRUPTED",
    "EXIT_OK",
    "EXIT_UNKNOWN_OUTCOME",
    "EXIT_UNREACHABLE",
    "EXIT_USAGE",
    "add_cluster_flags",
    "add_common_flags",
    "check_reachable",
    "emit",
    "error_text",
    "exit_code",
    "hint",
    "open_metadata",
    "outcome_unknown",
    "report_error",
    "require_cluster",
    "sub_ops",
    "table",
    "write_status",
]

# How long a client command waits for the cluster's first answer. A running local
# cluster answers in milliseconds; a few seconds rides out a busy machine, and a dead
# one is reported long before the client's own 30 s retry deadline.
DEFAULT_TIMEOUT_S: Final = 5.0
START_HINT: Final = "is the cluster running? start one with `bookline local --dir DIR`"

_UNREACHABLE: Final = (ConnectionLostError, TimeoutError_, UnavailableError, MetadataError)


def exit_code(exc: BooklineError) -> int:
    if isinstance(exc, _UNREACHABLE):
        return EXIT_UNREACHABLE
    if isinstance(exc, ConfigError):
        return EXIT_CONFIG
    return EXIT_ERROR


# What lists the kind of thing a NOT_FOUND message names (the messages are ours: "no
# bookie 'b-9'", "no znode /x", "no subscriber s of stream t"); the first match wins.
_NOT_FOUND_HINTS: Final = (
    ("bookie", "`bookline bookie list` shows the bookies"),
    ("znode", "`bookline zk tree` shows the znodes under the cluster root"),
    ("subscriber", "`bookline subscription list STREAM` shows a stream's subscribers"),
    ("ledger", "`bookline ledger list` shows the ledgers that exist"),
)


def outcome_unknown(exc: BaseException) -> bool:
    """A write that ended in ``exc`` may be stored all the same: the client retries a
    retriable error (NOT_ENOUGH_BOOKIES, TIMEOUT, CONNECTION_LOST, OUTCOME_UNKNOWN...)
    until its deadline, and an earlier attempt may have been written and its answer
    lost. Only a refusal (BAD_REQUEST, TOO_LARGE, FORBIDDEN...) is a definite failure."""
    return isinstance(exc, BooklineError) and exc.retriable


def error_text(exc: BaseException) -> str:
    """As the CLI prints every error: name, stable code, message."""
    if isinstance(exc, BooklineError):
        return f"{exc.name} ({exc.code}): {exc.message}"
    return repr(exc)


def write_status(failed: int, unknown: int) -> int:
    """The exit status of a batch of writes: 1 if one was refused (a definite failure),
    else 6 if one's outcome is unknown, else 0 (README, "Exit status")."""
    if failed:
        return EXIT_ERROR
    return EXIT_UNKNOWN_OUTCOME if unknown else EXIT_OK


def report_error(exc: BooklineError, *, as_json: bool) -> int:
    """Print ``exc`` (and a hint) on stderr -- ``bookline: error NAME (code): message``,
    or under ``--json`` one object ``{"error": {"code", "name", "message", "hint"}}`` --
    and return its exit status."""
    advice = hint(exc)
    if as_json:
        body: dict[str, Any] = {"code": exc.code, "name": exc.name, "message": exc.message}
        if advice:
            body["hint"] = advice
        print(json.dumps({"error": body}, sort_keys=True), file=sys.stderr)
    else:
        print(f"bookline: error {exc.name} ({exc.code}): {exc.message}", file=sys.stderr)
        if advice:
            print(f"bookline: hint: {advice}", file=sys.stderr)
    return exit_code(exc)


def hint(exc: BooklineError) -> str:
    """What to try next, or "" when the message says it all."""
    if isinstance(exc, _UNREACHABLE):
        return f"{START_HINT}; `bookline status` shows what is up; `--timeout S` waits longer"
    if isinstance(exc, NotEnoughBookiesError):
        return "fewer writable bookies than the ensemble needs: see `bookline bookie list`"
    if isinstance(exc, ReadOnlyError):
        return "the bookie is read-only (disk full or set by an operator): `bookline bookie list`"
    if isinstance(exc, TooManyRequestsError):
        return "the cluster is shedding load; retry later or slow down"
    if isinstance(exc, NoLedgerError):
        return "`bookline ledger list` shows the ledgers that exist"
    if isinstance(exc, UnauthenticatedError):
        return f"give a valid token: --token TOKEN or ${TOKEN_ENV} (docs/security.md)"
    if isinstance(exc, ForbiddenError):
        return "the token's principal has no grant for this (docs/security.md, Grants)"
    if isinstance(exc, NotFoundError):
        for word, advice in _NOT_FOUND_HINTS:
            if word in exc.message:
                return advice
        return "list what exists with `bookline stream list`, `topic list` or `group list`"
    return ""


# -- flags ---------------------------------------------------------------------------------


def add_cluster_flags(
    p: argparse.ArgumentParser, *, json_flag: bool = True, token: bool = True
) -> None:
    """``--cluster`` (default ``$BOOKLINE_CLUSTER``) and ``--json``; ``--timeout`` and
    ``--token`` come with :func:`add_common_flags`. ``token=False``: the command talks to
    ZooKeeper alone, so ``--token`` would be silently ignored; it is a usage error."""
    p.add_argument(
        "--cluster",
        default=os.environ.get(ENV_CLUSTER),
        help=f"cluster.json of a running cluster (default ${ENV_CLUSTER})",
    )
    if json_flag:
        p.add_argument("--json", action="store_true", help="print JSON instead of tables")
    if not token:
        p.set_defaults(**{_ZK_ONLY: True})


# Set (as a parser default) on the commands that read or write ZooKeeper alone.
_ZK_ONLY: Final = "zk_only_command"
TOKEN_NOT_FOR_ZK: Final = (
    "this command talks to ZooKeeper directly, which takes no token (ZooKeeper's own "
    "ACLs guard it: $BOOKLINE_METADATA_DIGEST_FILE); the token is for the proxies and bookies"
)


def _has_option(p: argparse.ArgumentParser, option: str) -> bool:
    return any(option in a.option_strings for a in p._actions)


def _children(p: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    out: list[argparse.ArgumentParser] = []
    for action in p._actions:
        if isinstance(action, argparse._SubParsersAction):
            out.extend(dict.fromkeys(action.choices.values()))  # aliases appear twice
    return out


def sub_ops(parser: argparse.ArgumentParser, dest: str) -> argparse._SubParsersAction[Any]:
    """The parser's sub-command table (created on first use): several modules hang
    operations off one command (``bookie decommission`` here, ``bookie list`` there)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action
    return parser.add_subparsers(dest=dest, metavar="OP")


def add_common_flags(parser: argparse.ArgumentParser, *, top: bool = True) -> None:
    """``-v``/``--log-format`` on ``parser`` and every sub-command below it, so they work
    before or after the sub-command; ``--timeout`` where a command takes ``--cluster``.
    Below the top the defaults are SUPPRESS: a sub-command that was not given the flag
    leaves what the top level parsed alone."""
    default_v: Any = False if top else argparse.SUPPRESS
    default_fmt: Any = None if top else argparse.SUPPRESS
    if not _has_option(parser, "-v"):
        parser.add_argument(
            "-v", "--verbose", action="store_true", default=default_v, help="debug logging"
        )
    if not _has_option(parser, "--log-format"):
        parser.add_argument(
            "--log-format",
            choices=FORMATS,
            default=default_fmt,
            help="log lines as plain text (default) or JSON (also $BOOKLINE_LOG_FORMAT)",
        )
    if _has_option(parser, "--cluster") and not _has_option(parser, "--token"):
        parser.add_argument(
            "--token",
            action=_TokenAction,
            default=argparse.SUPPRESS,
            metavar="TOKEN",
            help=f"the proxies' bearer token (default ${TOKEN_ENV}, else the token file "
            "cluster.json names; docs/security.md)",
        )
    if _has_option(parser, "--cluster") and not _has_option(parser, "--timeout"):
        parser.add_argument(
            "--timeout",
            type=float,
            default=DEFAULT_TIMEOUT_S,
            metavar="S",
            help=f"seconds to wait for the cluster's first answer (default {DEFAULT_TIMEOUT_S:g})",
        )
    for child in _children(parser):
        add_common_flags(child, top=False)


class _TokenAction(argparse.Action):
    """``--token T`` puts T in ``$BOOKLINE_TOKEN`` for this command: every client it
    makes (ProxyClient, consumers) takes the token from there before the cluster's."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        if not isinstance(values, str) or not values.strip():
            parser.error("--token needs a token")
        if getattr(namespace, _ZK_ONLY, False):  # the sub-command's defaults are set first
            parser.error(f"--token: {TOKEN_NOT_FOR_ZK}")
        os.environ[TOKEN_ENV] = values.strip()


def require_cluster(args: argparse.Namespace) -> ClusterFile:
    if not getattr(args, "cluster", None):
        raise ConfigError(
            f"say where the cluster is: --cluster DIR/cluster.json or ${ENV_CLUSTER} ({START_HINT})"
        )
    return read_cluster_file(args.cluster)


# -- reachability --------------------------------------------------------------------------


def _zk_hosts(connect: str) -> list[tuple[str, int]]:
    hosts = connect.split("/", 1)[0]
    out = []
    for item in hosts.split(","):
        host, _sep, port = item.strip().rpartition(":")
        with contextlib.suppress(ValueError):
            out.append((host or "127.0.0.1", int(port)))
    return out


def _url_host(url: str) -> tuple[str, int] | None:
    parts = urlsplit(url)
    if parts.hostname is None:
        return None
    return parts.hostname, parts.port or (443 if parts.scheme == "https" else 80)


def _any_answers(addresses: Sequence[tuple[str, int]], deadline: float) -> bool:
    """True once one of ``addresses`` accepts a TCP connection before ``deadline``."""
    while True:
        for host, port in addresses:
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            try:
                with socket.create_connection((host, port), timeout=min(left, 1.0)):
                    return True
            except OSError:
                continue
        if time.monotonic() + 0.2 >= deadline:
            return False
        time.sleep(0.2)  # refused at once: look again until the deadline


def check_reachable(cluster: ClusterFile, timeout_s: float) -> None:
    """Raise ConnectionLostError (with what was tried) unless a ZooKeeper server and, when
    the file lists proxies, a proxy accept a connection within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    zk = _zk_hosts(cluster.zk)
    if zk and not _any_answers(zk, deadline):
        raise ConnectionLostError(
            f"ZooKeeper at {cluster.zk} (from {cluster.path}) did not answer within {timeout_s:g} s"
        )
    proxies = [a for a in map(_url_host, cluster.write_urls + cluster.read_urls) if a]
    if proxies and not _any_answers(proxies, deadline):
        urls = ", ".join(cluster.write_urls + cluster.read_urls)
        raise ConnectionLostError(
            f"no proxy listed in {cluster.path} ({urls}) answered within {timeout_s:g} s"
        )


@contextlib.asynccontextmanager
async def open_metadata(
    args: argparse.Namespace, *, previous_digest_file: str | None = None
) -> AsyncIterator[MetadataClient]:
    """A metadata client on the cluster ``--zk``/``--root`` or ``--cluster`` names;
    connecting waits at most ``--timeout``. NotFoundError when no cluster was ever
    initialised at that root (a mistyped root must not create one).
    ``previous_digest_file``: also authenticate as that user (a password rotation)."""
    from foundation.config import MetadataConfig
    from metadata.client import MetadataClient

    digest = ""  # --zk: $BOOKLINE_METADATA_DIGEST_FILE's, if any (metadata/client.py)
    if getattr(args, "zk", None):  # --zk/--root, as the server commands take
        zk, root = args.zk, getattr(args, "root", None) or "/bookline"
    else:
        cluster = require_cluster(args)
        zk, root, digest = cluster.zk, cluster.root, cluster.zk_digest_file or ""
    timeout_ms = max(1, int((getattr(args, "timeout", None) or DEFAULT_TIMEOUT_S) * 1000))
    config = MetadataConfig(zk=zk, root=root, connect_timeout_ms=timeout_ms, digest_file=digest)
    md = MetadataClient(config)
    await md.connect()
    try:
        if previous_digest_file:
            await md.zk.add_digest(previous_digest_file)
        await md.cluster.read()
        yield md
    finally:
        await md.close()


# -- output --------------------------------------------------------------------------------


def table(title: str, columns: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """A rich table on stdout (plain aligned columns when rich is missing)."""
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:  # pragma: no cover - rich is a dependency
        cells = [list(columns), *([str(v) for v in row] for row in rows)]
        widths = [max(len(r[i]) for r in cells) for i in range(len(columns))]
        if title:
            print(title)
        for r in cells:
            print("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip())
        return
    t = Table(title=title or None, title_justify="left")
    for col in columns:
        t.add_column(col, overflow="fold")
    for row in rows:
        t.add_row(*(str(v) for v in row))
    Console(width=None if sys.stdout.isatty() else 200).print(t)


def emit(obj: Any, as_json: bool, show: Callable[[Any], None]) -> None:
    """``obj`` as one JSON line, or shown by ``show`` for people."""
    if as_json:
        print(json.dumps(obj, sort_keys=True, default=str))
    else:
        show(obj)


def stop_on_signals(stop: asyncio.Event) -> list[signal.Signals]:
    """From now on SIGINT and SIGTERM set ``stop`` (a command that waits for records
    ends its loop, closes what it opened and exits: 130 after SIGINT, README's table);
    returns the list of the signals received. An explicit flag rather than Python's
    KeyboardInterrupt, which asyncio turns into a cancellation of the command's task:
    the command then ends only if every layer under it lets that cancellation through
    (`stream read --follow` once went on following after Ctrl-C under load)."""
    received: list[signal.Signals] = []

    def on_signal(sig: signal.Signals) -> None:
        received.append(sig)
        stop.set()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal, sig)
    return received
