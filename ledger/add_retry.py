"""When a writer re-sends a failed add to the same bookie instead of replacing it.

* TOO_MANY_REQUESTS: the bookie is alive and busy. The add is re-sent after a backoff
  that grows with the time already spent refused (a busy bookie is polled gently),
  until the add timeout since the first send is spent -- then it counts as a failure.
* A timeout on a bookie that acknowledged adds *sent after* the one that timed out: it
  is alive, that one request or its answer was lost. Re-sent, within a budget of a few
  add timeouts; a bookie silent since the send is replaced at once.

Pure bookkeeping (the injected clock in, decisions out); the writer sends.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["AddRetry"]

# First pause before re-sending an add a bookie refused with TOO_MANY_REQUESTS (grows
# with the time spent refused, capped below); the add timeout bounds the retries.
_BUSY_BACKOFF_FIRST_S = 0.005
_BUSY_BACKOFF_MAX_S = 0.2
# An add that timed out on a bookie which acknowledged other adds sent after it is
# re-sent rather than replacing a live bookie -- for at most this many add timeouts in
# total; a bookie silent since the send is replaced at once.
_TIMEOUT_RETRY_BUDGET = 3


class AddRetry:
    """The retry state of one writer."""

    def __init__(self, add_timeout_s: float, clock: Callable[[], float]) -> None:
        self._add_timeout_s = add_timeout_s
        self._clock = clock
        # Clock time each bookie last acknowledged an add of this writer, and when that
        # add was sent: tells a stalled bookie from one that lost a single request.
        self._last_ack_sent: dict[str, float] = {}
        self._warned: set[str] = set()
        self.timeout_retries = 0  # lost adds re-sent (logs, tests)

    def acked(self, bookie: str, started: float) -> None:
        """``bookie`` acknowledged an add sent at ``started``."""
        if started > self._last_ack_sent.get(bookie, -1.0):
            self._last_ack_sent[bookie] = started

    def busy_delay_s(self, first_sent: float) -> float | None:
        """Pause before re-sending an add refused as busy, first sent at ``first_sent``;
        None once the add timeout is spent."""
        elapsed_s = self._clock() - first_sent
        if elapsed_s >= self._add_timeout_s:
            return None
        return min(_BUSY_BACKOFF_FIRST_S + elapsed_s / 4, _BUSY_BACKOFF_MAX_S)

    def resend_lost(self, bookie: str, started: float, first_sent: float) -> bool:
        """Whether an add to ``bookie`` sent at ``started`` (first at ``first_sent``)
        that timed out is re-sent: the bookie acknowledged a later add and the budget is
        not spent."""
        if self._last_ack_sent.get(bookie, -1.0) <= started:
            return False  # nothing sent after this one was answered: stalled
        if self._clock() - first_sent >= _TIMEOUT_RETRY_BUDGET * self._add_timeout_s:
            return False
        self.timeout_retries += 1
        return True

    def first_warning(self, bookie: str) -> bool:
        """True the first time for ``bookie`` (re-sends are logged once per bookie)."""
        if bookie in self._warned:
            return False
        self._warned.add(bookie)
        return True
