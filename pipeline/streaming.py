"""Start a Structured Streaming query that survives Spark's fixed Python worker wait.

A streaming query over a Python data source (``bookline``) starts a Python worker for
its source while the query initializes (Spark 4's ``PythonStreamingSourceRunner``), and
Spark waits a hard-coded 10 s for that worker to connect back, with no setting to raise
it. On a CPU-starved machine a worker's start (importing pyspark and pyarrow) can take
longer, and the query dies, before reading anything, with "Python worker failed to
connect back". :func:`start_query` starts such a query again, a bounded number of times.

Whether a query is still initializing is read from Spark's words: a live query's status
says "Initializing StreamExecution" / "Initializing sources" until its sources exist,
and the failure of a query describes it ("Current State: INITIALIZING"); there is no
progress before a first batch. Should a Spark version word these differently, the
helper sees the query as started at once or the failure as not its case, and simply
never retries (the behaviour without it).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from foundation.errors import TimeoutError_

__all__ = ["SPARK_WORKER_CONNECT_S", "START_ATTEMPTS", "START_TIMEOUT_S", "start_query"]

log = logging.getLogger(__name__)

# Spark's own, fixed wait for a Python worker to connect back (PythonWorkerFactory);
# named here for the messages only.
SPARK_WORKER_CONNECT_S = 10
# Starts of one query: a worker start that missed Spark's wait twice in a row on a
# loaded machine may miss it again; more attempts would hide a machine that cannot run it.
START_ATTEMPTS = 3
# Wait for one start's sources to initialize: Spark's worker wait plus the source's
# own set-up (a ZooKeeper session), with room for a loaded machine.
START_TIMEOUT_S = 120.0
# How often the start is checked (each check blocks in awaitTermination at most this).
POLL_S = 0.2
# Spark's status messages before a query's sources exist (StreamExecution, ProgressContext).
INITIALIZING_MESSAGES = frozenset({"Initializing StreamExecution", "Initializing sources"})
WORKER_CONNECT_FAILURE = "Python worker failed to connect back"
# How a failed query's exception describes a query that died before its sources existed
# (StreamingQueryException's query description; its status then says "Terminated ...").
FAILED_INITIALIZING = "Current State: INITIALIZING"


def start_query(
    writer: Any, *, attempts: int = START_ATTEMPTS, timeout_s: float = START_TIMEOUT_S
) -> Any:
    """``writer.start()`` (a DataStreamWriter, configured), then wait until the query's
    sources are initialized or the query ended; returns the StreamingQuery.

    If the query died with "Python worker failed to connect back" while still
    initializing (no batch started), it is started again, up to ``attempts`` starts in
    all, each retry logged as a warning. That is safe: the source had not been created,
    so nothing was read or written, and the checkpoint (if any) holds at most the query
    id Spark writes when it starts, which the new start reuses like any restart. Any
    other failure, that failure after the query got going, or the last attempt's failure
    propagates unchanged (a ``StreamingQueryException``). Raises TimeoutError_ (after
    stopping the query) if its sources are not initialized within ``timeout_s``.

    Starting queries one after another with this also keeps their worker starts from
    competing for the CPU.
    """
    from pyspark.errors import StreamingQueryException

    for attempt in range(1, attempts):
        query = writer.start()
        try:
            _await_sources(query, timeout_s)
            return query
        except StreamingQueryException as error:
            if not _worker_missed_spark_wait(query, error):
                raise
            log.warning(
                "streaming query %s: its Python worker did not connect back within Spark's "
                "fixed %d s before the query read anything; starting it again (attempt %d of %d)",
                query.name or query.id,
                SPARK_WORKER_CONNECT_S,
                attempt + 1,
                attempts,
            )
    query = writer.start()  # the last attempt: its failure propagates whatever it is
    _await_sources(query, timeout_s)
    return query


def _await_sources(query: Any, timeout_s: float) -> None:
    """Return once ``query`` is past initializing or ended without error; raise its
    StreamingQueryException if it failed (awaitTermination raises it only once Spark has
    unregistered the query, so a restart under the same name or checkpoint is allowed)."""
    deadline = time.monotonic() + timeout_s
    while not query.awaitTermination(POLL_S):
        if not _initializing(query):
            return
        if time.monotonic() > deadline:
            query.stop()
            raise TimeoutError_(
                f"streaming query {query.name or query.id}: sources not initialized "
                f"within {timeout_s:.0f}s (status: {query.status['message']})"
            )


def _initializing(query: Any) -> bool:
    return query.status["message"] in INITIALIZING_MESSAGES and not query.recentProgress


def _worker_missed_spark_wait(query: Any, error: Exception) -> bool:
    text = str(error)
    return (
        WORKER_CONNECT_FAILURE in text and FAILED_INITIALIZING in text and not query.recentProgress
    )
