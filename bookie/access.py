"""Which requests a bookie serves: on an authenticated connection (when auth is on), and
for a ledger only those carrying the ledger's master key (issue 15).

*Authentication* (:class:`ConnectionAuth`): with ``[bookie] auth_enabled`` a connection
must first send AUTH with a token (``foundation.auth``, checked in constant time); any
other request first, or a token that does not check out, is answered UNAUTHENTICATED
and the connection closed. A bookie's inventory (LIST_LEDGERS, LIST_DAMAGED,
ENTRY_CHECKSUMS) is then for admins of the cluster only (the services' principal, or a
grant of admin on the cluster), else FORBIDDEN.

*Ledger keys* (:class:`LedgerGate`):

A bookie learns a ledger's master key from the first ADD or fence it accepts for it, and
from then on storage refuses adds, fences and WRITE_LACs under another key. Reads, LAC
polls and entry listings under that stored key pass here at once; under another key, or
for a ledger the bookie does not hold, the ledger's metadata decides, so a caller without
the key gets one answer whether or not the bookie holds the ledger (issue 21):
UNAUTHORIZED when it exists, NO_LEDGER when it does not. What is left is the
first contact: without a check, anyone could create a ledger on a bookie (filling its
disk with entries of ledgers that exist nowhere) or be the first to fence a ledger under
a key of their choosing. So before storage sees the first ADD or fence of a ledger it
does not hold, the gate looks the ledger up in ZooKeeper and checks the key against the
metadata's key check (:meth:`metadata.ledger_metadata.LedgerMetadata.accepts_master_key`,
constant time): NO_LEDGER when the ledger does not exist, UNAUTHORIZED when the key is
not its own. Recovery and re-replication adds of closed ledgers pass the same way.

Lookups of one ledger in flight at once are shared, and verified ledgers are kept in a
small LRU (their key never changes), so a writer's pipelined first adds cost one
ZooKeeper read. A gate without a lookup (a bookie server built without metadata, in
tests) admits first contacts as before and only checks stored keys.
"""

from __future__ import annotations

import asyncio
import collections
import hmac
import time
from collections.abc import Awaitable, Callable
from typing import Final

from bookie import protocol as p
from bookie.storage.api import Storage
from foundation.auth import Authority, token_expiry
from foundation.errors import (
    InvariantViolation,
    NoLedgerError,
    NotFoundError,
    UnauthenticatedError,
    UnauthorizedError,
)
from metadata.ledger_metadata import LedgerMetadata

__all__ = ["INVENTORY_REQUESTS", "LOOKUP_CACHE_MAX", "ConnectionAuth", "LedgerGate", "Lookup"]

# Ledgers whose metadata was looked up and kept: a writer's first adds to one bookie,
# and a re-replication's, arrive before storage holds the ledger; a few thousand covers
# every ledger a bookie starts at once.
LOOKUP_CACHE_MAX: Final = 4096

# ledger id -> its metadata; NotFoundError when it does not exist.
Lookup = Callable[[int], Awaitable[LedgerMetadata]]
# Requests that say what a bookie holds across ledgers, with no ledger key to check:
# with auth on, for admins of the cluster only.
INVENTORY_REQUESTS: Final = frozenset(
    {p.ListLedgersRequest, p.ListDamagedRequest, p.EntryChecksumsRequest}
)


class ConnectionAuth:
    """Who is on one connection. Without an authority (auth off) every connection is
    ready at once, as the anonymous principal ``""``."""

    __slots__ = ("_authority", "expires_at", "principal")

    def __init__(self, authority: Authority | None) -> None:
        self._authority = authority
        self.principal: str | None = None if authority is not None else ""
        # When the token of this connection expires (unix seconds); None: never (auth
        # off, or a static token). The connection holds to it (see expire()).
        self.expires_at: float | None = None

    @property
    def ready(self) -> bool:
        """Whether requests other than AUTH may be served."""
        return self.principal is not None

    def answer(self, req: p.Request) -> bytes:
        """The response frame to an AUTH request; UnauthenticatedError for a token that
        does not check out, or for any other request while not authenticated."""
        if type(req) is not p.AuthRequest:
            raise UnauthenticatedError(
                f"authenticate first: {p.op_of(req).name} before AUTH on a bookie with auth on"
            )
        if self._authority is None:
            return p.encode_response(p.AuthResponse(req.request_id, ""))
        self.principal = None  # a failed AUTH leaves nobody authenticated
        self.principal = self._authority.authenticate(req.token, time.time())
        self.expires_at = token_expiry(req.token)
        return p.encode_response(p.AuthResponse(req.request_id, self.principal))

    def expire(self) -> None:
        """The token has expired: nothing more is served until a new AUTH (issue 21:
        a token's expiry holds for the whole life of a connection)."""
        self.principal = None
        self.expires_at = None

    def authorize(self, req: p.Request) -> None:
        """ForbiddenError for an inventory request of a principal that is not an admin
        of the cluster (auth on only)."""
        if self._authority is not None and type(req) in INVENTORY_REQUESTS:
            principal = self.principal or ""
            self._authority.grants.authorize(principal, "admin", "cluster", "")


