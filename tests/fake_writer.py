"""What the write core's fake stream writers share: ``LogWriter.append_many_offsets``
for a fake whose ``write_many_offsets`` does the work (its records are appended when
the task starts, as the real writer appends them before its first suspension)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from streams.dlsn import DLSN
from streams.records import LogRecord


class AppendsOnTaskStart:
    async def write_many_offsets(
        self, records: Sequence[LogRecord]
    ) -> tuple[Sequence[DLSN], list[int]]:
        raise NotImplementedError

    async def append_many_offsets(
        self, records: Sequence[LogRecord]
    ) -> asyncio.Future[tuple[Sequence[DLSN], list[int]]]:
        return asyncio.ensure_future(self.write_many_offsets(records))
