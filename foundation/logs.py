"""Logging set-up for every ``bookline`` process: plain lines by default, JSON lines on
request, and the chatty libraries kept quiet.

:func:`setup` is called once per process (the CLI does it). Formats:

* ``plain`` -- ``2026-01-31 12:00:00,123 INFO writeproxy.app: message``;
* ``json`` -- one object per line: ``ts`` (ISO 8601, UTC), ``level``, ``logger``,
  ``msg``, the process's own identity (``service``, ``id``: :func:`set_identity`), the
  ids a message names as fields (``stream``, ``ledger``, ``bookie``, ``segment``,
  ``proxy``, ``group``, ``topic``; :func:`ids_of`), anything passed with ``extra=``,
  and ``exc`` with the traceback of a logged exception.

Choose with ``--log-format json`` / ``BOOKLINE_LOG_FORMAT=json``; ``-v`` /
``BOOKLINE_LOG_LEVEL=DEBUG`` for more. kazoo and py4j log at WARNING whatever the
level: their INFO lines (every connection attempt, Spark's gateway) drown ours. The
proxies' access log (logger ``bookline.access``, a line per answer) is on unless
``BOOKLINE_ACCESS_LOG=off``.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import re
import sys
from collections.abc import Mapping
from typing import Any, Final, TextIO

__all__ = [
    "FORMATS",
    "JsonFormatter",
    "ids_of",
    "set_identity",
    "setup",
]

FORMATS: Final = ("plain", "json")
ENV_FORMAT: Final = "BOOKLINE_LOG_FORMAT"
ENV_LEVEL: Final = "BOOKLINE_LOG_LEVEL"
ENV_ACCESS_LOG: Final = "BOOKLINE_ACCESS_LOG"  # "off": no access log lines
ACCESS_LOGGER: Final = "bookline.access"  # the proxies' access log (httpapi.server)
PLAIN_FORMAT: Final = "%(asctime)s %(levelname)s %(name)s: %(message)s"
# Libraries whose INFO lines are noise to an operator; WARNING and above still show.
QUIET_LOGGERS: Final = ("kazoo", "py4j", "asyncio", "urllib3")
# Words that, right before a %-placeholder of a log message, name an id worth a field:
# log.info("ledger %d closed", 7) -> {"ledger": 7} in JSON lines.
ID_FIELDS: Final = ("stream", "ledger", "bookie", "segment", "proxy", "group", "topic")
_ID_BEFORE = re.compile(r"\b(" + "|".join(ID_FIELDS) + r")[ =]$")
_PLACEHOLDER = re.compile(r"\b(" + "|".join(ID_FIELDS) + r")[ =]%[-#0 +]*\d*(?:\.\d+)?[sdrif]")
_PLACEHOLDER = re.compile(r"%[-#0 +]*\d*(?:\.\d+)?[sdrifxXeEgGc%]")
# LogRecord attributes every record has; anything else came with ``extra=``.
_STANDARD_ATTRS: Final = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {
    "message",
    "asctime",
    "taskName",
}

# The name of the handler setup() installs, so a second call replaces only its own.
_HANDLER_NAME: Final = "bookline-console"
_identity: dict[str, str] = {}


def set_identity(service: str, ident: str) -> None:
    """Name this process in every JSON line (``service``: bookie, writeproxy, ...)."""
    _identity.clear()
    _identity.update(service=service, id=ident)


def ids_of(template: object, args: object) -> dict[str, object]:
    """The ids a %-style message names: ``("ledger %d of stream %s", (7, "s"))`` ->
    ``{"ledger": 7, "stream": "s"}``. Nothing for other messages or mapping args."""
    if not isinstance(template, str) or not isinstance(args, tuple) or not args:
        return {}
    found: dict[str, object] = {}
    index = 0
    for ph in _PLACEHOLDER.finditer(template):
        if ph.group(0) == "%%":
            continue
        before = _ID_BEFORE.search(template, 0, ph.start())
        if before is not None and index < len(args) and before.group(1) not in found:
            found[before.group(1)] = _plain(args[index])
        index += 1
    return found


def _plain(value: object) -> object:
    return value if isinstance(value, int | float | str | bool) or value is None else str(value)


class JsonFormatter(logging.Formatter):
    """One JSON object per record (see the module docstring for the keys)."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, Any] = {
            "ts": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
            **_identity,
        }
        out.update(ids_of(record.msg, record.args))
        for key, value in record.__dict__.items():
            if key not in _STANDARD_ATTRS and not key.startswith("_"):
                out[key] = _plain(value)
        if record.exc_info:
            out["exc"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def _level(verbose: bool, environ: Mapping[str, str], default: int) -> int:
    if verbose:
        return logging.DEBUG
    name = environ.get(ENV_LEVEL)
    level = logging.getLevelName(name.upper()) if name else default
    return level if isinstance(level, int) else default


def setup(
    *,
    verbose: bool = False,
    fmt: str | None = None,
    stream: TextIO | None = None,
    environ: Mapping[str, str] | None = None,
    quiet: bool = False,
) -> None:
    """Configure the root logger for this process (a second call replaces what the
    first installed). ``quiet``: WARNING unless ``verbose`` or ``BOOKLINE_LOG_LEVEL``
    says otherwise (commands that print an answer rather than run a server)."""
    env = os.environ if environ is None else environ
    chosen = (fmt or env.get(ENV_FORMAT) or "plain").lower()
    if chosen not in FORMATS:
        chosen = "plain"
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if chosen == "json" else logging.Formatter(PLAIN_FORMAT))
    handler.set_name(_HANDLER_NAME)
    root = logging.getLogger()
    for old in list(root.handlers):
        if old.get_name() == _HANDLER_NAME:  # ours from an earlier call; others stay
            root.removeHandler(old)
    root.addHandler(handler)
    level = _level(verbose, env, logging.WARNING if quiet else logging.INFO)
    root.setLevel(level)
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(max(level, logging.WARNING))
    access = env.get(ENV_ACCESS_LOG, "on").lower()
    logging.getLogger(ACCESS_LOGGER).setLevel(
        logging.WARNING if access in ("off", "0", "false", "no") else logging.NOTSET
    )
