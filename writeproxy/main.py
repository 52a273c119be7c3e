"""``bookline writeproxy --config FILE``: run one write proxy until SIGTERM.

Settings: the ``[writeproxy]`` section of the file, ``BOOKLINE_WRITEPROXY_*``, then
flags (one per setting, e.g. ``--port 8480 --proxy-id wp-2``). Prints
``writeproxy ready id=... url=...`` once it serves and is registered in ZooKeeper.
"""

from __future__ import annotations

import argparse

from bookline.service import add_config_flags, load_from_args, run_service
from writeproxy.config import WriteProxyConfig

SECTION = "writeproxy"


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(SECTION, help="run a write proxy (owns streams, batches writes)")
    add_config_flags(p, WriteProxyConfig, SECTION)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from writeproxy.app import WriteProxy

    config = load_from_args(args, WriteProxyConfig, SECTION)
    return run_service(lambda: WriteProxy(config), SECTION, config.proxy_id)
