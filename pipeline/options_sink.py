"""The write options of the ``bookline`` data source (:mod:`pipeline.sink`), validated
as strictly as the read options (:mod:`pipeline.options_common`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from foundation.errors import BadRequestError
from pipeline.options_common import (
    CONNECTION_OPTIONS,
    ConnectionOptions,
    bool_option,
    check_known,
    int_option,
    lowered,
    parse_connection,
)

LOCK_WAIT_MS_DEFAULT = 120_000
# Bytes of rows a sink task buffers before it writes its largest stream early (rows are
# otherwise written at the end of the task, so tasks start on different streams).
BUFFER_BYTES_MAX_DEFAULT = 64 << 20
# A task with at most this many bytes of rows hands them to the driver's commit, which
# writes every such task's rows with one writer per stream: small tasks do not each
# start a segment. Bounds what a task sends to the driver (x tasks per batch).
DRIVER_WRITE_BYTES_MAX_DEFAULT = 256 << 10
SINK_OPTIONS = (*CONNECTION_OPTIONS, "stream", "topic", "createStreams", "idempotent", "lockWaitMs",
         "writeId", "batchId", "bufferBytesMax", "driverWriteBytesMax")  # fmt: skip


# -- sink ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SinkOptions:
    """Every write option, validated."""

    connection: ConnectionOptions
    # Default target stream / topic when the row has no stream / topic column (or null).
    stream: str | None = None
    topic: str | None = None
    # Create a target stream that does not exist yet.
    create_streams: bool = True
    # Exactly once per batch id (see pipeline.sink); false: plain appends.
    idempotent: bool = True
    # How long a task waits for a stream's single-writer lock held by another task.
    lock_wait_ms: int = LOCK_WAIT_MS_DEFAULT
    # Batch writes from foreachBatch: a stable writer id and the micro-batch id make a
    # replayed micro-batch a no-op (default: a fresh id per write, batch 0).
    write_id: str | None = None
    batch_id: int | None = None
    # Bytes of rows a task buffers (executor memory) before writing its largest stream.
    buffer_bytes_max: int = BUFFER_BYTES_MAX_DEFAULT
    # Rows of a task up to this many bytes are written by the driver's commit (0: never).
    driver_write_bytes_max: int = DRIVER_WRITE_BYTES_MAX_DEFAULT

    def __post_init__(self) -> None:
        if self.driver_write_bytes_max < 0:
            raise BadRequestError(
                f"driverWriteBytesMax must be >= 0, got {self.driver_write_bytes_max}"
            )
        if self.buffer_bytes_max < 1:
            raise BadRequestError(f"bufferBytesMax must be >= 1, got {self.buffer_bytes_max}")
        if self.stream is not None and self.topic is not None:
            raise BadRequestError("give at most one of the options 'stream' and 'topic'")
        if self.lock_wait_ms < 0:
            raise BadRequestError(f"lockWaitMs must be >= 0, got {self.lock_wait_ms}")
        if (self.write_id is None) != (self.batch_id is None):
            raise BadRequestError("give both options 'writeId' and 'batchId', or neither")
        if self.write_id is not None and (":" in self.write_id or not self.write_id):
            raise BadRequestError(f"writeId must be non-empty without ':', got {self.write_id!r}")
        if self.batch_id is not None and self.batch_id < 0:
            raise BadRequestError(f"batchId must be >= 0, got {self.batch_id}")


def parse_sink_options(options: Mapping[str, str]) -> SinkOptions:
    check_known(options, SINK_OPTIONS, "write")
    opts = lowered(options)
    lock_wait = int_option(opts, "lockWaitMs")
    driver_bytes = int_option(opts, "driverWriteBytesMax")
    return SinkOptions(
        connection=parse_connection(options),
        stream=opts.get("stream"),
        topic=opts.get("topic"),
        create_streams=bool_option(opts, "createStreams", True),
        idempotent=bool_option(opts, "idempotent", True),
        lock_wait_ms=LOCK_WAIT_MS_DEFAULT if lock_wait is None else lock_wait,
        write_id=opts.get("writeid"),
        batch_id=int_option(opts, "batchId"),
        buffer_bytes_max=int_option(opts, "bufferBytesMax") or BUFFER_BYTES_MAX_DEFAULT,
        driver_write_bytes_max=DRIVER_WRITE_BYTES_MAX_DEFAULT
        if driver_bytes is None
        else driver_bytes,
    )
