"""``bookline bookie``: run one bookie until SIGTERM.

Every :class:`~bookie.config.BookieConfig` field ``foo_bar`` is a flag ``--foo-bar``
(generated like the proxies' flags, :func:`foundation.service.add_config_flags`); a flag
overrides the ``[bookie]`` section of ``--config`` and ``BOOKLINE_BOOKIE_*``. The
bookie's runtime (server, storage engine, ZooKeeper client) is imported only when the
command runs, so building the CLI's parser stays cheap.
"""

from __future__ import annotations

import argparse

from bookie.config import BookieConfig
from foundation.logs import set_identity
from foundation.service import add_config_flags, load_from_args

SECTION = "bookie"


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``bookline bookie`` on the CLI's sub-command parser."""
    p = sub.add_parser(SECTION, help="run a bookie (storage node) until SIGTERM")
    add_config_flags(p, BookieConfig, SECTION)
    p.add_argument(
        "--no-journal-sync",
        dest="cfg_journal_sync",
        action="store_const",
        const="false",
        help="skip fsync (benchmarks and tests only; loses acknowledged writes on a crash)",
    )
    p.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from bookie.main import run  # the bookie's runtime, only when it runs

    def load() -> BookieConfig:
        return load_from_args(args, BookieConfig, SECTION)

    config = load()
    set_identity(SECTION, config.bookie_id or f"{config.host}:{config.port}")
    return run(config, load)
