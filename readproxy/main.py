"""``bookline readproxy --config FILE``: run one read proxy until SIGTERM.

Settings: the ``[readproxy]`` section of the file, ``BOOKLINE_READPROXY_*``, then
flags (one per setting). Prints ``readproxy ready id=... url=...`` once serving.
"""

from __future__ import annotations

import argparse

from foundation.service import Service, add_proxy_command
from readproxy.config import ReadProxyConfig


def add_parser(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    add_proxy_command(
        sub,
        ReadProxyConfig,
        "run a read proxy (range reads, long-poll/WebSocket tails)",
        _read_proxy,
    )


def _read_proxy(config: ReadProxyConfig) -> Service:
    from readproxy.app import ReadProxy  # loaded only when the command runs

    return ReadProxy(config)
