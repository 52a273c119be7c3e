"""The ledger a writer creates in advance for its next segment (the "spare"): when
creating it fails and the writer ends without awaiting it, the failure is logged by the
writer, never left to asyncio's "Task exception was never retrieved" at garbage
collection. (Found in a test run beside a CPU hog: that report, formatted by a garbage
collection inside an unrelated ``ast.parse``, broke the parse with CPython 3.11's
"AST constructor recursion depth mismatch".)"""

from __future__ import annotations

import asyncio
import gc
import logging
from types import SimpleNamespace
from typing import Any, cast

import pytest

from foundation.errors import ClosedError
from metadata.segments import SegmentMetadata
from metadata.streams import StreamOptions
from streams.writer.segments import Segments


def _segments(fail: BaseException) -> Segments:
    async def create_ledger(**_kw: Any) -> Any:
        raise fail

    async def open_ledger(*_a: Any, **_kw: Any) -> Any:
        raise fail

    async def segments(_stream: str) -> list[tuple[SegmentMetadata, int]]:
        return [(SegmentMetadata(seqno=1, ledger_id=7), 0)]  # the last writer's, unsealed

    config = SimpleNamespace(
        segment_rollover_bytes=1 << 20,
        segment_rollover_ms=60_000,
        ensemble_size=3,
        write_quorum=3,
        ack_quorum=2,
        ledger_digest="crc32c",
        password_bytes=b"",
    )

    async def get_max_txid(_ns: str, _stream: str) -> tuple[int, int]:
        return -1, 0

    ctx = SimpleNamespace(
        config=config,
        namespace="ns",
        segments=segments,
        ledgers=SimpleNamespace(create_ledger=create_ledger, open_ledger=open_ledger),
        md=SimpleNamespace(streams=SimpleNamespace(get_max_txid=get_max_txid)),
    )
    lock = SimpleNamespace(node=None, identity="test")
    return Segments(cast(Any, ctx), "s", cast(Any, lock), StreamOptions(), lambda: None)


async def test_a_spare_ledger_that_failed_is_reported_by_the_writer_not_at_collection(
    caplog: pytest.LogCaptureFixture,
) -> None:
    loop = asyncio.get_running_loop()
    unhandled: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: unhandled.append(context))
    try:
        with caplog.at_level(logging.INFO, logger="streams.writer.segments"):
            segs = _segments(ClosedError("the ZooKeeper client was closed"))
            # Opening recovers the previous segment, which fails: the spare, started
            # first, is left behind (a writer whose client closed ends like this).
            with pytest.raises(ClosedError):
                await segs.open()
            spare = segs._next_ledger
            assert spare is not None
            await asyncio.wait([spare])
            del spare, segs
            gc.collect()
        assert unhandled == [], [c.get("message") for c in unhandled]
        assert "ledger created in advance for s failed" in caplog.text
        assert "the ZooKeeper client was closed" in caplog.text
    finally:
        loop.set_exception_handler(previous)


async def test_an_awaited_spare_still_raises_its_failure() -> None:
    """The log is an addition: whoever opens a segment on the spare gets its error."""
    segs = _segments(ClosedError("the ZooKeeper client was closed"))
    segs._ctx = cast(Any, SimpleNamespace(**{**vars(segs._ctx), "segments": _no_segments}))
    with pytest.raises(ClosedError, match="client was closed"):
        await segs.open()


async def _no_segments(_stream: str) -> list[tuple[SegmentMetadata, int]]:
    return []
