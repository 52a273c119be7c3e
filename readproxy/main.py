"""``bookline readproxy --config FILE``: run one read proxy until SIGTERM.

Settings: the ``[readproxy]`` section of the file, ``BOOKLINE_READPROXY_*``, then
flags (one per setting). Prints ``readproxy ready id=... url=...`` once serving.
"""

from __future__ import annotations

import argparse

from bookline.service import add_config_flags, load_from_args, run_service
from readproxy.config import ReadProxyConfig

SECTION = "readproxy"


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(SECTION, help="run a read proxy (range reads, long-poll/WebSocket tails)")
    add_config_flags(p, ReadProxyConfig, SECTION)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from readproxy.app import ReadProxy

    config = load_from_args(args, ReadProxyConfig, SECTION)
    return run_service(lambda: ReadProxy(config), SECTION, config.proxy_id)
