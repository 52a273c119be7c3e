"""The one shape of ``GET /health`` on every service (bookie, proxies, autorecovery).

Body (JSON)::

    {"service": "bookie", "id": "bookie-1", "state": "ok", "why": "writable",
     "time_ms": 1700000000000, "recent_errors": [...], ...service details...}

``state`` is one of :class:`State`; ``why`` says in a fixed sentence what made it so
(a failure's own text, which may name anything, goes into the ``error`` detail).
``ok`` and ``degraded`` (serving, with something to look at: a read-only bookie, a
suspended ZooKeeper session) answer HTTP 200; ``starting``, ``stopping`` and ``down``
answer 503, so a load balancer or a process supervisor can act on the status alone.

:class:`RecentErrors` keeps the process's last WARNING-and-above log records (bounded)
for the ``recent_errors`` field, which the dashboard shows.

Log lines and details may name streams, topics and groups; every service's ``/health``
is open to anyone, and answers callers without the right token
(:func:`foundation.auth.sees_detail`) :func:`public_health`: only whether it is up
(:data:`PUBLIC_FIELDS`), nothing of tenants' data.
"""

from __future__ import annotations

import collections
import enum
import logging
import threading
import time
from typing import Any, Final

__all__ = ["PUBLIC_FIELDS", "RecentErrors", "State", "health_body", "http_status", "public_health"]

# Log records kept for /health: enough to see what went wrong lately, small to send.
RECENT_ERRORS_MAX: Final = 20
# A message longer than this is cut (a stack trace belongs in the log, not in /health).
RECENT_ERROR_CHARS_MAX: Final = 500


class State(enum.StrEnum):
    OK = "ok"
    DEGRADED = "degraded"
    STARTING = "starting"
    STOPPING = "stopping"
    DOWN = "down"


_SERVING: Final = frozenset({State.OK, State.DEGRADED})


def http_status(state: State) -> int:
    return 200 if state in _SERVING else 503


# What /health tells anyone: which service, and whether (and why) it serves. ``why`` is
# one of each service's fixed sentences, never a name or a log line.
PUBLIC_FIELDS: Final = ("service", "id", "state", "status", "why", "time_ms")


def public_health(body: dict[str, Any]) -> dict[str, Any]:
    """``body`` without anything but :data:`PUBLIC_FIELDS` (no details, no log lines)."""
    return {key: body[key] for key in PUBLIC_FIELDS if key in body}


def health_body(
    service: str, instance_id: str, state: State, why: str, **details: Any
) -> dict[str, Any]:
    """The JSON body of ``/health`` (``status`` repeats ``state`` for older readers)."""
    return {
        "service": service,
        "id": instance_id,
        "state": state.value,
        "status": state.value,
        "why": why,
        "time_ms": int(time.time() * 1000),
        "recent_errors": RecentErrors.installed().snapshot(),
        **details,
    }


class RecentErrors(logging.Handler):
    """The last :data:`RECENT_ERRORS_MAX` WARNING+ records of this process (any thread)."""

    _instance: RecentErrors | None = None
    _install_lock = threading.Lock()

    def __init__(self) -> None:
        super().__init__(level=logging.WARNING)
        self._records: collections.deque[dict[str, Any]] = collections.deque(
            maxlen=RECENT_ERRORS_MAX
        )

    @classmethod
    def installed(cls) -> RecentErrors:
        """The process's handler, attached to the root logger on first use."""
        with cls._install_lock:
            if cls._instance is None:
                cls._instance = cls()
                logging.getLogger().addHandler(cls._instance)
            return cls._instance

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
        except (TypeError, ValueError):  # a bad %-format in somebody's log call
            message = str(record.msg)
        self._records.append(
            {
                "time_ms": int(record.created * 1000),
                "level": record.levelname,
                "logger": record.name,
                "message": message[:RECENT_ERROR_CHARS_MAX],
            }
        )

    def snapshot(self) -> list[dict[str, Any]]:
        """Newest first."""
        return list(reversed(self._records.copy()))  # copy: one C call under the GIL
