"""Namespaces and streams: their records, the max txid, create/list/delete.

A stream is created in one transaction with its children (``maxtxid``, ``segments``,
``lock``, ``subscribers``), so it is either fully there or absent. The max txid lives
in its own znode rather than in the stream record: the writer bumps it on every segment
change, and an admin editing options must not make the writer's compare-and-set fail.
Segments and their transitions are in :mod:`metadata.segments`.
"""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from typing import Final, cast

from foundation.errors import AlreadyExistsError, BadRequestError, NotFoundError
from foundation.names import is_internal
from foundation.quorum import check_quorum
from metadata import serde
from metadata.layout import Layout
from metadata.zk import Transaction, ZkClient

log = logging.getLogger(__name__)

NAMESPACE_KIND = "namespace"
STREAM_KIND = "stream"
TXID_KIND = "maxtxid"
FORMAT_VERSION = 1
NO_TXID = -1  # max txid of a stream that never got a record


CREATE_TIME: Final = "CreateTime"
LOG_APPEND_TIME: Final = "LogAppendTime"
# In Kafka's numbering (a record's timestamp type: 0, 1).
TIMESTAMP_TYPES: Final = (CREATE_TIME, LOG_APPEND_TIME)


@dataclass(frozen=True, slots=True)
class StreamOptions:
    retention_ms: int | None = None  # drop sealed segments older than this; None: keep
    retention_bytes: int | None = None  # keep at most this many bytes of sealed segments
    segment_rollover_bytes: int | None = None  # roll a segment past this size
    segment_rollover_ms: int | None = None  # roll a segment past this age
    # The stream's ledgers' quorums (all three or none; None: the namespace config's).
    ensemble_size: int | None = None
    write_quorum: int | None = None
    ack_quorum: int | None = None
    # Whose timestamp a record keeps (Kafka's message.timestamp.type): "CreateTime", the
    # producer's (or the writer's clock when it gave none), or "LogAppendTime", the
    # writer's clock at append, overwriting the producer's.
    timestamp_type: str = CREATE_TIME

    def __post_init__(self) -> None:
        if self.timestamp_type not in TIMESTAMP_TYPES:
            raise BadRequestError(
                f"stream option timestamp_type must be one of {', '.join(TIMESTAMP_TYPES)}, "
                f"got {self.timestamp_type!r}"
            )
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name == "timestamp_type":
                continue
            if value is not None and (
                not isinstance(value, int) or isinstance(value, bool) or value <= 0
            ):
                raise BadRequestError(f"stream option {f.name} must be a positive int or None")
        quorums = (self.ensemble_size, self.write_quorum, self.ack_quorum)
        if any(q is not None for q in quorums):
            if None in quorums:
                raise BadRequestError(
                    "stream options ensemble_size, write_quorum and ack_quorum go together"
                )
            e, w, a = cast("tuple[int, int, int]", quorums)
            check_quorum(e, w, a, "stream options", error=BadRequestError)

    @property
    def quorums(self) -> tuple[int, int, int] | None:
        """``(ensemble, write, ack)`` when the stream sets its own, else None."""
        if self.ensemble_size is None or self.write_quorum is None or self.ack_quorum is None:
            return None
        return (self.ensemble_size, self.write_quorum, self.ack_quorum)


@dataclass(frozen=True, slots=True)
class StreamRecord:
    namespace: str
    stream: str
    options: StreamOptions
    ctime_ms: int
    format_version: int = FORMAT_VERSION

    def encode(self) -> bytes:
        body = {
            "namespace": self.namespace,
            "stream": self.stream,
            "options": dataclasses.asdict(self.options),
            "ctime_ms": self.ctime_ms,
        }
        return serde.encode(STREAM_KIND, FORMAT_VERSION, body)

    @classmethod
    def decode(cls, data: bytes, where: str = "") -> StreamRecord:
        version, body = serde.decode(data, STREAM_KIND, FORMAT_VERSION, where)
        raw = serde.field(body, "options", dict, where)
        known = {f.name for f in dataclasses.fields(StreamOptions)}
        return cls(
            namespace=serde.field(body, "namespace", str, where),
            stream=serde.field(body, "stream", str, where),
            options=StreamOptions(**{k: v for k, v in raw.items() if k in known}),
            ctime_ms=serde.field(body, "ctime_ms", int, where),
            format_version=version,
        )


def encode_max_txid(txid: int) -> bytes:
    return serde.encode(TXID_KIND, FORMAT_VERSION, {"maxtxid": txid})


def decode_max_txid(data: bytes, where: str = "") -> int:
    _v, body = serde.decode(data, TXID_KIND, FORMAT_VERSION, where)
    value: int = serde.field(body, "maxtxid", int, where)
    return value


