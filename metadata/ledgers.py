"""Ledger metadata: the :class:`LedgerMetadata` record and its store in ZooKeeper.

A ledger's znode (``ledgers/L/<h4>/<h4>/<h4>/L<h4>``) holds versioned msgpack of
:class:`LedgerMetadata`. Every change is a compare-and-set on the znode version: a
writer changing the ensemble and a recovering reader closing the ledger can't both win,
and the loser gets :class:`~foundation.errors.BadVersionError` (re-read and decide again).
"""

from __future__ import annotations

import bisect
import dataclasses
import enum
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from foundation.errors import BadRequestError, NotFoundError
from metadata import serde
from metadata.layout import Layout, ledger_id_from_hex
from metadata.zk import Watch, ZkClient

KIND = "ledger"
FORMAT_VERSION = 1
DIGEST_TYPES = ("crc32c", "hmac")
CUSTOM_METADATA_BYTES_MAX = 64 * 1024  # user tags, not payload


class LedgerState(enum.Enum):
    OPEN = "OPEN"
    IN_RECOVERY = "IN_RECOVERY"
    CLOSED = "CLOSED"


Ensemble = tuple[str, ...]


@dataclass(frozen=True, slots=True)
class LedgerMetadata:
    ledger_id: int
    ensemble_size: int  # E: bookies per ensemble
    write_quorum: int  # Qw: replicas of each entry
    ack_quorum: int  # Qa: acks that complete an add
    # (first entry id, bookies) in increasing first-entry order; the first starts at 0.
    ensembles: tuple[tuple[int, Ensemble], ...]
    password: bytes = b""  # ledger key: fences and (for hmac) keys the digest
    digest_type: str = "crc32c"
    state: LedgerState = LedgerState.OPEN
    last_entry_id: int = -1  # meaningful once CLOSED
    length: int = 0  # bytes of payload, meaningful once CLOSED
    custom_metadata: Mapping[str, bytes] = field(default_factory=dict)
    ctime_ms: int = 0
    format_version: int = FORMAT_VERSION

    def __post_init__(self) -> None:
        if self.ledger_id < 0:
            raise BadRequestError(f"ledger id must be >= 0, got {self.ledger_id}")
        if not self.ensemble_size >= self.write_quorum >= self.ack_quorum >= 1:
            raise BadRequestError(
                "need ensemble_size >= write_quorum >= ack_quorum >= 1, got "
                f"E={self.ensemble_size} Qw={self.write_quorum} Qa={self.ack_quorum}"
            )
        if self.digest_type not in DIGEST_TYPES:
            raise BadRequestError(f"digest_type must be one of {DIGEST_TYPES}")
        if self.last_entry_id < -1 or self.length < 0:
            raise BadRequestError("last_entry_id must be >= -1 and length >= 0")
        self._check_ensembles()
        custom = dict(self.custom_metadata)
        if sum(len(k) + len(v) for k, v in custom.items()) > CUSTOM_METADATA_BYTES_MAX:
            raise BadRequestError(f"custom metadata over {CUSTOM_METADATA_BYTES_MAX} bytes")
        object.__setattr__(self, "custom_metadata", MappingProxyType(custom))

    def _check_ensembles(self) -> None:
        if not self.ensembles or self.ensembles[0][0] != 0:
            raise BadRequestError("the first ensemble must start at entry 0")
        previous = -1
        for first, bookies in self.ensembles:
            if first <= previous:
                raise BadRequestError("ensemble first entry ids must increase")
            if len(bookies) != self.ensemble_size or len(set(bookies)) != len(bookies):
                raise BadRequestError(
                    f"ensemble at entry {first} must have {self.ensemble_size} distinct bookies"
                )
            previous = first

    # -- queries -------------------------------------------------------------------

    @property
    def is_closed(self) -> bool:
        return self.state is LedgerState.CLOSED

    @property
    def current_ensemble(self) -> Ensemble:
        return self.ensembles[-1][1]

    def ensemble_for(self, entry_id: int) -> Ensemble:
        """The bookies that store ``entry_id``."""
        if entry_id < 0:
            raise BadRequestError(f"entry id must be >= 0, got {entry_id}")
        firsts = [first for first, _ in self.ensembles]
        return self.ensembles[bisect.bisect_right(firsts, entry_id) - 1][1]

    def write_set(self, entry_id: int) -> Ensemble:
        """Bookies holding replicas of ``entry_id``: ``(entry_id + k) mod E``, k < Qw."""
        ensemble = self.ensemble_for(entry_id)
        return tuple(
            ensemble[(entry_id + k) % self.ensemble_size] for k in range(self.write_quorum)
        )

    # -- copies --------------------------------------------------------------------

    def with_state(self, state: LedgerState) -> LedgerMetadata:
        return dataclasses.replace(self, state=state)

    def with_closed(self, last_entry_id: int, length: int) -> LedgerMetadata:
        return dataclasses.replace(
            self, state=LedgerState.CLOSED, last_entry_id=last_entry_id, length=length
        )

    def with_ensemble_change(self, first_entry_id: int, bookies: Ensemble) -> LedgerMetadata:
        """New ensemble from ``first_entry_id``; replaces the last one if it starts there."""
        kept = tuple(e for e in self.ensembles if e[0] < first_entry_id)
        if self.is_closed:
            raise BadRequestError(f"ledger {self.ledger_id} is closed; its ensemble is final")
        return dataclasses.replace(self, ensembles=(*kept, (first_entry_id, tuple(bookies))))

    def with_custom_metadata(self, custom: Mapping[str, bytes]) -> LedgerMetadata:
        return dataclasses.replace(self, custom_metadata=dict(custom))

    # -- serde ---------------------------------------------------------------------

    def encode(self) -> bytes:
        body: dict[str, Any] = {
            "ledger_id": self.ledger_id,
            "ensemble_size": self.ensemble_size,
            "write_quorum": self.write_quorum,
            "ack_quorum": self.ack_quorum,
            "ensembles": [[first, list(bookies)] for first, bookies in self.ensembles],
            "password": self.password,
            "digest_type": self.digest_type,
            "state": self.state.value,
            "last_entry_id": self.last_entry_id,
            "length": self.length,
            "custom_metadata": dict(self.custom_metadata),
            "ctime_ms": self.ctime_ms,
        }
        return serde.encode(KIND, FORMAT_VERSION, body)

    @classmethod
    def decode(cls, data: bytes, where: str = "") -> LedgerMetadata:
        version, body = serde.decode(data, KIND, FORMAT_VERSION, where)
        f = serde.field
        try:
            ensembles = tuple(
                (int(first), tuple(str(b) for b in bookies))
                for first, bookies in f(body, "ensembles", list, where)
            )
            state = LedgerState(f(body, "state", str, where))
        except (TypeError, ValueError) as exc:
            raise serde.MetadataFormatError(f"ledger metadata at {where} is malformed") from exc
        return cls(
            ledger_id=f(body, "ledger_id", int, where),
            ensemble_size=f(body, "ensemble_size", int, where),
            write_quorum=f(body, "write_quorum", int, where),
            ack_quorum=f(body, "ack_quorum", int, where),
            ensembles=ensembles,
            password=f(body, "password", bytes, where),
            digest_type=f(body, "digest_type", str, where),
            state=state,
            last_entry_id=f(body, "last_entry_id", int, where),
            length=f(body, "length", int, where),
            custom_metadata=f(body, "custom_metadata", dict, where),
            ctime_ms=f(body, "ctime_ms", int, where),
            format_version=version,
        )


