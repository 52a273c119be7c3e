"""``bookline writeproxy --config FILE``: run one write proxy until SIGTERM.

Settings: the ``[writeproxy]`` section of the file, ``BOOKLINE_WRITEPROXY_*``, then
flags (one per setting, e.g. ``--port 8480 --proxy-id wp-2``). Prints
``writeproxy ready id=... url=...`` once it serves and is registered in ZooKeeper.
"""

from __future__ import annotations

import argparse

from foundation.service import Service, add_proxy_command
from writeproxy.config import WriteProxyConfig


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    add_proxy_command(
        sub, WriteProxyConfig, "run a write proxy (owns streams, batches writes)", _write_proxy
    )


def _write_proxy(config: WriteProxyConfig) -> Service:
    from writeproxy.app import WriteProxy  # loaded only when the command runs

    return WriteProxy(config)
