"""What every option set of the ``bookline`` data source shares: where the cluster is,
and the strict parsing of option values (the read options are :mod:`pipeline.options`,
the write options :mod:`pipeline.options_sink`).

Pure: no pyspark, no I/O. Strict: an option this module does not know is an error that
names the closest known option (``startingOffset`` -> ``startingOffsets``), so a typo
never silently reads the wrong data. Spark hands options over case-insensitively, so
they are looked up lower-cased; messages use the canonical spelling.

Where the cluster is: ``zk`` (+ ``root``, default ``/bookline``) or ``cluster`` (the path
of a ``cluster.json``); ``namespace`` defaults to ``default``; ``token``: the token
presented to bookies whose auth is on (default: the cluster file's, else
``$BOOKLINE_TOKEN``; docs/security.md). ``bookline.<setting>``
passes a core-library client setting through (any :class:`streams.config.
NamespaceConfig` field: ``bookline.password``, ``bookline.digest_type``,
``bookline.session_timeout_ms``, ...; ``bookline.ledger.<field>`` for the ledger
client's, e.g. ``bookline.ledger.read_timeout_ms``).
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from foundation.errors import BadRequestError, ConfigError

# Options Spark itself hands to every source and sink: not ours to judge.
_SPARK_OWN = frozenset({"path", "checkpointlocation", "queryname"})
CONNECTION_OPTIONS = ("zk", "root", "cluster", "namespace", "token")
SETTING_PREFIX = "bookline."


# -- strictness ----------------------------------------------------------------------


def lowered(options: Mapping[str, str]) -> dict[str, str]:
    return {str(k).lower(): str(v) for k, v in options.items()}


def check_known(options: Mapping[str, str], known: tuple[str, ...], what: str) -> None:
    """Every key must be a known option (or ``bookline.<setting>``, or Spark's own)."""
    canonical = {k.lower(): k for k in known}
    for raw in options:
        key = str(raw).lower()
        if key in canonical or key in _SPARK_OWN or key.startswith(SETTING_PREFIX):
            continue
        if key.startswith("kafka."):
            raise BadRequestError(
                f"option {raw!r} is a Kafka client setting; a bookline {what} connects with "
                "'zk' (+ 'root') or 'cluster', and client settings are 'bookline.<setting>' "
                "(e.g. bookline.password)"
            )
        close = difflib.get_close_matches(key, list(canonical), n=1, cutoff=0.6)
        hint = f"; did you mean {canonical[close[0]]!r}?" if close else ""
        raise BadRequestError(
            f"unknown option {raw!r} for a bookline {what}{hint} "
            f"(known: {', '.join(sorted(known, key=str.lower))})"
        )


def bool_option(opts: dict[str, str], key: str, default: bool) -> bool:
    raw = opts.get(key.lower())
    if raw is None:
        return default
    text = raw.strip().lower()
    if text in ("true", "1", "yes"):
        return True
    if text in ("false", "0", "no"):
        return False
    raise BadRequestError(f"option {key!r} must be true or false, got {raw!r}")


def int_option(opts: dict[str, str], key: str, minimum: int | None = None) -> int | None:
    raw = opts.get(key.lower())
    if raw is None or raw.strip() == "":
        return None
    try:
        value = int(raw.strip())
    except ValueError as exc:
        raise BadRequestError(f"option {key!r} must be an integer, got {raw!r}") from exc
    if minimum is not None and value < minimum:
        raise BadRequestError(f"option {key!r} must be >= {minimum}, got {value}")
    return value


_DURATION = re.compile(r"^\s*(\d+)\s*(ms|s|m|min|h|d)?\s*$", re.IGNORECASE)
_DURATION_MS = {"ms": 1, "s": 1000, "m": 60_000, "min": 60_000, "h": 3_600_000, "d": 86_400_000}


def parse_duration_ms(raw: str, key: str) -> int:
    """``"15m"``, ``"30s"``, ``"500ms"``, ``"1h"`` or a number of milliseconds."""
    m = _DURATION.match(raw)
    if m is None:
        raise BadRequestError(f"option {key!r} must be a duration like 15m, 30s or 500ms: {raw!r}")
    return int(m.group(1)) * _DURATION_MS[(m.group(2) or "ms").lower()]


def name_list(raw: str) -> tuple[str, ...]:
    return tuple(dict.fromkeys(n.strip() for n in raw.split(",") if n.strip()))


# -- connection ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ConnectionOptions:
    """Where the cluster is, and client settings: enough for an executor to open a
    SyncNamespace. Hashable: processes keep one namespace per distinct value."""

    # ZooKeeper connect string (with chroot); None when `cluster` names a cluster.json.
    zk: str | None = None
    # The cluster's root znode.
    root: str = "/bookline"
    # Path of a cluster.json (as written by `bookline local`); read on every process.
    cluster: str | None = None
    # The namespace holding the streams.
    namespace: str = "default"
    # `bookline.<setting>` options, sorted (name without the prefix, value as given).
    settings: tuple[tuple[str, str], ...] = ()
    # Token presented to bookies with auth on (docs/security.md); None: the cluster
    # file's, else $BOOKLINE_TOKEN. Never shown (Spark redacts options named token).
    token: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if (self.zk is None) == (self.cluster is None):
            raise BadRequestError("give exactly one of the options 'zk' and 'cluster'")
        namespace_config(self)  # settings are checked when parsed, not on an executor


def _setting_value(raw: str, default: object, name: str) -> object:
    if isinstance(default, bool):
        return bool_option({name: raw}, name, default)
    if isinstance(default, int):
        value = int_option({name: raw}, name)
        return default if value is None else value
    return raw


def namespace_config(conn: ConnectionOptions) -> Any:
    """The :class:`streams.config.NamespaceConfig` the ``bookline.*`` settings give
    (None when there are none: the library's defaults)."""
    if not conn.settings:
        return None
    from ledger.config import LedgerConfig
    from streams.config import NamespaceConfig

    top = {f.name: f for f in dataclasses.fields(NamespaceConfig) if f.name != "ledger"}
    led = {f.name: f for f in dataclasses.fields(LedgerConfig)}
    top_values: dict[str, object] = {}
    ledger_values: dict[str, object] = {}
    for name, raw in conn.settings:
        key = f"{SETTING_PREFIX}{name}"
        if name.startswith("ledger.") and name[7:] in led:
            f = led[name[7:]]
            ledger_values[f.name] = _setting_value(raw, f.default, key)
        elif name in top:
            top_values[name] = _setting_value(raw, top[name].default, key)
        else:
            known = [*top, *(f"ledger.{n}" for n in led)]
            close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
            hint = f"; did you mean '{SETTING_PREFIX}{close[0]}'?" if close else ""
            raise BadRequestError(f"unknown client setting {key!r}{hint}")
    try:
        ledger = LedgerConfig(**ledger_values)  # type: ignore[arg-type]
        return NamespaceConfig(ledger=ledger, **top_values)  # type: ignore[arg-type]
    except (ConfigError, TypeError, ValueError) as exc:
        raise BadRequestError(f"bookline.* client settings: {exc}") from exc


def parse_connection(options: Mapping[str, str]) -> ConnectionOptions:
    opts = lowered(options)
    settings = tuple(
        sorted(
            (k[len(SETTING_PREFIX) :], v) for k, v in opts.items() if k.startswith(SETTING_PREFIX)
        )
    )
    return ConnectionOptions(
        zk=opts.get("zk"),
        root=opts.get("root", "/bookline"),
        cluster=opts.get("cluster"),
        namespace=opts.get("namespace", "default"),
        settings=settings,
        token=opts.get("token") or None,
    )
