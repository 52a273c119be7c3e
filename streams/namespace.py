"""``Namespace``: the entry point of the core library (asyncio).

One namespace object holds one ZooKeeper session (shared by its writers' locks, its
readers' watches and the ledger metadata) and one pool of bookie connections. It
creates and lists streams, opens writers (:mod:`streams.writer`) and readers
(:mod:`streams.reader`), reads entries directly for Spark, and keeps subscriptions.
See ``docs/core-api.md``.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

from bookie.client import BookieClientPool, TokenSource
from foundation.cluster_file import read_cluster_file
from foundation.config import MetadataConfig
from foundation.errors import (
    AlreadyExistsError,
    BooklineError,
    EndOfStreamError,
    ForbiddenError,
    NoLedgerError,
    NotFoundError,
    UnauthenticatedError,
    UnauthorizedError,
)
from foundation.names import validate_name
from ledger.adapters import PoolTransport, ZkLedgerStore
from ledger.client import LedgerClient
from ledger.keys import bookie_identity
from ledger.reader import LedgerReader
from metadata.client import MetadataClient
from metadata.segments import SegmentMetadata, TruncationState
from metadata.streams import StreamOptions
from streams.columns import payload_bytes, scan_entry
from streams.compaction import CompactionReport, compact_stream, compact_topic
from streams.compaction_plan import CompactionPolicy
from streams.config import NamespaceConfig
from streams.context import CoreContext
from streams.dlsn import DLSN, StartPosition
from streams.reader import LogReader
from streams.records import ReadRecord
from streams.recordset import decode_header, decode_read_records
from streams.retention import apply_retention
from streams.seek import first_readable, resolve_start
from streams.vocabulary import SegmentInfo, StreamInfo
from streams.writer import LogWriter

log = logging.getLogger(__name__)

__all__ = ["Namespace", "SegmentInfo", "StreamInfo"]

# Rounds of fencing a stream before its deletion: each finds the in-progress segments a
# writer opened since the last (a roll), which takes far longer than a round.
FENCE_ROUNDS_MAX = 5
# How long a lookup by time (record_at_time) waits to find the record or to know the
# stream holds none: past a fetch's own failure (a bookie read times out after
# read_timeout_ms, 5 s by default) on a loaded machine. A lookup is rare, and a wrong
# "none" makes a consumer skip every record after the time.
TIME_LOOKUP_TIMEOUT_S = 30.0


class Namespace:
    """``ns = await Namespace.open(zk=..., root=..., namespace=...)``; close when done."""

    def __init__(self, ctx: CoreContext, pool: BookieClientPool) -> None:
        self._ctx = ctx
        self._pool = pool
        self.name = ctx.namespace
        self._closed = False

    @classmethod
    async def open(
        cls,
        zk: str,
        root: str = "/bookline",
        namespace: str = "default",
        config: NamespaceConfig | None = None,
        *,
        create: bool = True,
        token: str | TokenSource | None = None,
        zk_digest_file: str = "",
    ) -> Namespace:
        """Open ``namespace`` under ``root``, creating the namespace when missing unless
        ``create=False``: then a missing namespace (a wrong ``root``?) is a NotFoundError
        and nothing is written to ZooKeeper (what a reader wants). ``token``: presented
        to bookies with auth on -- a callable is asked at each connect and renewal (a
        service signing short-lived tokens) -- else the process's
        (``bookie.client.use_token``).
        ``zk_digest_file``: ZooKeeper digest credentials (``metadata.digest_file``; ""
        = ``$BOOKLINE_METADATA_DIGEST_FILE``, else none)."""
        cfg = config or NamespaceConfig()
        validate_name(namespace, "namespace")
        md = MetadataClient(MetadataConfig(zk=zk, root=root, digest_file=zk_digest_file,
                                           session_timeout_ms=cfg.session_timeout_ms))  # fmt: skip
        await md.connect()
        identity = bookie_identity(cfg.ledger)  # bookies prove themselves (issue 21)
        pool = BookieClientPool(token=token, identity=identity)
        try:
            if not await md.streams.namespace_exists(namespace):
                if not create:
                    raise NotFoundError(
                        f"namespace {namespace!r} does not exist under root {root!r} of "
                        f"ZooKeeper {zk} (wrong root or namespace?)"
                    )
                try:
                    await md.streams.create_namespace(namespace)
                except AlreadyExistsError:
                    log.debug("namespace %s created concurrently", namespace)
            store = ZkLedgerStore(md.ledgers, md.bookies, md.ledger_ids, identity=identity)
            ledgers = LedgerClient(store, PoolTransport(pool, store.address_of), cfg.ledger)
        except BaseException:
            await pool.close()
            await md.close()
            raise
        return cls(CoreContext(md, ledgers, namespace, cfg), pool)

    @classmethod
    async def from_cluster_file(
        cls,
        path: str | Path,
        namespace: str = "default",
        config: NamespaceConfig | None = None,
        *,
        create: bool = True,
        token: str | None = None,
    ) -> Namespace:
        """Open on a cluster described by a ``cluster.json`` (``bookline local``), with
        the credentials it names: its token for the bookies (unless ``token`` is given),
        its ledger secret (unless ``config`` names one), its ZooKeeper digest file."""
        cluster = read_cluster_file(path)
        cfg = config or NamespaceConfig()
        if cluster.ledger_secret_file and not cfg.ledger.secret_file:
            ledger = dataclasses.replace(cfg.ledger, secret_file=cluster.ledger_secret_file)
            cfg = dataclasses.replace(cfg, ledger=ledger)
        return await cls.open(
            cluster.zk,
            cluster.root,
            namespace,
            cfg,
            create=create,
            token=token or cluster.token(),
            zk_digest_file=cluster.zk_digest_file or "",
        )

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self._pool.close()
        await self._ctx.md.close()

    async def __aenter__(self) -> Namespace:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    @property
    def config(self) -> NamespaceConfig:
        return self._ctx.config

    @property
    def context(self) -> CoreContext:
        """For the proxies and tools that need the raw layers underneath."""
        return self._ctx

    # -- streams -----------------------------------------------------------------------

    async def create_stream(self, name: str, options: StreamOptions | None = None) -> None:
        validate_name(name, "stream")
        await self._ctx.md.streams.create_stream(
            self.name, name, options, ctime_ms=self._ctx.clock_ms()
        )

    async def list_streams(self) -> list[str]:
        return sorted(await self._ctx.md.streams.list_streams(self.name))

    async def exists(self, name: str) -> bool:
        return await self._ctx.md.streams.stream_exists(self.name, name)

    async def stream_options(self, name: str) -> StreamOptions:
        record, _v = await self._ctx.md.streams.get_stream(self.name, name)
        return record.options

    async def delete_stream(self, name: str) -> None:
        """Delete the stream and its segments' ledgers. Its in-progress segments are
        fenced first (:meth:`fence`): a writer still open, here or in another process,
        fails at its next add instead of acknowledging records into a deleted stream --
        or into a new stream of the same name."""
        await self.fence(name)
        for seg, _v in await self._ctx.segments(name):
            self._ctx.forget_ledger(seg.ledger_id)
            try:
                await self._ctx.ledgers.delete_ledger(seg.ledger_id)
            except NoLedgerError:
                log.debug("ledger %d already gone", seg.ledger_id)
        await self._ctx.md.streams.delete_stream(self.name, name)

    async def fence(self, name: str) -> int:
        """Recover (fence at the bookies) the ledgers of the stream's in-progress
        segments, so whatever writer holds them can get no more entries acknowledged;
        returns how many were fenced. Looks again after each round: a writer that rolled
        meanwhile has a newer in-progress segment (bounded by FENCE_ROUNDS_MAX)."""
        fenced: set[int] = set()
        password = self._ctx.config.password_bytes
        for _round in range(FENCE_ROUNDS_MAX):
            todo = [seg for seg, _v in await self._ctx.segments(name)
                    if not seg.is_sealed and seg.truncation is not TruncationState.TRUNCATED
                    and seg.ledger_id not in fenced]  # fmt: skip
            if not todo:
                break
            for seg in todo:
                try:
                    await self._ctx.ledgers.open_ledger(seg.ledger_id, password, recover=True)
                except NoLedgerError:
                    log.debug("ledger %d of %s already gone", seg.ledger_id, name)
                fenced.add(seg.ledger_id)
        return len(fenced)

    async def segments(self, name: str) -> list[SegmentInfo]:
        """Segments oldest first; the in-progress one with its confirmed counters."""
        out: list[SegmentInfo] = []
        for raw, _v in await self._ctx.segments(name):
            seg = raw
            if not raw.is_sealed and raw.truncation is not TruncationState.TRUNCATED:
                seg = await self._confirmed(name, raw)
            out.append(SegmentInfo.from_metadata(seg))
        return out

    async def _confirmed(self, name: str, seg: SegmentMetadata) -> SegmentMetadata:
        """An in-progress segment with counters as of its LAC (read from the bookies,
        covering every record acknowledged before the call)."""
        try:
            reader = await self._ctx.open_segment_reader(seg)
            lac = await reader.read_confirmed_end()  # not lagging the last ack
            if lac < 0:
                return seg
            data = await reader.read_entry(lac)
        except (UnauthenticatedError, UnauthorizedError, ForbiddenError):
            raise  # wrong or missing credentials are an error, never "no data yet"
        except BooklineError as exc:
            log.debug("%s: cannot read the LAC of segment %d: %s", name, seg.seqno, exc)
            return seg
        # Located, not decoded: a ReadRecord per record of a big entry, once a second per
        # fetched partition (kafkaapi.fetch_ends), was 8 % of a catch-up fetch's CPU.
        layout = scan_entry(data, lac, seg.start_sequence_id, keys_inline=True)
        header = layout.header
        first_txid = seg.first_txid
        if first_txid < 0 and header.first_index + header.user_count > 0:
            first_txid = await self._first_txid(reader, lac)
        return SegmentMetadata(
            seqno=seg.seqno,
            ledger_id=seg.ledger_id,
            state=seg.state,
            first_txid=first_txid,
            last_txid=header.last_txid,
            last_entry_id=lac,
            last_slot_id=header.count - 1,
            record_count=header.first_index + header.user_count,
            start_sequence_id=seg.start_sequence_id,
            size_bytes=header.bytes_before + payload_bytes(layout),
            ctime_ms=seg.ctime_ms,
            truncation=seg.truncation,
            min_active_dlsn=seg.min_active_dlsn,
        )

    async def _first_txid(self, reader: LedgerReader, last: int) -> int:
        for entry_id in range(last + 1):
            header = decode_header(await reader.read_entry(entry_id))
            if header.first_txid >= 0:
                return header.first_txid
        return -1

    async def stream_info(self, name: str) -> StreamInfo:
        raw = [s for s, _v in await self._ctx.segments(name)]
        segments = await self.segments(name)
        live = [s for s in segments if not s.truncated and s.record_count > 0]
        floor = first_readable(raw)
        first_seq = await self._sequence_of(name, raw, floor)
        next_seq = (segments[-1].start_sequence_id + segments[-1].record_count) if segments else 0
        first_dlsn = None
        if live:
            first_dlsn = max(floor, DLSN(live[0].seqno, 0, 0))
        return StreamInfo(
            name=name,
            segments=segments,
            record_count=next_seq - first_seq,
            size_bytes=sum(s.size_bytes for s in segments if not s.truncated),
            first_dlsn=first_dlsn,
            last_dlsn=live[-1].last_dlsn if live else None,
            first_txid=live[0].first_txid if live else None,
            last_txid=live[-1].last_txid if live else None,
            first_sequence_id=first_seq,
            next_sequence_id=next_seq,
        )

    async def end_offset(self, name: str) -> int:
        """The sequence id the stream's next record gets (its *end offset*): after every
        record acknowledged before the call (the LAC once it covers them); cheaper than
        :meth:`stream_info` (reads the newest segment only)."""
        raw = await self._ctx.segments(name)  # NotFoundError without the stream
        if not raw:
            return 0
        last = raw[-1][0]
        if not last.is_sealed and last.truncation is not TruncationState.TRUNCATED:
            last = await self._confirmed(name, last)
        return last.start_sequence_id + last.record_count

    async def _sequence_of(self, name: str, raw: list[SegmentMetadata], floor: DLSN) -> int:
        """Sequence id of the record at ``floor`` (the first readable position)."""
        for seg in raw:
            if seg.seqno < floor.segment_seqno:
                continue
            if seg.seqno > floor.segment_seqno or (floor.entry_id == 0 and floor.slot_id == 0):
                return seg.start_sequence_id
            reader = await self._ctx.open_segment_reader(seg)
            header = decode_header(await reader.read_entry(floor.entry_id))
            return seg.start_sequence_id + header.first_index + floor.slot_id
        return raw[-1].start_sequence_id + raw[-1].record_count if raw else 0

    # -- writers and readers -----------------------------------------------------------

    async def open_writer(
        self, name: str, identity: str | None = None, *, lock_timeout_s: float | None = None
    ) -> LogWriter:
        """The stream's single writer. Without ``lock_timeout_s`` fails at once with
        ``LockOwnedError(owner=...)`` if another writer holds the stream; with it, waits
        that long (e.g. for a crashed writer's ZooKeeper session to expire)."""
        return await LogWriter.open(self._ctx, name, identity, lock_timeout_s=lock_timeout_s)

    async def open_reader(
        self,
        name: str,
        start: StartPosition | DLSN | str | None = None,
        *,
        skip_truncated: bool = False,
    ) -> LogReader:
        if not await self.exists(name):
            raise NotFoundError(f"stream {self.name}/{name} does not exist")
        position = await resolve_start(
            self._ctx, name, StartPosition.coerce(start), skip_truncated=skip_truncated
        )
        return LogReader(self._ctx, name, position, skip_truncated=skip_truncated)

    async def record_at_time(
        self, name: str, ms: int, timeout_s: float = TIME_LOOKUP_TIMEOUT_S
    ) -> ReadRecord | None:
        """The first record written at or after ``ms``; None only when the stream holds
        none (a reader got to its end: :meth:`LogReader.settle`). While the bookies
        cannot be reached raises their error (retriable), and ``TimeoutError_`` when
        neither the record nor the end came within ``timeout_s``: a slow read is never
        taken for "no record" (issue 22)."""
        reader = await self.open_reader(name, StartPosition.timestamp(ms), skip_truncated=True)
        try:
            await reader.settle(timeout_s)
            return await reader.read_next(timeout_s=0.0)
        except EndOfStreamError:
            return None  # the stream was ended: no record will come
        finally:
            await reader.close()

    async def resolve(
        self, name: str, start: StartPosition | DLSN | str, *, skip_truncated: bool = False
    ) -> DLSN:
        """The DLSN a reader opened at ``start`` would begin at."""
        return await resolve_start(
            self._ctx, name, StartPosition.coerce(start), skip_truncated=skip_truncated
        )

    async def read_entries(
        self, name: str, segment_seqno: int, first_entry_id: int, last_entry_id: int
    ) -> list[ReadRecord]:
        """Every record of entries ``first..last`` of one segment, in order (no lock,
        no reader state; reads only up to the segment's LAC)."""
        seg, _v = await self._ctx.md.segments.get_segment(self.name, name, segment_seqno)
        reader = await self._ctx.open_segment_reader(seg)
        if not seg.is_sealed and last_entry_id > reader.last_add_confirmed:
            await reader.read_lac()
        out: list[ReadRecord] = []
        async for e in reader.iter_entries(first_entry_id, last_entry_id):
            _h, records, _eos = decode_read_records(
                e.payload, name, seg.seqno, e.entry_id, seg.start_sequence_id
            )
            out.extend(records)
        return out

    # -- retention and subscriptions -------------------------------------------------

    async def apply_retention(self, name: str) -> bool:
        """Apply the stream's retention policy now (normally its writer does this)."""
        return await apply_retention(self._ctx, name, await self.stream_options(name))

    async def compact(self, name: str, policy: CompactionPolicy) -> CompactionReport:
        """Compact stream ``name``'s cleanable segments now (:mod:`streams.compaction`)."""
        return await compact_stream(self._ctx, name, policy)

    async def compact_topic(self, topic: str) -> CompactionReport:
        """Compact every partition of ``topic`` now, by its configs."""
        return (await compact_topic(self._ctx, topic))[1]

    async def commit(self, name: str, subscriber: str, dlsn: DLSN) -> bool:
        """Advance ``subscriber``'s durable position; False if ``dlsn`` is not past it."""
        validate_name(subscriber, "subscriber")
        result = await self._ctx.md.subscriptions.advance(self.name, name, subscriber, tuple(dlsn))  # type: ignore[arg-type]
        return result.advanced

    async def committed(self, name: str, subscriber: str) -> DLSN | None:
        position = await self._ctx.md.subscriptions.read(self.name, name, subscriber)
        return None if position is None else DLSN(*position)

    async def list_subscribers(self, name: str) -> list[str]:
        return sorted(await self._ctx.md.subscriptions.list(self.name, name))

    async def delete_subscriber(self, name: str, subscriber: str) -> None:
        await self._ctx.md.subscriptions.delete(self.name, name, subscriber)
