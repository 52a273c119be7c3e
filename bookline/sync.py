"""The core library's blocking facade (defined in :mod:`streams.sync`)."""

from streams.sync import SyncNamespace, SyncReader, SyncWriter

__all__ = ["SyncNamespace", "SyncReader", "SyncWriter"]
