"""Bookline: the public Python package.

Holds the leaf modules every layer shares (:mod:`bookline.errors`,
:mod:`bookline.config`, :mod:`bookline.names`, :mod:`bookline.invariants`) and, as the
layers land, the core library (``Namespace``, ``LogWriter``, ``LogReader``, ``DLSN``)
and the thin client (``ProxyClient``). This ``__init__`` imports nothing heavy so that
lower layers (bookie, ledger, metadata) can import the shared leaves without cycles.
"""

from __future__ import annotations

__version__ = "0.1.0"
