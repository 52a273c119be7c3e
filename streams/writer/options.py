"""A writer's stream options, kept current while it writes.

A stream's options (a topic's configs made into them, :mod:`metadata.topic_configs`)
change while a writer holds the stream: ``topic alter --config max.message.bytes=...``
must reach the partition's writer wherever it runs (a write proxy, a core producer),
not only its next owner. The writer watches its stream's record (one re-arming
ZooKeeper watch, :meth:`metadata.zk.ZkClient.watch_data`) and is handed every new
options: the record limit and retention at once, roll settings and quorums from the
next segment on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from foundation.errors import BooklineError
from metadata.streams import StreamOptions, StreamRecord
from metadata.zk_watch import Watch
from streams.context import CoreContext

log = logging.getLogger(__name__)

__all__ = ["watch_options"]


async def watch_options(
    ctx: CoreContext, stream: str, apply: Callable[[StreamOptions], None]
) -> Watch[tuple[bytes, int] | None]:
    """Watch ``stream``'s record; ``apply`` gets its options now and on every change
    (in the loop). A deleted record changes nothing: the writer's lock goes with it.
    The caller cancels the watch when the writer closes."""
    path = ctx.md.layout.stream(ctx.namespace, stream)

    def on_change(snapshot: tuple[bytes, int] | None) -> None:
        if snapshot is None:
            return
        try:
            record = StreamRecord.decode(snapshot[0], path)
        except BooklineError as exc:  # a format or option this writer can't read: keep its own
            log.warning("stream %s: options not applied: %s", stream, exc)
            return
        apply(record.options)

    return await ctx.md.zk.watch_data(path, on_change)
