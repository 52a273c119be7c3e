"""pipeline.streaming.start_query (issue 22): a streaming query whose Python worker missed
Spark's fixed 10 s wait while initializing is started again; nothing else is retried.

Pure: scripted stand-ins for Spark's StreamingQuery and DataStreamWriter, no JVM.
"""

from __future__ import annotations

import logging
from typing import Any

import pytest

pytest.importorskip("pyspark")

from pyspark.errors import StreamingQueryException

from foundation.errors import TimeoutError_
from pipeline import streaming
from pipeline.examples import jobs
from pipeline.streaming import start_query

INITIALIZING = "Initializing sources"
RUNNING = "Waiting for next trigger"


def _connect_back_failure(state: str = "INITIALIZING") -> StreamingQueryException:
    # The text Spark's query died with on a loaded machine (issue 22).
    return StreamingQueryException(
        message="[STREAM_FAILED] Query [id = 1, runId = 2] terminated with exception: "
        "Python worker failed to connect back. SQLSTATE: XXKST\n=== Streaming Query ===\n"
        f"Current Committed Offsets: {{}}\nCurrent State: {state}\nThread State: RUNNABLE"
    )


class _Query:
    """A started query: ``polls`` awaitTermination calls initializing, then ``outcome``:
    a StreamingQueryException to raise, "running" (sources initialized) or "ended"."""

    def __init__(
        self,
        outcome: StreamingQueryException | str,
        *,
        polls: int = 2,
        progress: list[dict[str, Any]] | None = None,
        name: str = "q",
    ) -> None:
        self.outcome = outcome
        self.polls = polls
        self.message = "Initializing StreamExecution"
        self.progress_at_end = progress or []
        self.recentProgress: list[dict[str, Any]] = []
        self.name = name
        self.id = "id-1"
        self.stopped = False

    def awaitTermination(self, timeout: float) -> bool:
        assert 0 < timeout <= 1, timeout
        if self.polls > 0:
            self.polls -= 1
            self.message = INITIALIZING
            return False
        self.recentProgress = self.progress_at_end
        if isinstance(self.outcome, StreamingQueryException):
            self.message = "Terminated with exception: Python worker failed to connect back."
            raise self.outcome
        if self.outcome == "running":
            self.message = RUNNING
        return self.outcome == "ended"

    @property
    def status(self) -> dict[str, Any]:
        return {"message": self.message, "isDataAvailable": False, "isTriggerActive": False}

    def stop(self) -> None:
        self.stopped = True


class _Writer:
    """A DataStreamWriter whose start() hands out the given queries in turn."""

    def __init__(self, *queries: _Query) -> None:
        self.queries = list(queries)
        self.started: list[_Query] = []

    def start(self) -> _Query:
        query = self.queries.pop(0)
        self.started.append(query)
        return query


def test_a_query_whose_worker_missed_sparks_wait_while_initializing_is_started_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    good = _Query("running", name="access-logs-status")
    writer = _Writer(_Query(_connect_back_failure(), name="access-logs-status"), good)
    with caplog.at_level(logging.WARNING, logger=streaming.__name__):
        assert start_query(writer) is good
    assert len(writer.started) == 2
    [warning] = [r.getMessage() for r in caplog.records]
    assert "access-logs-status" in warning and "10 s" in warning and "attempt 2 of 3" in warning


def test_a_query_that_initializes_or_ends_is_returned_after_one_start() -> None:
    for outcome in ("running", "ended"):
        query = _Query(outcome, polls=5)
        writer = _Writer(query)
        assert start_query(writer) is query
        assert writer.started == [query] and not query.stopped


def test_any_other_failure_while_initializing_propagates_unchanged() -> None:
    error = StreamingQueryException(message="[STREAM_FAILED] no such stream")
    writer = _Writer(_Query(error), _Query("running"))
    with pytest.raises(StreamingQueryException) as info:
        start_query(writer)
    assert info.value is error and len(writer.started) == 1


def test_the_connect_back_failure_after_the_query_got_going_propagates() -> None:
    after_progress = _Query(_connect_back_failure(), progress=[{"batchId": 0}])
    after_activation = _Query(_connect_back_failure("ACTIVE"))
    for failed in (after_progress, after_activation):
        writer = _Writer(failed, _Query("running"))
        with pytest.raises(StreamingQueryException) as info:
            start_query(writer)
        assert info.value is failed.outcome and len(writer.started) == 1


def test_it_gives_up_after_the_attempts_with_the_last_failure() -> None:
    failures = [_Query(_connect_back_failure()) for _ in range(3)]
    writer = _Writer(*failures, _Query("running"))
    with pytest.raises(StreamingQueryException) as info:
        start_query(writer, attempts=3)
    assert info.value is failures[-1].outcome and len(writer.started) == 3


def test_sources_not_initialized_in_time_stop_the_query_and_time_out() -> None:
    query = _Query("running", polls=1_000_000)
    with pytest.raises(TimeoutError_, match="not initialized"):
        start_query(_Writer(query), timeout_s=0)
    assert query.stopped


def test_the_demo_starts_its_second_query_once_the_first_one_s_source_is_initialized() -> None:
    first = _Query("running", polls=3)

    class _Second(_Writer):
        def start(self) -> _Query:
            assert first.status["message"] == RUNNING, "started beside an initializing query"
            return super().start()

    queries = jobs._start_all([_Writer(first), _Second(_Query("running"))])
    assert queries[0] is first and len(queries) == 2


def test_the_demo_stops_its_started_query_when_the_second_cannot_start() -> None:
    first = _Query("running")
    error = StreamingQueryException(message="[STREAM_FAILED] no such stream")
    with pytest.raises(StreamingQueryException):
        jobs._start_all([_Writer(first), _Writer(_Query(error))])
    assert first.stopped
