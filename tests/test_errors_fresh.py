"""Copying an error for another raise keeps every field (issue 23: of the four copies,
the record buffer's and the reader's dropped ``owner``, so a writer's waiter or a
reader told LOCK_OWNED / OWNER_MOVED lost who the owner is)."""

from __future__ import annotations

import asyncio

import pytest

from foundation.errors import (
    BooklineError,
    LockOwnedError,
    OwnerMovedError,
    TimeoutError_,
    UnknownError,
    fresh,
)
from streams.writer.buffer import RecordBuffer

_SAMPLES: list[BooklineError] = [
    LockOwnedError("stream s is locked", owner="proxy-2"),
    OwnerMovedError("moved", owner="http://127.0.0.1:9000"),
    UnknownError("from a newer peer", original_code=9999),
    TimeoutError_("slow"),
]


def _fields(exc: BaseException) -> dict[str, object]:
    return {k: v for k, v in vars(exc).items() if not k.startswith("__")}


@pytest.mark.parametrize("original", _SAMPLES, ids=lambda e: type(e).__name__)
def test_a_fresh_copy_keeps_every_field_and_chains(original: BooklineError) -> None:
    copy = fresh(original)
    assert type(copy) is type(original) and copy is not original
    assert _fields(copy) == _fields(original)
    assert (str(copy), copy.to_dict(), copy.__cause__) == (
        str(original),
        original.to_dict(),
        original,
    )


def test_a_fresh_copy_with_a_new_message_keeps_the_other_fields() -> None:
    copy = fresh(LockOwnedError("locked", owner="proxy-2"), "s: all replicas failed")
    assert isinstance(copy, LockOwnedError)
    assert (copy.message, copy.owner) == ("s: all replicas failed", "proxy-2")


async def test_a_failed_buffer_gives_its_waiters_the_owner() -> None:
    loop = asyncio.get_running_loop()
    buf = RecordBuffer(loop.create_future())
    buf.fail(LockOwnedError("stream s is locked", owner="proxy-2"))
    exc = buf.done.exception()
    assert isinstance(exc, LockOwnedError) and exc.owner == "proxy-2"
