"""The data source's row schema and the conversion of records into rows.

Read schema (``headers`` only with ``includeHeaders``, the default)::

    stream string, key binary, value binary, headers map<string,binary>,
    dlsn string, sequence_id bigint, txid bigint, timestamp timestamp

``dlsn`` is the core's ``"seg:entry:slot"`` text; ``timestamp`` is the writer's wall
clock (``ReadRecord.timestamp_ms``). Read tasks yield either Python tuples or Arrow
record batches; both are built here from the same records so they cannot drift. The
Arrow schema must equal what pyspark derives from the Spark schema (it checks), so the
arrow types below mirror ``to_arrow_schema(schema, timezone="UTC")``.

Write schema: ``value`` (binary or string, required), optional ``key`` (binary or
string), ``headers`` (map<string,binary|string>), ``stream`` / ``topic`` (string).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from streams.records import ReadRecord

if TYPE_CHECKING:
    import pyarrow as pa

__all__ = [
    "SINK_COLUMNS",
    "arrow_schema",
    "read_schema_ddl",
    "records_to_arrow",
    "records_to_tuples",
]

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
# Columns a DataFrame written to Bookline may have; anything else is an error.
SINK_COLUMNS = frozenset({"value", "key", "headers", "stream", "topic"})


def read_schema_ddl(include_headers: bool = True) -> str:
    headers = "headers map<string,binary>, " if include_headers else ""
    return (
        "stream string, key binary, value binary, "
        f"{headers}dlsn string, sequence_id bigint, txid bigint, timestamp timestamp"
    )


def records_to_tuples(
    records: Iterable[ReadRecord], include_headers: bool = True
) -> Iterator[tuple[Any, ...]]:
    for r in records:
        ts = _EPOCH + dt.timedelta(milliseconds=r.timestamp_ms)
        if include_headers:
            yield (r.stream, r.key, r.payload, r.headers, str(r.dlsn), r.sequence_id, r.txid, ts)
        else:
            yield (r.stream, r.key, r.payload, str(r.dlsn), r.sequence_id, r.txid, ts)


def arrow_schema(include_headers: bool = True) -> pa.Schema:
    import pyarrow as pa

    fields = [
        pa.field("stream", pa.string()),
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
    ]
    if include_headers:
        fields.append(
            pa.field(
                "headers",
                pa.map_(pa.field("key", pa.string(), nullable=False), pa.binary()),
            )
        )
    fields += [
        pa.field("dlsn", pa.string()),
        pa.field("sequence_id", pa.int64()),
        pa.field("txid", pa.int64()),
        pa.field("timestamp", pa.timestamp("us", tz="UTC")),
    ]
    return pa.schema(fields)


def records_to_arrow(
    records: Sequence[ReadRecord], schema: pa.Schema, include_headers: bool = True
) -> pa.RecordBatch:
    """One record batch of ``records`` in ``schema`` (from :func:`arrow_schema`)."""
    import pyarrow as pa

    columns: list[pa.Array] = [
        pa.array([r.stream for r in records], pa.string()),
        pa.array([r.key for r in records], pa.binary()),
        pa.array([r.payload for r in records], pa.binary()),
    ]
    if include_headers:
        headers_type = schema.field("headers").type
        columns.append(
            pa.array(
                [None if r.headers is None else list(r.headers.items()) for r in records],
                headers_type,
            )
        )
    columns += [
        pa.array([str(r.dlsn) for r in records], pa.string()),
        pa.array([r.sequence_id for r in records], pa.int64()),
        pa.array([r.txid for r in records], pa.int64()),
        pa.array([r.timestamp_ms * 1000 for r in records], pa.int64()).cast(
            pa.timestamp("us", tz="UTC")
        ),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=schema)
