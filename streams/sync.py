"""Blocking facade of the core library for threads and Spark executors.

:class:`SyncNamespace` runs a private event loop on a daemon thread and forwards every
call to the asyncio :class:`~streams.namespace.Namespace` with
``run_coroutine_threadsafe``; any number of threads may call it at once. Writers and
readers come back wrapped (:class:`SyncWriter`, :class:`SyncReader`).

Spark executors are separate processes (often forked): open the namespace inside the
executor (for instance once per partition or per worker), never pass one across a
fork -- the loop thread and the ZooKeeper session do not survive it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Coroutine, Iterator, Sequence
from pathlib import Path
from typing import Any, TypeVar

from foundation.errors import ClosedError
from foundation.loopthread import LoopThread
from metadata.streams import StreamOptions
from streams.config import NamespaceConfig
from streams.dlsn import DLSN, StartPosition
from streams.namespace import TIME_LOOKUP_TIMEOUT_S, Namespace, SegmentInfo, StreamInfo
from streams.reader import LogReader
from streams.records import LogRecord, ReadRecord
from streams.writer import LogWriter

__all__ = ["SyncNamespace", "SyncReader", "SyncWriter"]

T = TypeVar("T")
# Opening a namespace waits for ZooKeeper; past this something is wrong.
OPEN_TIMEOUT_S = 60.0


class SyncWriter:
    def __init__(self, runner: LoopThread, writer: LogWriter) -> None:
        self._run = runner
        self.writer = writer

    def write(self, record: LogRecord) -> DLSN:
        return self._run.call(self.writer.write(record))

    def write_many(self, records: Sequence[LogRecord]) -> Sequence[DLSN]:
        return self._run.call(self.writer.write_many(records))

    def write_nowait(self, record: LogRecord) -> concurrent.futures.Future[DLSN]:
        """A concurrent.futures.Future of the DLSN (order kept as in the async API)."""

        async def submit() -> asyncio.Future[DLSN]:
            return self.writer.write_nowait(record)

        inner = self._run.call(submit())
        out: concurrent.futures.Future[DLSN] = concurrent.futures.Future()

        def relay(f: asyncio.Future[DLSN]) -> None:
            if f.cancelled():
                out.cancel()
            elif (exc := f.exception()) is not None:
                out.set_exception(exc)
            else:
                out.set_result(f.result())

        self._run.loop.call_soon_threadsafe(inner.add_done_callback, relay)
        return out

    def flush(self) -> None:
        self._run.call(self.writer.flush())

    def truncate(self, dlsn: DLSN) -> bool:
        return self._run.call(self.writer.truncate(dlsn))

    def mark_end_of_stream(self) -> None:
        self._run.call(self.writer.mark_end_of_stream())

    def close(self) -> None:
        self._run.call(self.writer.close())

    @property
    def last_dlsn(self) -> DLSN | None:
        return self.writer.last_dlsn

    @property
    def last_txid(self) -> int:
        return self.writer.last_txid

    def __enter__(self) -> SyncWriter:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class SyncReader:
    def __init__(self, runner: LoopThread, reader: LogReader) -> None:
        self._run = runner
        self.reader = reader

    def read_next(self, timeout_s: float | None = None) -> ReadRecord | None:
        return self._run.call(self.reader.read_next(timeout_s))

    def read_many(self, max_records: int, timeout_s: float | None = None) -> list[ReadRecord]:
        return self._run.call(self.reader.read_many(max_records, timeout_s))

    def __iter__(self) -> Iterator[ReadRecord]:
        while True:
            rec = self.read_next()
            if rec is not None:
                yield rec

    @property
    def position(self) -> DLSN:
        return self.reader.position

    def close(self) -> None:
        self._run.call(self.reader.close())

    def __enter__(self) -> SyncReader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class SyncNamespace:
    """Every :class:`Namespace` method, blocking. Close it when done."""

    def __init__(self, runner: LoopThread, ns: Namespace) -> None:
        self._run = runner
        self.ns = ns
        self._closed = False

    @property
    def runner(self) -> LoopThread:
        """The private loop everything runs on (facades built on this namespace, such
        as ``groups.producer.SyncTopicProducer``, run there too)."""
        return self._run

    @classmethod
    def open(
        cls,
        zk: str,
        root: str = "/bookline",
        namespace: str = "default",
        config: NamespaceConfig | None = None,
        *,
        create: bool = True,
        token: str | None = None,
        zk_digest_file: str = "",
    ) -> SyncNamespace:
        runner = LoopThread("bookline-sync")
        try:
            opening = Namespace.open(
                zk, root, namespace, config, create=create, token=token,
                zk_digest_file=zk_digest_file,
            )  # fmt: skip
            ns = runner.call(
                opening,
                OPEN_TIMEOUT_S,
            )
        except BaseException:
            runner.stop()
            raise
        return cls(runner, ns)

    @classmethod
    def from_cluster_file(
        cls,
        path: str | Path,
        namespace: str = "default",
        config: NamespaceConfig | None = None,
        *,
        create: bool = True,
        token: str | None = None,
    ) -> SyncNamespace:
        runner = LoopThread("bookline-sync")
        try:
            ns = runner.call(
                Namespace.from_cluster_file(path, namespace, config, create=create, token=token),
                OPEN_TIMEOUT_S,
            )
        except BaseException:
            runner.stop()
            raise
        return cls(runner, ns)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._run.call(self.ns.close())
        finally:
            self._run.stop()

    def __enter__(self) -> SyncNamespace:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        if self._closed:
            coro.close()
            raise ClosedError("SyncNamespace was closed")
        return self._run.call(coro)

    # -- the Namespace API -----------------------------------------------------------

    def create_stream(self, name: str, options: StreamOptions | None = None) -> None:
        self._call(self.ns.create_stream(name, options))

    def list_streams(self) -> list[str]:
        return self._call(self.ns.list_streams())

    def exists(self, name: str) -> bool:
        return self._call(self.ns.exists(name))

    def delete_stream(self, name: str) -> None:
        self._call(self.ns.delete_stream(name))

    def stream_info(self, name: str) -> StreamInfo:
        return self._call(self.ns.stream_info(name))

    def segments(self, name: str) -> list[SegmentInfo]:
        return self._call(self.ns.segments(name))

    def open_writer(
        self, name: str, identity: str | None = None, *, lock_timeout_s: float | None = None
    ) -> SyncWriter:
        writer = self._call(self.ns.open_writer(name, identity, lock_timeout_s=lock_timeout_s))
        return SyncWriter(self._run, writer)

    def open_reader(
        self,
        name: str,
        start: StartPosition | DLSN | str | None = None,
        *,
        skip_truncated: bool = False,
    ) -> SyncReader:
        reader = self._call(self.ns.open_reader(name, start, skip_truncated=skip_truncated))
        return SyncReader(self._run, reader)

    def resolve(
        self, name: str, start: StartPosition | DLSN | str, *, skip_truncated: bool = False
    ) -> DLSN:
        return self._call(self.ns.resolve(name, start, skip_truncated=skip_truncated))

    def record_at_time(
        self, name: str, ms: int, timeout_s: float = TIME_LOOKUP_TIMEOUT_S
    ) -> ReadRecord | None:
        return self._call(self.ns.record_at_time(name, ms, timeout_s))

    def read_entries(
        self, name: str, segment_seqno: int, first_entry_id: int, last_entry_id: int
    ) -> list[ReadRecord]:
        return self._call(self.ns.read_entries(name, segment_seqno, first_entry_id, last_entry_id))

    def apply_retention(self, name: str) -> bool:
        return self._call(self.ns.apply_retention(name))

    def commit(self, name: str, subscriber: str, dlsn: DLSN) -> bool:
        return self._call(self.ns.commit(name, subscriber, dlsn))

    def committed(self, name: str, subscriber: str) -> DLSN | None:
        return self._call(self.ns.committed(name, subscriber))

    def list_subscribers(self, name: str) -> list[str]:
        return self._call(self.ns.list_subscribers(name))
