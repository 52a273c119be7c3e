"""When a busy writer holds an entry open: arrival rate against acknowledgement latency.

Every entry costs each of its bookies the same few wake-ups (the ADD arriving, the
journal hand-off, the fsync, the answer), whatever it carries, so on a machine short of
cores a bookie's CPU per record falls with the records per entry (docs/benchmarks.md,
"Bookie CPU per record, issue 17"). A fixed timer cannot tell a writer that sends a
record now and then -- which should transmit it at once -- from one that sends
thousands a second, whose records would fill an entry while the previous one is
acknowledged anyway. The pace measures both: records arriving per second (sampled at
every cut) and the time an entry takes to be acknowledged (both as moving averages).
A hold lasts :data:`HOLD_ACK_FRACTION` of that latency, within :data:`HOLD_MIN_S` and
:data:`HOLD_MAX_S`. While at least :data:`BUSY_RECORDS_PER_HOLD` records arrive within
one hold, the writer is *busy*: with an entry in flight it holds the buffer open that
long instead of sending it at the next loop iteration or when the pipe drains. A lone
or slow writer (1,000 records/s gathers at most 4 records in the longest hold) is never
busy and keeps the old rule, so its latency does not change.
"""

from __future__ import annotations

from typing import Final

__all__ = ["BUSY_RECORDS_PER_HOLD", "HOLD_ACK_FRACTION", "HOLD_MAX_S", "HOLD_MIN_S", "Pace"]

# A writer is busy while at least this many records arrive within one hold: holding
# then fills entries without waiting for records that may not come. With HOLD_MAX_S
# no writer below 3,000 records/s is ever busy.
BUSY_RECORDS_PER_HOLD: Final = 12.0
# A busy writer holds an entry open for this fraction of the acknowledgement latency:
# about one entry per acknowledgement round trip, so the pipe still overlaps.
HOLD_ACK_FRACTION: Final = 1.5
# ...but at least this long: on a quiet machine an entry is acknowledged within a
# millisecond, and holding for less would leave entries as small as before (the
# bookies' CPU per record is set by their wake-ups per entry, not by the machine's load)
HOLD_MIN_S: Final = 0.002
# ...and never longer than this (a slow disk must not turn into seconds of batching).
HOLD_MAX_S: Final = 0.004
# Weight of the newest sample in the moving averages (the pace follows load in ~5 entries).
EWMA_WEIGHT: Final = 0.2
# An interval between cuts shorter than this counts as this (write_many's size cuts
# come microseconds apart; the rate would be meaningless).
MIN_INTERVAL_S: Final = 1e-4


class Pace:
    """Moving averages of the arrival rate and the acknowledgement latency of one
    writer's entries. Pure: the caller passes the loop's clock."""

    __slots__ = ("ack_s", "interval_s", "last_cut", "records")

    def __init__(self, now: float) -> None:
        self.records = 0.0  # user records per cut
        self.interval_s = 1.0  # seconds between cuts
        self.ack_s = 0.0  # seconds from submit to acknowledgement
        self.last_cut = now

    @property
    def rate(self) -> float:
        """Records arriving per second (averages of counts and intervals: an average
        of per-cut rates would overweight the cuts that come close together)."""
        return self.records / self.interval_s

    def on_cut(self, records: int, now: float) -> None:
        """An entry of ``records`` user records was cut at ``now``."""
        interval = max(now - self.last_cut, MIN_INTERVAL_S)
        self.last_cut = now
        self.records += EWMA_WEIGHT * (records - self.records)
        self.interval_s += EWMA_WEIGHT * (interval - self.interval_s)

    def on_ack(self, latency_s: float) -> None:
        """An entry was acknowledged ``latency_s`` after it was submitted."""
        self.ack_s += EWMA_WEIGHT * (latency_s - self.ack_s)

    def busy(self, floor_s: float) -> bool:
        """Holding would gather at least :data:`BUSY_RECORDS_PER_HOLD` records."""
        return self.rate * self.hold_s(floor_s) >= BUSY_RECORDS_PER_HOLD

    def hold_s(self, floor_s: float) -> float:
        """How long a busy writer holds an entry open (at least ``floor_s``, the
        configured flush interval)."""
        return max(floor_s, HOLD_MIN_S, min(HOLD_MAX_S, HOLD_ACK_FRACTION * self.ack_s))
