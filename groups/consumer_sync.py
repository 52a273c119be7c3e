""":class:`SyncGroupConsumer`: a :class:`~groups.consumer.GroupConsumer` for threads.

The consumer runs on a private event loop thread (:class:`foundation.loopthread.
LoopThread`, as ``SyncNamespace`` and ``SyncProxyClient`` do); every call blocks. The
rebalance callbacks are plain functions and run in the thread that calls ``poll`` (or
``close``), between batches, as in Kafka -- so they may call this consumer's methods
(``commit`` in ``on_revoke``, ``seek`` in ``on_assign``).

::

    with SyncGroupConsumer.from_cluster_file("cluster.json", "billing", ["orders"]) as c:
        while True:
            for rec in c.poll(timeout_s=1.0):
                handle(rec)
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from foundation.loopthread import LoopThread
from groups.assignors import TopicPartition
from groups.consumer import ConsumerConfig, GroupConsumer
from groups.fetchers import ConsumerRecord

if TYPE_CHECKING:
    from streams.config import NamespaceConfig
    from thinclient.client import ClientConfig

__all__ = ["SyncGroupConsumer", "SyncListener"]

T = TypeVar("T")
SyncListener = Callable[[list[TopicPartition]], None]


async def _on_loop(fn: Callable[..., T], *args: Any) -> T:
    """Run ``fn`` on the loop thread (the consumer's state lives there)."""
    return fn(*args)


class SyncGroupConsumer:
    """Blocking facade; build it with :meth:`from_cluster_file`."""

    def __init__(
        self,
        loop: LoopThread,
        consumer: GroupConsumer,
        *,
        on_assign: SyncListener | None = None,
        on_revoke: SyncListener | None = None,
        on_lost: SyncListener | None = None,
    ) -> None:
        self._loop = loop
        self._c = consumer
        self.on_assign = on_assign
        self.on_revoke = on_revoke
        self.on_lost = on_lost
        self._closed = False

    @classmethod
    def from_cluster_file(
        cls,
        path: str | Path,
        group: str,
        topics: Sequence[str],
        *,
        via: str = "proxy",
        config: ConsumerConfig | None = None,
        client_config: ClientConfig | None = None,
        namespace_config: NamespaceConfig | None = None,
        on_assign: SyncListener | None = None,
        on_revoke: SyncListener | None = None,
        on_lost: SyncListener | None = None,
    ) -> SyncGroupConsumer:
        loop = LoopThread(name="bookline-consumer")
        try:
            consumer = loop.call(
                GroupConsumer.from_cluster_file(
                    path,
                    group,
                    topics,
                    via=via,
                    config=config,
                    client_config=client_config,
                    namespace_config=namespace_config,
                )
            )
        except BaseException:
            loop.stop()
            raise
        return cls(loop, consumer, on_assign=on_assign, on_revoke=on_revoke, on_lost=on_lost)

    def _do(self, fn: Callable[..., T], *args: Any) -> T:
        return self._loop.call(_on_loop(fn, *args))

    # -- poll and the callbacks --------------------------------------------------------

    def poll(self, max_records: int | None = None, timeout_s: float = 0.0) -> list[ConsumerRecord]:
        deadline = time.monotonic() + timeout_s
        while True:
            self._reconcile()
            remaining = max(0.0, deadline - time.monotonic())
            records = self._loop.call(self._c._poll(max_records, remaining, None))
            if records:
                return records
            if time.monotonic() >= deadline:
                self._reconcile()
                return records

    def _reconcile(self) -> None:
        """The rebalance steps of ``GroupConsumer._reconcile``, with the callbacks run
        in this thread."""
        c = self._c
        revoking = self._do(c._revoking)
        if revoking:
            if self.on_revoke is not None:
                self.on_revoke(revoking)
            self._loop.call(c._finish_revoke(revoking))
        lost = self._do(c._take_lost)
        if lost and self.on_lost is not None:
            self.on_lost(lost)
        assigning = self._do(c._assigning)
        if assigning:
            committed = self._loop.call(c._prepare_assign(assigning))
            if self.on_assign is not None:
                self.on_assign(assigning)
            self._loop.call(c._finish_assign(assigning, committed))

    # -- the rest, as in GroupConsumer ------------------------------------------------------

    @property
    def member_id(self) -> str | None:
        return self._c.member_id

    @property
    def generation(self) -> int:
        return self._c.generation

    def assignment(self) -> frozenset[TopicPartition]:
        return self._do(self._c.assignment)

    def position(self, tp: TopicPartition) -> int | None:
        return self._do(self._c.position, tp)

    def committed(self, tp: TopicPartition) -> int | None:
        return self._loop.call(self._c.committed(tp))

    def commit(self, offsets: Mapping[TopicPartition, int] | None = None) -> None:
        self._loop.call(self._c.commit(offsets))

    def commit_async(
        self, offsets: Mapping[TopicPartition, int] | None = None
    ) -> concurrent.futures.Future[None]:
        """A future resolving once durable (or with the commit's error)."""
        task = self._do(self._c.commit_async, offsets)
        out: concurrent.futures.Future[None] = concurrent.futures.Future()

        def done(t: Any) -> None:
            exc = t.exception()
            if exc is None:
                out.set_result(None)
            else:
                out.set_exception(exc)

        self._loop.loop.call_soon_threadsafe(task.add_done_callback, done)
        return out

    def seek(self, tp: TopicPartition, offset: int) -> None:
        self._do(self._c.seek, tp, offset)

    def seek_to_beginning(self, tps: Iterable[TopicPartition] | None = None) -> None:
        self._do(self._c.seek_to_beginning, None if tps is None else list(tps))

    def seek_to_end(self, tps: Iterable[TopicPartition] | None = None) -> None:
        self._do(self._c.seek_to_end, None if tps is None else list(tps))

    def seek_to_timestamp(
        self, timestamp_ms: int, tps: Iterable[TopicPartition] | None = None
    ) -> None:
        self._do(self._c.seek_to_timestamp, timestamp_ms, None if tps is None else list(tps))

    def pause(self, tps: Iterable[TopicPartition]) -> None:
        self._do(self._c.pause, list(tps))

    def resume(self, tps: Iterable[TopicPartition]) -> None:
        self._do(self._c.resume, list(tps))

    def paused(self) -> frozenset[TopicPartition]:
        return self._do(self._c.paused)

    def close(self) -> None:
        """``on_revoke`` for what is consumed (in this thread), then the consumer's close
        (final commit with auto-commit, leave)."""
        if self._closed:
            return
        self._closed = True
        try:
            held = sorted(self.assignment())
            if held and self.on_revoke is not None:
                self.on_revoke(held)
            self._loop.call(self._c.close())
        finally:
            self._loop.stop()

    def __enter__(self) -> SyncGroupConsumer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
