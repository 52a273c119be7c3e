"""Disk health of the storage directories: how full the fullest is, and the read-only
state that follows (adds refused, except recovery adds) until there is room again.

Two things turn the bookie read-only: the server's periodic disk check against
``disk_usage_threshold`` (writable again under ``disk_usage_lwm``), and the journal
finding its next preallocation would not fit (:meth:`DiskHealth.turn_read_only_for_space`).
The journal's reserve counts as used, so the two agree.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

from .api import DiskUsage
from .faults import FileIO
from .journal import SPACE_MARGIN_BYTES

log = logging.getLogger(__name__)


class DiskHealth:
    """Event loop thread. :attr:`read_only` is read on every add."""

    __slots__ = ("_dirs", "_io", "_journal_dir", "_prealloc_bytes", "read_only")

    def __init__(self, dirs: Sequence[Path], io: FileIO, *, journal_prealloc_bytes: int) -> None:
        """``dirs``: the journal directory first, then the others."""
        self._prealloc_bytes = journal_prealloc_bytes
        self._dirs = tuple(dirs)
        self._journal_dir = self._dirs[0]
        self._io = io
        self.read_only = False

    def usage(self) -> DiskUsage:
        """The fullest of the disks. On the journal's, the room it keeps for its next
        preallocation and margin counts as used: the journal turns read-only when that
        room is gone, and the thresholds must agree or the server's disk check would
        turn it writable again (and the registry flap)."""
        worst: tuple[float, int, int] = (0.0, 0, 0)
        reserve = self._prealloc_bytes + SPACE_MARGIN_BYTES
        for d in self._dirs:
            total, free = self._io.disk_space(d)
            if d == self._journal_dir:
                free = max(0, free - reserve)
            used = 1.0 - (free / total) if total else 1.0
            if used >= worst[0]:
                worst = (used, free, total)
        return DiskUsage(worst[0], worst[1], worst[2], self.read_only)

    def check(self, threshold: float, lwm: float) -> DiskUsage:
        """Apply the thresholds: read-only at ``threshold`` (a used fraction) and above,
        writable again below ``lwm``."""
        usage = self.usage()
        if not self.read_only and usage.used_fraction >= threshold:
            log.warning("disk usage %.3f over threshold: turning read-only", usage.used_fraction)
            self.read_only = True
        elif self.read_only and usage.used_fraction < lwm:
            log.info("disk usage %.3f under low-water mark: writable again", usage.used_fraction)
            self.read_only = False
        return DiskUsage(usage.used_fraction, usage.free_bytes, usage.total_bytes, self.read_only)

    def turn_read_only_for_space(self, free_bytes: int) -> None:
        """Stop taking normal adds before the journal disk fills. The server's disk check
        keeps it so (the journal's reserve counts as used in :meth:`usage`) until usage
        is under ``disk_usage_lwm`` again."""
        if not self.read_only:
            log.warning(
                "journal disk has %d bytes free, too few for the next %d B "
                "preallocation plus %d B margin: turning read-only",
                free_bytes,
                self._prealloc_bytes,
                SPACE_MARGIN_BYTES,
            )
            self.read_only = True