def now_ms() -> int:
    return int(time.time() * 1000)


class LedgerStore:
    """Create / read / CAS-update / delete / watch / list ledger metadata."""

    def __init__(self, zk: ZkClient, layout: Layout) -> None:
        self._zk = zk
        self._layout = layout

    async def create(self, md: LedgerMetadata) -> int:
        """Store a new ledger; AlreadyExistsError if the id is taken. Returns the version."""
        await self._zk.create(self._layout.ledger(md.ledger_id), md.encode(), makepath=True)
        return 0

    async def read(self, ledger_id: int) -> tuple[LedgerMetadata, int]:
        path = self._layout.ledger(ledger_id)
        try:
            data, version = await self._zk.get(path)
        except NotFoundError as exc:
            raise NotFoundError(f"ledger {ledger_id} does not exist") from exc
        return LedgerMetadata.decode(data, path), version

    async def update(self, md: LedgerMetadata, expected_version: int) -> int:
        """Compare-and-set: BadVersionError if the stored version is not
        ``expected_version``, NotFoundError if the ledger is gone. Returns the new version."""
        return await self._zk.set(self._layout.ledger(md.ledger_id), md.encode(), expected_version)

    async def delete(self, ledger_id: int, expected_version: int = -1) -> None:
        await self._zk.delete(self._layout.ledger(ledger_id), expected_version)

    async def exists(self, ledger_id: int) -> bool:
        return await self._zk.exists(self._layout.ledger(ledger_id)) is not None

    async def watch(
        self, ledger_id: int, callback: Callable[[tuple[LedgerMetadata, int] | None], None]
    ) -> Watch[tuple[bytes, int] | None]:
        """Call ``callback((metadata, version))`` on every change, None once deleted."""
        path = self._layout.ledger(ledger_id)

        def deliver(snapshot: tuple[bytes, int] | None) -> None:
            if snapshot is None:
                callback(None)
            else:
                callback((LedgerMetadata.decode(snapshot[0], path), snapshot[1]))

        return await self._zk.watch_data(path, deliver)

    async def iter_ledger_ids(self) -> AsyncIterator[int]:
        """Every stored ledger id, ascending, walking the hierarchy one level at a time."""
        root = self._layout.ledgers_root
        for a in await self._children(root):
            for b in await self._children(f"{root}/{a}"):
                for c in await self._children(f"{root}/{a}/{b}"):
                    for leaf in await self._children(f"{root}/{a}/{b}/{c}"):
                        if leaf.startswith("L"):
                            yield ledger_id_from_hex(a + b + c + leaf[1:])

    async def list_ledger_ids(self) -> list[int]:
        return [ledger_id async for ledger_id in self.iter_ledger_ids()]

    async def _children(self, path: str) -> list[str]:
        try:
            return await self._zk.get_children(path)
        except NotFoundError:
            return []  # the branch was removed while we walked