class StreamStore:
    """Namespaces and streams."""

    def __init__(self, zk: ZkClient, layout: Layout) -> None:
        self._zk = zk
        self._layout = layout

    # -- namespaces ----------------------------------------------------------------

    async def create_namespace(self, ns: str) -> None:
        """AlreadyExistsError if it exists."""
        body = {"namespace": ns}
        await self._zk.create(
            self._layout.namespace(ns),
            serde.encode(NAMESPACE_KIND, FORMAT_VERSION, body),
            makepath=True,
        )
        await self._zk.ensure_path(self._layout.topics(ns))

    async def namespace_exists(self, ns: str) -> bool:
        return await self._zk.exists(self._layout.namespace(ns)) is not None

    async def list_namespaces(self) -> list[str]:
        try:
            return await self._zk.get_children(self._layout.namespaces)
        except NotFoundError:
            return []  # cluster not initialised: no namespaces yet

    async def delete_namespace(self, ns: str) -> None:
        """Delete an empty namespace; BadRequestError if it still has streams."""
        path = self._layout.namespace(ns)
        streams = await self._zk.get_children(path)
        if streams:
            raise BadRequestError(f"namespace {ns!r} still has {len(streams)} stream(s)")
        await self._zk.delete(path)

    # -- streams -------------------------------------------------------------------

    async def create_stream(
        self, ns: str, stream: str, options: StreamOptions | None = None, ctime_ms: int = 0
    ) -> StreamRecord:
        """Create a stream with all its children in one transaction.

        NotFoundError if the namespace does not exist, AlreadyExistsError if the
        stream does -- or, for a user stream name, a topic of that name does (checked in
        the same transaction: the topic's path is created and deleted in it)."""
        record = StreamRecord(ns, stream, options or StreamOptions(), ctime_ms)
        L = self._layout
        if not await self.namespace_exists(ns):
            raise NotFoundError(f"namespace {ns!r} does not exist")
        guard = not is_internal(stream)  # internal names can't be topic names
        for attempt in (1, 2):
            tx = self._zk.transaction()
            self.add_create_ops(tx, record)
            if guard:
                tx.create(L.topic(ns, stream)).delete(L.topic(ns, stream))
            try:
                await tx.commit()
                break
            except AlreadyExistsError as exc:
                if guard and await self._zk.exists(L.topic(ns, stream)) is not None:
                    raise AlreadyExistsError(
                        f"{ns}/{stream} is a topic; a stream can't have the same name"
                    ) from exc
                # The transaction's error names a znode: say which stream instead.
                raise AlreadyExistsError(f"stream {ns}/{stream} already exists") from exc
            except NotFoundError:
                if not guard or attempt == 2 or await self._zk.exists(L.topics(ns)) is not None:
                    raise
                await self._zk.ensure_path(L.topics(ns))  # a namespace from before topics
        log.info("created stream %s/%s", ns, stream)
        return record

    def add_create_ops(self, tx: Transaction, record: StreamRecord) -> None:
        """Add the creation of a stream and its children to ``tx`` (topics create their
        partition streams in their own transactions with this)."""
        L, ns, stream = self._layout, record.namespace, record.stream
        tx.create(L.stream(ns, stream), record.encode())
        tx.create(L.max_txid(ns, stream), encode_max_txid(NO_TXID))
        tx.create(L.segments(ns, stream))
        tx.create(L.lock(ns, stream))
        tx.create(L.subscribers(ns, stream))

    async def stream_exists(self, ns: str, stream: str) -> bool:
        return await self._zk.exists(self._layout.stream(ns, stream)) is not None

    async def list_streams(self, ns: str) -> list[str]:
        try:
            return await self._zk.get_children(self._layout.namespace(ns))
        except NotFoundError as exc:
            raise NotFoundError(f"namespace {ns!r} does not exist") from exc

    async def get_stream(self, ns: str, stream: str) -> tuple[StreamRecord, int]:
        path = self._layout.stream(ns, stream)
        try:
            data, version = await self._zk.get(path)
        except NotFoundError as exc:
            raise NotFoundError(f"stream {ns}/{stream} does not exist") from exc
        return StreamRecord.decode(data, path), version

    async def update_options(
        self, ns: str, stream: str, options: StreamOptions, expected_version: int
    ) -> int:
        """CAS the stream's options; returns the new version."""
        record, _ = await self.get_stream(ns, stream)
        new = dataclasses.replace(record, options=options)
        return await self._zk.set(self._layout.stream(ns, stream), new.encode(), expected_version)

    async def get_max_txid(self, ns: str, stream: str) -> tuple[int, int]:
        """``(max txid, version)``; the version is what segment transitions check."""
        path = self._layout.max_txid(ns, stream)
        data, version = await self._zk.get(path)
        return decode_max_txid(data, path), version

    async def delete_stream(self, ns: str, stream: str) -> None:
        """Delete the stream and everything under it (segments' ledgers are the caller's)."""
        path = self._layout.stream(ns, stream)
        if await self._zk.exists(path) is None:
            raise NotFoundError(f"stream {ns}/{stream} does not exist")
        await self._zk.delete_recursive(path)
        log.info("deleted stream %s/%s", ns, stream)
