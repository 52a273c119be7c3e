"""Start-up: the journal records since the checkpoint mark, applied to the ledger
states and the memtable, before the journal thread starts (blocking).

A torn tail of the last journal file is cut off first, so new records never follow
garbage. A record of a ledger whose MASTER_KEY record is before the mark belongs to a
deleted ledger (its checkpointed state is gone) and is skipped. An acknowledged ADD
whose payload is damaged in the journal is marked damaged (damage.py) unless a good copy
was replayed too.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Callable
from pathlib import Path

from . import journal_files
from .damage import DamageLog
from .faults import FileIO
from .index import DAMAGE_JOURNAL, Damage
from .journal_format import FENCE, MASTER_KEY, DamagedRecord, JournalMark, JournalRecord
from .memtable import MemTables
from .state import Ledgers, LedgerState

log = logging.getLogger(__name__)

Fsync = Callable[[int], None]


def replay(directory: Path, mark: JournalMark, ledgers: Ledgers, mem: MemTables,
           damage: DamageLog, *, fsync: Fsync, io: FileIO) -> int:  # fmt: skip
    """Apply the journal in ``directory`` from ``mark`` on; return the records applied.
    JournalCorruptError when acknowledged data is damaged beyond working around."""
    result = journal_files.replay(directory, mark)
    if result.last_file_id >= 0:
        path = directory / journal_files.file_name(result.last_file_id)
        if not result.tail_clean:
            log.warning(
                "journal %s has a torn tail at offset %d; cutting it off", path, result.tail_end
            )
        if not result.tail_clean or path.stat().st_size > result.tail_end:
            journal_files.truncate_tail(directory, result.last_file_id, result.tail_end, fsync, io)
    for rec, _end in result.records:
        _apply(ledgers, mem, rec)
    for file_id, bad in result.damaged:
        _apply_damaged(ledgers, mem, damage, file_id, bad)
    return len(result.records)


def _apply(ledgers: Ledgers, mem: MemTables, rec: JournalRecord) -> None:
    st = ledgers.get(rec.ledger_id)
    if rec.type == MASTER_KEY:
        if st is None:
            ledgers[rec.ledger_id] = LedgerState(rec.data)
            ledgers.dirty.add(rec.ledger_id)
        elif not hmac.compare_digest(st.master_key, rec.data):
            log.warning(
                "ledger %d: journal holds a second master key; keeping the first", rec.ledger_id
            )
    elif st is None:
        # Its MASTER_KEY record is before the mark, so its state was checkpointed
        # and is gone now: the ledger was deleted. Don't resurrect it.
        log.debug("journal record for deleted ledger %d skipped", rec.ledger_id)
    elif rec.type == FENCE:
        st.fenced = True
        ledgers.dirty.add(rec.ledger_id)
    else:
        mem.active.put(rec.ledger_id, rec.entry_id, rec.data)
        st.last_entry = max(st.last_entry, rec.entry_id)
        st.lac = max(st.lac, rec.lac)
        ledgers.dirty.add(rec.ledger_id)


def _apply_damaged(ledgers: Ledgers, mem: MemTables, damage: DamageLog, file_id: int,
                   bad: DamagedRecord) -> None:  # fmt: skip
    """An acknowledged ADD whose payload is damaged in the journal: the entry is
    known (its header checks out) but held damaged, until a repair re-adds it --
    unless a good copy was replayed too (a recovery add), or is indexed."""
    rec = bad.record
    st = ledgers.get(rec.ledger_id)
    if st is None:
        return  # a deleted ledger, as in _apply
    st.last_entry = max(st.last_entry, rec.entry_id)
    st.lac = max(st.lac, rec.lac)
    ledgers.dirty.add(rec.ledger_id)
    if mem.active.get(rec.ledger_id, rec.entry_id) is not None:
        damage.count_failure()
        return
    damage.record(
        rec.ledger_id, rec.entry_id, None, Damage(DAMAGE_JOURNAL, file_id, bad.offset), bad.reason
    )
