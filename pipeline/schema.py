"""The data source's row schema and the conversion of records into rows.

Read schema: Kafka's, so a job written for Spark's Kafka connector runs with only the
format and connection options changed, then Bookline's own columns::

    key binary, value binary, topic string, partition int, offset bigint,
    timestamp timestamp, timestampType int,
    headers array<struct<key:string,value:binary>>      -- only with includeHeaders
    stream string, dlsn string, sequence_id bigint, txid bigint

``topic``/``partition`` name the topic partition (a plain stream is partition 0 of a
"topic" with its name); ``offset`` = ``sequence_id``; ``value`` is null for Kafka's
null value; ``timestamp`` is the record's (``ReadRecord.timestamp_ms``: the producer's,
or the writer's clock when it gave none, or the log's), ``timestampType`` Kafka's
number for which (0 CreateTime, 1 LogAppendTime); ``headers`` Kafka's ordered list,
names may repeat, a ``value`` may be null; ``dlsn`` is the core's ``"seg:entry:slot"``.
The sink's exactly-once tag travels in the record framing, never as a header (the
core decoder turns the ``bookline.spark`` header of records written before that into
the tag), so a stream written by Spark is copied with its headers and nothing else.

Read tasks yield either Python tuples or Arrow record batches; both are built here from
the same records so they cannot drift. The Arrow schema must equal what pyspark derives
from the Spark schema (it checks): the caller passes ``to_arrow_schema(schema)``.

Write schema: ``value`` (binary or string, required; a null is Kafka's null value),
optional ``key`` (binary or string), ``headers`` (Kafka's ``array<struct<key,value>>``,
kept in order, or ``map<string,binary|string>``), ``timestamp`` (timestamp, or bigint ms
since the epoch: the record's CreateTime; null or absent, the writer stamps it),
``topic`` (string), ``partition`` (int), ``stream`` (string).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from streams.records import ReadRecord

if TYPE_CHECKING:
    import pyarrow as pa

    from pipeline.planning import Slice

__all__ = [
    "SINK_COLUMNS",
    "read_schema_ddl",
    "records_to_arrow",
    "records_to_tuples",
    "visible_headers",
]

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
# Columns a DataFrame written to Bookline may have; anything else is an error.
SINK_COLUMNS = frozenset({"value", "key", "headers", "timestamp", "stream", "topic", "partition"})
# A record's headers: Kafka's ordered (key, value) pairs, values may be None.
Headers = list[tuple[str, bytes | None]]


def read_schema_ddl(include_headers: bool = False) -> str:
    headers = "headers array<struct<key:string,value:binary>>, " if include_headers else ""
    return (
        "key binary, value binary, topic string, partition int, offset bigint, "
        f"timestamp timestamp, timestampType int, {headers}"
        "stream string, dlsn string, sequence_id bigint, txid bigint"
    )


def visible_headers(headers: Headers | None) -> Headers | None:
    """A record's headers as Kafka's list of (key, value); None when there are none
    (as Kafka's connector gives)."""
    return headers or None


def records_to_tuples(
    records: Iterable[ReadRecord], sl: Slice, include_headers: bool = False
) -> Iterator[tuple[Any, ...]]:
    topic, partition = sl.topic or sl.stream, sl.partition
    for r in records:
        ts = _EPOCH + dt.timedelta(milliseconds=r.timestamp_ms)
        head = (r.key, r.payload, topic, partition, r.sequence_id, ts, r.timestamp_type)
        tail = (r.stream, str(r.dlsn), r.sequence_id, r.txid)
        if include_headers:
            yield (*head, visible_headers(r.headers), *tail)
        else:
            yield (*head, *tail)


def records_to_arrow(
    records: Sequence[ReadRecord], sl: Slice, schema: pa.Schema, include_headers: bool = False
) -> pa.RecordBatch:
    """One record batch of ``records`` (all of slice ``sl``) in ``schema``."""
    import pyarrow as pa
    import pyarrow.compute as pc

    n = len(records)
    if n == 0:
        return pa.RecordBatch.from_pylist([], schema=schema)
    # One transpose of the records (tuples) instead of a Python loop per column.
    (_stream, _seg, entry_ids, slot_ids, seq_ids, txids, ts_ms, payloads, keys, headers,
     ts_types) = zip(*records, strict=True)  # fmt: skip
    seqs = pa.array(seq_ids, pa.int64())
    # "seg:entry:slot" built in Arrow (str(DLSN) per record was half the task's time).
    dlsns = pc.binary_join_element_wise(
        pa.repeat(pa.scalar(str(sl.seqno), pa.string()), n),
        pa.array(entry_ids, pa.int64()).cast(pa.string()),
        pa.array(slot_ids, pa.int64()).cast(pa.string()),
        ":",
    )
    columns: list[pa.Array] = [
        pa.array(keys, pa.binary()),
        pa.array(payloads, pa.binary()),
        pa.repeat(pa.scalar(sl.topic or sl.stream, pa.string()), n),
        pa.repeat(pa.scalar(sl.partition, pa.int32()), n),
        seqs,
        pc.multiply(pa.array(ts_ms, pa.int64()), 1000).cast(pa.timestamp("us", tz="UTC")),
        pa.array(ts_types, pa.int32()),
    ]
    if include_headers:
        columns.append(
            pa.array([visible_headers(h) for h in headers], schema.field("headers").type)
        )
    columns += [
        pa.repeat(pa.scalar(sl.stream, pa.string()), n),
        dlsns,
        seqs,
        pa.array(txids, pa.int64()),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=schema)
