"""Ensemble change: replace the writer's failed bookies and record the new segment.

When a bookie of the current ensemble fails or times out, the writer pauses
completions and calls :func:`change_ensemble`: each failed position gets a replacement
(:func:`~ledger.placement.choose_replacement`: never a member, healthy and rack-aware
when possible), and a new segment starting at LAC + 1 -- every entry before it
completed, so it is where metadata already says -- is compare-and-set into the ledger
metadata. Only then does the writer re-send its unacknowledged entries to the new
bookies, so metadata always names the bookies an entry really lives on.

A lost CAS re-reads the metadata: a ledger no longer OPEN was recovered by another
client (FENCED: the writer stops); a changed last segment, or segments added or
removed, mean a second writer (fail stop); otherwise -- the same segments, or earlier
ones whose lost bookies autorecovery re-replicated (:mod:`ledger.replication`) -- the
change is tried again on the new version, which the writer then holds.

*Delayed* ensemble change (BookKeeper's ``delayEnsembleChange``): while the bookies that
did not fail still make the ack quorum of every write set (:func:`ack_quorum_holds`),
the writer need not pause for a replacement -- entries complete on the others, and
:func:`plan_ensemble` (no pause, no metadata write) says whether a spare exists before
the writer pauses for :func:`change_ensemble`.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence, Set

from foundation.errors import BadVersionError, FencedError, MetadataError, WriterFailedError
from foundation.quorum import write_set
from ledger.env import LedgerEnv
from ledger.placement import choose_replacement
from metadata.ledger_metadata import LedgerMetadata, LedgerState, Segment

__all__ = ["ack_quorum_holds", "change_ensemble", "plan_ensemble"]


def ack_quorum_holds(
    ensemble: Sequence[str], failed: Collection[str], write_quorum: int, ack_quorum: int
) -> bool:
    """Whether every write set of ``ensemble`` still has ``ack_quorum`` bookies outside
    ``failed``: then every entry can still be acknowledged without a new ensemble."""
    size = len(ensemble)
    for first in range(size if write_quorum < size else 1):  # E = Qw: one write set
        alive = sum(ensemble[pos] not in failed for pos in write_set(first, size, write_quorum))
        if alive < ack_quorum:
            return False
    return True


async def change_ensemble(
    env: LedgerEnv, meta: LedgerMetadata, version: int, failed: Set[str], start: int
) -> tuple[LedgerMetadata, int]:
    """``meta`` (at ``version``) with a new last segment from ``start`` in which every
    bookie of ``failed`` is replaced, as stored; and its new version.

    Raises NotEnoughBookiesError (no replacement), FencedError (the ledger is no longer
    OPEN), WriterFailedError (the segments changed under the writer), MetadataError
    (the CAS was lost ``metadata_cas_retries_max`` times)."""
    ledger_id, segments = meta.ledger_id, meta.segments
    retries = env.config.metadata_cas_retries_max
    for _attempt in range(retries):
        if meta.state is not LedgerState.OPEN:
            raise FencedError(
                f"ledger {ledger_id} is {meta.state.value}: recovered by another client"
            )
        new = meta.with_segment(start, await plan_ensemble(env, meta, failed))
        try:
            written = await env.store.write(new, version)
        except BadVersionError:
            meta, version = await env.store.read(ledger_id)
            if meta.state is LedgerState.OPEN and not _same_writer(meta.segments, segments):
                raise WriterFailedError(
                    f"ledger {ledger_id}: ensembles changed under the writer"
                ) from None
        else:
            env.metrics.ensemble_changes += 1
            return new, written
    raise MetadataError(f"ledger {ledger_id}: ensemble change lost the CAS {retries} times")


def _same_writer(now: Sequence[Segment], mine: Sequence[Segment]) -> bool:
    """The segments as this writer left them, but for bookies re-replicated in its
    earlier (sealed) segments: the same starts and the same last segment."""
    return [s.first_entry_id for s in now] == [s.first_entry_id for s in mine] and (
        now[-1] == mine[-1]
    )


async def plan_ensemble(env: LedgerEnv, meta: LedgerMetadata, failed: Set[str]) -> list[str]:
    """The last segment's bookies with a replacement for every failed one (nothing is
    written); NotEnoughBookiesError when some failed bookie has no replacement."""
    candidates = await env.store.writable_bookies()
    racks = {c.bookie_id: c.rack for c in candidates}
    avoid = env.health.avoided() | failed
    usable = [c for c in candidates if c.bookie_id not in failed]
    ensemble = list(meta.last_segment.bookies)
    for pos, bookie in enumerate(ensemble):
        if bookie in failed:
            ensemble[pos] = choose_replacement(
                usable, ensemble, pos, meta.write_quorum, avoid=avoid, racks=racks, rng=env.rng
            )
    return ensemble
