"""Bookline: the public Python package.

Holds the leaf modules every layer shares (:mod:`bookline.errors`,
:mod:`bookline.config`, :mod:`bookline.names`, :mod:`bookline.invariants`), the core
library (``Namespace``, ``LogWriter``, ``LogReader``, ``DLSN``; see docs/core-api.md)
and, as it lands, the thin client (``ProxyClient``). The public names are imported
lazily (module ``__getattr__``) so that lower layers (bookie, ledger, metadata) can
import the shared leaves without pulling in the core library or causing cycles.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# public name -> module that defines it
_LAZY = {
    "DLSN": "bookline.dlsn",
    "StartPosition": "bookline.dlsn",
    "LogRecord": "bookline.records",
    "ReadRecord": "bookline.records",
    "Compression": "bookline.records",
    "NamespaceConfig": "bookline.core_config",
    "Namespace": "bookline.namespace",
    "StreamInfo": "bookline.namespace",
    "SegmentInfo": "bookline.namespace",
    "LogWriter": "bookline.writer",
    "LogReader": "bookline.reader",
    "StreamOptions": "metadata.streams",
    "ProxyClient": "bookline.client",
    "SyncProxyClient": "bookline.client",
}

__all__ = [  # noqa: RUF022 - grouped like _LAZY
    "DLSN", "StartPosition", "LogRecord", "ReadRecord", "Compression", "NamespaceConfig",
    "Namespace", "StreamInfo", "SegmentInfo", "LogWriter", "LogReader", "StreamOptions",
    "ProxyClient", "SyncProxyClient",
]  # fmt: skip

if TYPE_CHECKING:  # "X as X": explicit re-exports for mypy
    from bookline.client import ProxyClient as ProxyClient
    from bookline.client import SyncProxyClient as SyncProxyClient
    from bookline.core_config import NamespaceConfig as NamespaceConfig
    from bookline.dlsn import DLSN as DLSN
    from bookline.dlsn import StartPosition as StartPosition
    from bookline.namespace import Namespace as Namespace
    from bookline.namespace import SegmentInfo as SegmentInfo
    from bookline.namespace import StreamInfo as StreamInfo
    from bookline.reader import LogReader as LogReader
    from bookline.records import Compression as Compression
    from bookline.records import LogRecord as LogRecord
    from bookline.records import ReadRecord as ReadRecord
    from bookline.writer import LogWriter as LogWriter
    from metadata.streams import StreamOptions as StreamOptions


if set(__all__) != set(_LAZY):
    raise ImportError("bookline.__all__ and its lazy table disagree")


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'bookline' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
