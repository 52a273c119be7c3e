"""LastAddConfirmed per ledger: explicit LACs, long polls waiting for the LAC to move,
and what they are answered (the LAC, with the entries after the reader's piggybacked).

A ledger's LAC is the highest LAC its adds carried, raised by explicit LACs (WRITE_LAC,
or an add's LAC taken on receipt) -- but never past the highest entry durable here; it
is what is persisted and what reads report. Long polls are answered with
:meth:`~bookie.storage.state.LedgerState.visible_lac`: the writer's LAC as far as the
entries *received* here go, durable or still in the journal (the writer's LAC says
they are durable on its ack quorum), so a tail waits for the writer's LAC and not for
this replica's fsync, and a woken long poll finds its entry in memory. The write path
(writes.py) and explicit LACs wake the ledger's waiters when it moves
(:meth:`~bookie.storage.state.LedgerState.wake`).
"""

from __future__ import annotations

import asyncio
import hmac

from foundation.errors import BadRequestError, FencedError, NoEntryError, UnauthorizedError

from .api import NO_ENTRY_ID, LacResult
from .journal import Completion
from .memtable import MemTables
from .reads import EntryReads
from .state import I64_MAX, U64_MAX, Ledgers, LedgerState, StorageStats


class LacTracker:
    """The LAC side of the storage API (event loop thread)."""

    def __init__(
        self, ledgers: Ledgers, mem: MemTables, reads: EntryReads, counters: StorageStats
    ) -> None:
        self._ledgers = ledgers
        self._mem = mem
        self._reads = reads
        self._counters = counters

    def last_add_confirmed(self, ledger_id: int) -> int:
        return self._ledgers.known(ledger_id).lac

    def write_lac(self, ledger_id: int, lac: int, master_key: bytes) -> int:
        """An explicit LAC from the writer; returns the ledger's LAC after it."""
        if not 0 <= ledger_id <= U64_MAX or not NO_ENTRY_ID <= lac <= I64_MAX:
            raise BadRequestError(f"bad ledger/lac {ledger_id}/{lac}")
        st = self._ledgers.known(ledger_id)
        if not hmac.compare_digest(st.master_key, master_key):
            raise UnauthorizedError(f"wrong master key for ledger {ledger_id}")
        if st.fenced:
            raise FencedError(f"ledger {ledger_id} is fenced")
        self.apply_explicit(ledger_id, st, lac)
        return st.lac

    def apply_explicit(self, ledger_id: int, st: LedgerState, lac: int) -> None:
        """Raise the ledger's LAC to ``lac``, up to the entries durable here; the rest
        is applied as later entries become durable. Long polls are answered up to the
        entries received here (:meth:`LedgerState.visible_lac`)."""
        visible = st.visible_lac()
        st.explicit_lac = max(st.explicit_lac, lac)
        # The persisted LAC never passes what is durable here.
        applied = min(st.explicit_lac, st.last_entry)
        if applied > st.lac:
            st.lac = applied
            self._ledgers.dirty.add(ledger_id)
        if st.waiters and st.visible_lac() > visible:
            st.wake()

    async def wait_lac(
        self, ledger_id: int, previous_lac: int, timeout_s: float, bytes_max: int = 0
    ) -> LacResult:
        """The LAC once it passes ``previous_lac`` (or after ``timeout_s``), with entry
        ``previous_lac + 1`` when held here; with ``bytes_max`` > 0 also the entries
        after it, up to the LAC and about ``bytes_max`` bytes, as long as they are
        contiguous and in memory (a tail reader's batch; never a disk read)."""
        st = self._ledgers.known(ledger_id)
        if st.visible_lac() <= previous_lac and timeout_s > 0:
            fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self.watch(ledger_id, fut)
            try:
                await asyncio.wait_for(fut, timeout_s)
            except TimeoutError:
                pass
            finally:
                self.unwatch(ledger_id, fut)
        answer = self.answer_nowait(ledger_id, previous_lac, bytes_max)
        if answer is not None:
            return answer
        lac = self._ledgers.known(ledger_id).visible_lac()
        try:
            payload = await self._reads.read_entry(ledger_id, previous_lac + 1)
        except NoEntryError:
            return LacResult(lac, None, None)  # striped ensemble: another bookie holds it
        return self._answer(ledger_id, lac, previous_lac, payload, bytes_max)

    def watch(self, ledger_id: int, waiter: Completion) -> None:
        """Tell ``waiter`` (``set_result(None)``, once) when the ledger's LAC next moves."""
        st = self._ledgers.known(ledger_id)
        if st.waiters is None:
            st.waiters = []
        st.waiters.append(waiter)

    def unwatch(self, ledger_id: int, waiter: Completion) -> None:
        st = self._ledgers.get(ledger_id)
        if st is not None and st.waiters is not None and waiter in st.waiters:
            st.waiters.remove(waiter)

    def answer_nowait(
        self, ledger_id: int, previous_lac: int, bytes_max: int = 0
    ) -> LacResult | None:
        """:meth:`wait_lac`'s answer now, without waiting for the LAC to move; None when
        entry ``previous_lac + 1`` is not in memory (then :meth:`wait_lac` with no
        timeout reads it from disk, or finds it is not here)."""
        st = self._ledgers.known(ledger_id)
        lac = st.visible_lac()
        if lac <= previous_lac:
            return LacResult(lac, None, None)
        payload = self._held(ledger_id, st, previous_lac + 1)
        if payload is None:
            return None  # on disk, or not here at all: read_entry will tell
        return self._answer(ledger_id, lac, previous_lac, payload, bytes_max)

    def _held(self, ledger_id: int, st: LedgerState, entry_id: int) -> bytes | None:
        """Entry ``entry_id`` from memory: on its way through the journal, or in the
        memtables or read cache."""
        if st.pending:
            payload = st.pending.get(entry_id)
            if payload is not None:
                return payload
        return self._reads.in_memory(ledger_id, entry_id)

    def _answer(
        self, ledger_id: int, lac: int, previous_lac: int, payload: bytes, bytes_max: int
    ) -> LacResult:
        """The answer with entry ``previous_lac + 1`` (``payload``) and, for a run, the
        contiguous entries after it that are still in memory."""
        more: list[bytes] = []
        if bytes_max > 0:
            pending = self._ledgers.known(ledger_id).pending or {}
            size = len(payload)
            entry_id = previous_lac + 2
            while entry_id <= lac and size < bytes_max:
                nxt = pending.get(entry_id)
                if nxt is None:
                    nxt = self._mem.get(ledger_id, entry_id)
                if nxt is None:
                    break  # not here, or flushed already: the reader reads it
                more.append(nxt)
                size += len(nxt)
                entry_id += 1
            self._counters.read_bytes += size - len(payload)
        return LacResult(lac, previous_lac + 1, payload, tuple(more))
