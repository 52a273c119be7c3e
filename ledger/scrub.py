"""The replica check (scrub): does every bookie hold an intact copy of every entry the
metadata says it holds?

For each CLOSED ledger, segment by segment and ``page_entries`` entries at a time, every
bookie of the segment's ensemble is asked for the *fingerprints* (CRC32C and length of
the stored blob) of the entries it holds (:meth:`ReplicaInspector.entry_checksums`: no
entry crosses the wire). Then, for each entry, the answers of its write set are judged:

* a member that does not hold the entry is MISSING; one whose storage found it damaged
  (a checksum failure, see ``Storage.damaged_entries``) is DAMAGED;
* members agreeing on one fingerprint hold the same bytes: presumed good (bookies check
  their own records on every read; the worker verifies the digest before copying);
* members disagreeing: one copy per fingerprint is read and verified against the ledger
  digest (:class:`~ledger.digest.DigestManager`); when exactly one fingerprint verifies,
  the others are MISMATCHED. No verified copy (*unrecoverable*) or two different verified
  copies (*conflict*) are reported and nothing is marked: the scrub never guesses;
* a bookie that could not be asked (down, too old, timed out) is *unchecked* for that
  ledger and nothing is concluded about it (bookies that are gone are the auditor's
  lost-bookie path).

What is found becomes repair ranges per bookie (the work-item format of
:mod:`metadata.underreplicated`): ``(first, last)`` stands for the entries in it whose
write set includes the bookie. A range grows over consecutive bad entries of that bookie
and ends at a good or undecided one, so a bookie missing a whole ledger is one range per
run, not one per entry.

OPEN and IN_RECOVERY ledgers are skipped until closed: entries past the LAC may still be
on their way to some members, an ensemble change may be moving the last segment, and
repairing a ledger under a live writer would mean fencing it. Damage found meanwhile is
not forgotten: bookies keep their damaged marks across restarts, and the next check
after the close sees the entries.

:meth:`Scrubber.damaged_repairs` is the cheap half: it only asks each bookie which
entries it found damaged (LIST_DAMAGED) and keeps those metadata says it must hold.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import enum
import logging
from collections.abc import AsyncIterable, Awaitable, Callable, Iterable, Mapping
from typing import Any

import crc32c

from foundation.errors import BooklineError, ChecksumError, InvariantViolation, NoLedgerError
from foundation.invariants import invariant
from ledger.digest import DigestManager
from ledger.env import LedgerEnv
from ledger.fragments import segment_last
from ledger.interfaces import ChecksumPage, Fingerprint, ReplicaInspector
from ledger.keys import ledger_access
from ledger.tasks import run_bounded
from metadata.ledger_metadata import LedgerMetadata
from metadata.underreplicated import EntryRanges, merge_ranges

log = logging.getLogger(__name__)

__all__ = ["LedgerReport", "Problem", "ScrubSummary", "Scrubber"]

# Entry ids kept per ledger report for unrecoverable / conflicting entries (the counts
# are exact; the samples are for the operator to start from).
SAMPLE_ENTRIES_MAX = 20
# Damaged pairs taken from one bookie per sweep; more wait for the next sweep (after
# repairs cleared the first ones).
DAMAGED_LISTED_MAX = 100_000


class Problem(enum.Enum):
    MISSING = "missing"  # a write-set member does not hold the entry
    DAMAGED = "damaged"  # the member's storage found the entry damaged
    MISMATCHED = "mismatched"  # the member's bytes differ from the verified copy


# What one write-set member answered for one entry: its fingerprint, a problem, or
# None when the bookie could not be asked.
_State = Fingerprint | Problem | None


@dataclasses.dataclass
class LedgerReport:
    """What the check of one ledger found."""

    ledger_id: int
    state: str = "checked"  # "checked", "skipped" (not closed) or "gone" (deleted)
    entries_checked: int = 0
    # bookie -> problem -> entries with it
    counts: dict[str, dict[Problem, int]] = dataclasses.field(default_factory=dict)
    # bookie -> entry ranges to re-copy to it (merged and bounded by finish())
    repairs: dict[str, EntryRanges] = dataclasses.field(default_factory=dict)
    unrecoverable: int = 0  # entries without any verified copy among reachable replicas
    conflicts: int = 0  # entries with two different verified copies
    samples: list[int] = dataclasses.field(default_factory=list)  # some of both
    unchecked: dict[str, str] = dataclasses.field(default_factory=dict)  # bookie -> error

    def total(self, problem: Problem) -> int:
        return sum(c.get(problem, 0) for c in self.counts.values())

    @property
    def clean(self) -> bool:
        """Nothing wrong found (unchecked bookies aside)."""
        return not (self.repairs or self.unrecoverable or self.conflicts)

    def to_json(self) -> dict[str, Any]:
        return {
            "ledger_id": self.ledger_id,
            "state": self.state,
            "entries_checked": self.entries_checked,
            "bookies": {
                b: {
                    **{p.value: c.get(p, 0) for p in Problem},
                    "ranges": [list(r) for r in self.repairs.get(b, ())],
                }
                for b, c in sorted(self.counts.items())
            },
            "unrecoverable": self.unrecoverable,
            "conflicts": self.conflicts,
            "sample_entries": self.samples,
            "unchecked": dict(sorted(self.unchecked.items())),
        }


@dataclasses.dataclass
class ScrubSummary:
    """A pass over many ledgers: counts, and the reports worth reading."""

    ledgers_checked: int = 0
    ledgers_skipped: int = 0  # not closed yet
    ledgers_gone: int = 0  # deleted before they were checked
    entries_checked: int = 0
    # Reports that found something or could not ask some bookie (one small object per
    # such ledger; clean ledgers are only counted).
    reports: list[LedgerReport] = dataclasses.field(default_factory=list)

    def total(self, problem: Problem) -> int:
        return sum(r.total(problem) for r in self.reports)


class _Ranges:
    """Per-bookie repair ranges being built in entry order (see the module)."""

    def __init__(self) -> None:
        self._open: dict[str, tuple[int, int]] = {}
        self._done: dict[str, list[tuple[int, int]]] = collections.defaultdict(list)

    def bad(self, bookie: str, entry_id: int) -> None:
        start = self._open.get(bookie)
        self._open[bookie] = (entry_id, entry_id) if start is None else (start[0], entry_id)

    def end(self, bookie: str) -> None:
        run = self._open.pop(bookie, None)
        if run is not None:
            self._done[bookie].append(run)

    def finish(self) -> dict[str, EntryRanges]:
        for bookie in list(self._open):
            self.end(bookie)
        return {b: merge_ranges(r) for b, r in self._done.items() if r}


class Scrubber:
    """Checks ledgers' replicas through ``inspector``; reads metadata and the copies to
    verify through ``env`` (its store, transport and timeouts)."""

    def __init__(
        self,
        env: LedgerEnv,
        inspector: ReplicaInspector,
        *,
        page_entries: int,
        ledgers_in_flight_max: int,
    ) -> None:
        invariant(page_entries > 0 and ledgers_in_flight_max > 0, "scrub limits must be > 0")
        self._env = env
        self._inspector = inspector
        self._page_entries = page_entries
        self._ledgers_in_flight_max = ledgers_in_flight_max
        self._timeout_s = env.read_timeout_s
        self.entries_checked = 0  # over the scrubber's life (logs, tests)

    # -- many ledgers ----------------------------------------------------------------

    async def check_all(
        self,
        ledger_ids: AsyncIterable[int] | Iterable[int],
        on_report: Callable[[LedgerReport], Awaitable[None]] | None = None,
        *,
        registered: frozenset[str] | None = None,
    ) -> ScrubSummary:
        """:meth:`check_ledger` for each id, ``ledgers_in_flight_max`` at once, handing
        each report to ``on_report`` (e.g. to mark it) as it comes. Metadata errors stop
        the pass (the caller retries it). Bookies outside ``registered`` (when given)
        are not asked: they are the lost-bookie path's, and asking would only wait for
        timeouts and log once per ledger."""
        ids = (
            [i async for i in ledger_ids]
            if isinstance(ledger_ids, AsyncIterable)
            else list(ledger_ids)
        )
        summary = ScrubSummary()

        async def one(ledger_id: int) -> None:
            report = await self.check_ledger(ledger_id, registered=registered)
            if report.state == "checked":
                summary.ledgers_checked += 1
                summary.entries_checked += report.entries_checked
            elif report.state == "skipped":
                summary.ledgers_skipped += 1
            else:
                summary.ledgers_gone += 1
            if not report.clean or report.unchecked:
                summary.reports.append(report)
            if on_report is not None:
                await on_report(report)

        await run_bounded(ids, one, self._ledgers_in_flight_max)
        summary.reports.sort(key=lambda r: r.ledger_id)
        return summary

    async def damaged_repairs(
        self, bookies: Iterable[str]
    ) -> tuple[dict[int, dict[str, EntryRanges]], dict[str, str]]:
        """Entries the ``bookies`` report damaged that metadata says they hold, as repair
        ranges per closed ledger; and the bookies that could not be asked (-> error)."""
        reported: dict[int, dict[str, list[int]]] = collections.defaultdict(dict)
        unchecked: dict[str, str] = {}
        for bookie in sorted(bookies):
            try:
                pairs = await self._inspector.damaged_entries(
                    bookie, limit=DAMAGED_LISTED_MAX, timeout_s=self._timeout_s
                )
            except InvariantViolation:
                raise
            except BooklineError as exc:
                unchecked[bookie] = str(exc)
                continue
            for ledger_id, entry_id in pairs:
                reported[ledger_id].setdefault(bookie, []).append(entry_id)
        out: dict[int, dict[str, EntryRanges]] = {}
        for ledger_id, per_bookie in sorted(reported.items()):
            meta = await self._closed_meta(ledger_id)
            if meta is None:
                continue  # deleted (the bookie's GC drops it) or not closed yet
            repairs: dict[str, EntryRanges] = {}
            for bookie, ids in per_bookie.items():
                held = [e for e in ids if _holds(meta, bookie, e)]
                try:
                    bad = await self._still_bad(bookie, ledger_id, held)
                except InvariantViolation:
                    raise
                except BooklineError as exc:
                    unchecked[bookie] = str(exc)
                    continue
                if bad:
                    repairs[bookie] = merge_ranges((e, e) for e in bad)
            if repairs:
                out[ledger_id] = repairs
        return out, unchecked

    async def _still_bad(self, bookie: str, ledger_id: int, entry_ids: list[int]) -> list[int]:
        """Those of ``entry_ids`` the bookie cannot serve intact now: a repaired entry
        keeps its damaged mark until the bookie's next checkpoint, but reads fine. One
        request per run of consecutive ids (at most DAMAGED_LISTED_MAX in a sweep)."""
        bad: list[int] = []
        runs = merge_ranges(((e, e) for e in entry_ids), limit=max(1, len(entry_ids)))
        for first, last in runs:
            page = await self._page(bookie, ledger_id, first, last)
            bad += [e for e in range(first, last + 1) if e not in page.fingerprints]
        return bad

    async def _closed_meta(self, ledger_id: int) -> LedgerMetadata | None:
        try:
            meta, _version = await self._env.store.read(ledger_id)
        except NoLedgerError:
            return None
        return meta if meta.is_closed else None

    # -- one ledger ------------------------------------------------------------------

    async def check_ledger(
        self, ledger_id: int, *, registered: frozenset[str] | None = None
    ) -> LedgerReport:
        report = LedgerReport(ledger_id)
        try:
            meta, _version = await self._env.store.read(ledger_id)
        except NoLedgerError:
            report.state = "gone"
            return report
        if not meta.is_closed:
            report.state = "skipped"
            return report
        if registered is not None:
            for bookie in meta.all_bookies() - registered:
                report.unchecked[bookie] = "not registered"
        ranges = _Ranges()
        digest = ledger_access(meta, self._env.secret).digest
        for index, seg in enumerate(meta.segments):
            first, last = seg.first_entry_id, segment_last(meta, index)
            for start in range(first, last + 1, self._page_entries):
                end = min(last, start + self._page_entries - 1)
                pages = await self._pages(meta, seg.bookies, start, end, report)
                for entry_id in range(start, end + 1):
                    await self._judge(
                        meta, entry_id, pages, digest=digest, ranges=ranges, report=report
                    )
        report.repairs = ranges.finish()
        report.entries_checked = meta.last_entry_id + 1
        self.entries_checked += report.entries_checked
        if not report.clean:
            log.warning(
                "replica check of ledger %d: %s; unrecoverable %d, conflicts %d (e.g. %s)",
                ledger_id,
                {b: {p.value: n for p, n in c.items()} for b, c in report.counts.items()},
                report.unrecoverable,
                report.conflicts,
                report.samples,
            )
        return report

    async def _pages(
        self,
        meta: LedgerMetadata,
        bookies: Iterable[str],
        first: int,
        last: int,
        report: LedgerReport,
    ) -> dict[str, ChecksumPage | None]:
        """Each bookie's page for ``first..last``; None for one that could not be asked
        (it is then not asked again for this ledger)."""
        asked = [b for b in bookies if b not in report.unchecked]
        answers = await asyncio.gather(
            *(self._page(b, meta.ledger_id, first, last) for b in asked),
            return_exceptions=True,
        )
        out: dict[str, ChecksumPage | None] = dict.fromkeys(bookies)
        for bookie, answer in zip(asked, answers, strict=True):
            if isinstance(answer, ChecksumPage):
                out[bookie] = answer
            elif isinstance(answer, BooklineError) and not isinstance(answer, InvariantViolation):
                log.warning(
                    "replica check of ledger %d: bookie %s not checked: %s",
                    meta.ledger_id,
                    bookie,
                    answer,
                )
                report.unchecked[bookie] = str(answer)
            else:
                raise answer  # a bug or a cancellation: not a bookie's failure
        return out

    async def _page(self, bookie: str, ledger_id: int, first: int, last: int) -> ChecksumPage:
        """One page covering ``first..last``, from as many answers as the bookie needs."""
        fingerprints: dict[int, Fingerprint] = {}
        damaged: set[int] = set()
        start = first
        while start <= last:
            page = await self._inspector.entry_checksums(
                bookie, ledger_id, start, last, timeout_s=self._timeout_s
            )
            if not start <= page.last_entry_id <= last:
                raise ChecksumError(
                    f"bookie {bookie} answered entries {start}..{page.last_entry_id} of "
                    f"ledger {ledger_id} for {start}..{last}"
                )
            fingerprints.update(page.fingerprints)
            damaged.update(page.damaged)
            start = page.last_entry_id + 1
        return ChecksumPage(last, fingerprints, frozenset(damaged))

    async def _judge(
        self,
        meta: LedgerMetadata,
        entry_id: int,
        pages: Mapping[str, ChecksumPage | None],
        *,
        digest: DigestManager,
        ranges: _Ranges,
        report: LedgerReport,
    ) -> None:
        states = {b: _state(pages[b], entry_id) for b in meta.replicas(entry_id)}
        held = {s for s in states.values() if isinstance(s, tuple)}
        good: Fingerprint | None
        if len(held) == 1:
            (good,) = held
        elif len(held) > 1:
            good = await self._verified(meta, entry_id, states, digest, report)
        else:
            good = None
            if None not in states.values():  # every member asked, none holds a copy
                self._unrecoverable(report, entry_id, "no replica holds an intact copy")
        for bookie, state in states.items():
            if good is None or state is None or state == good:
                ranges.end(bookie)  # healthy, or nothing can be concluded
                continue
            problem = state if isinstance(state, Problem) else Problem.MISMATCHED
            counts = report.counts.setdefault(bookie, {})
            counts[problem] = counts.get(problem, 0) + 1
            ranges.bad(bookie, entry_id)

    async def _verified(
        self,
        meta: LedgerMetadata,
        entry_id: int,
        states: Mapping[str, _State],
        digest: DigestManager,
        report: LedgerReport,
    ) -> Fingerprint | None:
        """The one fingerprint whose copy verifies against the ledger digest, or None
        (reported as unrecoverable or conflict, or undecided when a read failed)."""
        holders: dict[Fingerprint, str] = {}
        for bookie, state in states.items():
            if isinstance(state, tuple):
                holders.setdefault(state, bookie)
        verified: list[Fingerprint] = []
        undecided = False
        key = ledger_access(meta, self._env.secret).master_key
        for fingerprint, bookie in holders.items():
            try:
                answer = await self._env.transport.read(
                    bookie,
                    meta.ledger_id,
                    entry_id,
                    fence=False,
                    master_key=key,
                    timeout_s=self._timeout_s,
                )
                if (crc32c.crc32c(answer.data), len(answer.data)) != fingerprint:
                    raise ChecksumError(f"bookie {bookie}: entry {entry_id} changed while read")
                digest.verify(answer.data, entry_id)
            except ChecksumError as exc:
                log.warning("ledger %d entry %d on %s: %s", meta.ledger_id, entry_id, bookie, exc)
            except InvariantViolation:
                raise
            except BooklineError as exc:
                log.warning(
                    "ledger %d entry %d: cannot read %s to verify it: %s",
                    meta.ledger_id,
                    entry_id,
                    bookie,
                    exc,
                )
                undecided = True
            else:
                verified.append(fingerprint)
        if len(verified) == 1:
            return verified[0]
        if len(verified) > 1:
            report.conflicts += 1
            _sample(report, entry_id)
            log.error(
                "ledger %d entry %d: replicas hold %d different verified copies; not repaired",
                meta.ledger_id,
                entry_id,
                len(verified),
            )
        elif not undecided:
            self._unrecoverable(report, entry_id, "no copy verifies against the digest")
        return None

    @staticmethod
    def _unrecoverable(report: LedgerReport, entry_id: int, why: str) -> None:
        report.unrecoverable += 1
        _sample(report, entry_id)
        log.error("ledger %d entry %d: %s", report.ledger_id, entry_id, why)


def _state(page: ChecksumPage | None, entry_id: int) -> _State:
    if page is None:
        return None
    if entry_id in page.damaged:
        return Problem.DAMAGED
    fingerprint = page.fingerprints.get(entry_id)
    return Problem.MISSING if fingerprint is None else fingerprint


def _holds(meta: LedgerMetadata, bookie: str, entry_id: int) -> bool:
    """Metadata says ``bookie`` holds ``entry_id`` (closed ledgers: up to the end)."""
    return 0 <= entry_id <= meta.last_entry_id and bookie in meta.replicas(entry_id)


def _sample(report: LedgerReport, entry_id: int) -> None:
    if len(report.samples) < SAMPLE_ENTRIES_MAX:
        report.samples.append(entry_id)