class LedgerGate:
    """The key checks of one bookie server (all on its event loop)."""

    def __init__(self, storage: Storage, lookup: Lookup | None) -> None:
        self._storage = storage
        self._lookup = lookup
        self._known: collections.OrderedDict[int, LedgerMetadata] = collections.OrderedDict()
        self._pending: dict[int, asyncio.Future[LedgerMetadata]] = {}
        # Metadata look-ups made (a test and an operator can see the cache work).
        self.lookups = 0

    def holds_under(self, ledger_id: int, master_key: bytes) -> bool:
        """Whether this bookie holds the ledger under ``master_key`` (a read, LAC poll
        or listing may go ahead without :meth:`check_read`)."""
        stored = self._storage.master_key_of(ledger_id)
        return stored is not None and hmac.compare_digest(stored, master_key)

    async def check_read(self, ledger_id: int, master_key: bytes) -> None:
        """Before a read, LAC poll or listing. A caller without the ledger's key gets
        the same answer whether or not this bookie holds the ledger (issue 21: the
        answer told any token holder which ledgers a bookie holds): UnauthorizedError
        for a ledger that exists in metadata, NoLedgerError for one that does not (a
        held one deleted there included). The key's holder passes; storage then
        answers, NO_LEDGER when this bookie holds nothing of it."""
        if self.holds_under(ledger_id, master_key):
            return
        held = self._storage.master_key_of(ledger_id) is not None
        if self._lookup is None:  # no metadata (tests): only the stored key decides
            if held:
                raise UnauthorizedError(f"wrong master key for ledger {ledger_id}")
            return
        meta = await self._metadata(ledger_id)
        if held or not meta.accepts_master_key(master_key):
            raise UnauthorizedError(f"wrong master key for ledger {ledger_id}")

    def admits_now(self, ledger_id: int, master_key: bytes) -> bool:
        """Whether an ADD or fence may go to storage without a metadata look-up: the
        bookie holds the ledger (storage checks the key), has no metadata to look in,
        or looked the ledger up lately and ``master_key`` is its key."""
        if self._lookup is None or self._storage.master_key_of(ledger_id) is not None:
            return True
        meta = self._known.get(ledger_id)
        return meta is not None and meta.accepts_master_key(master_key)

    async def admit(self, ledger_id: int, master_key: bytes) -> None:
        """Before an ADD or fence: NoLedgerError when the ledger does not exist in
        metadata, UnauthorizedError when ``master_key`` is not its key."""
        if self.admits_now(ledger_id, master_key):
            return
        meta = await self._metadata(ledger_id)
        if not meta.accepts_master_key(master_key):
            raise UnauthorizedError(f"wrong master key for ledger {ledger_id}")

    async def _metadata(self, ledger_id: int) -> LedgerMetadata:
        meta = self._known.get(ledger_id)
        if meta is not None:
            self._known.move_to_end(ledger_id)
            return meta
        pending = self._pending.get(ledger_id)
        if pending is None:
            pending = asyncio.ensure_future(self._look_up(ledger_id))
            self._pending[ledger_id] = pending
            pending.add_done_callback(self._looked_up)
        return await asyncio.shield(pending)

    def _looked_up(self, future: asyncio.Future[LedgerMetadata]) -> None:
        for ledger_id, pending in list(self._pending.items()):
            if pending is future:
                del self._pending[ledger_id]
        if not future.cancelled():
            future.exception()  # retrieved: every waiter may have gone (their answer is)

    async def _look_up(self, ledger_id: int) -> LedgerMetadata:
        lookup = self._lookup
        if lookup is None:  # admits_now() lets every request pass without metadata
            raise InvariantViolation(f"ledger {ledger_id} looked up without metadata")
        self.lookups += 1
        try:
            meta = await lookup(ledger_id)
        except NotFoundError as exc:
            raise NoLedgerError(f"ledger {ledger_id} does not exist") from exc
        self._known[ledger_id] = meta
        while len(self._known) > LOOKUP_CACHE_MAX:
            self._known.popitem(last=False)
        return meta
