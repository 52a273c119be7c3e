"""The dashboard's view of ZooKeeper and autorecovery (parts of ``GET /v1/cluster``,
:mod:`readproxy.cluster`):

* :func:`zookeeper_state` -- this proxy's session state (kazoo's: connected, suspended,
  lost) and, per server of its connect string, the mode ``srvr`` reports (standalone,
  leader, follower) and whether it answered ``ruok`` with ``imok``. A server that
  allows neither four-letter word, or that only listens with TLS, shows no mode: the
  session state still says whether ZooKeeper serves this proxy;
* :func:`autorecovery_state` -- the elected auditor (None: no autorecovery runs, and
  no ledger of a lost bookie is ever repaired) and whether re-replication is enabled or
  paused by an operator (``bookline autorecovery disable``).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any, Final

from foundation.errors import BooklineError
from ledger.auditor import current_leader

if TYPE_CHECKING:
    from metadata.client import MetadataClient

log = logging.getLogger(__name__)

__all__ = ["autorecovery_state", "zookeeper_state"]

# A ZooKeeper server gets this long to answer a four-letter word.
FOUR_LETTER_TIMEOUT_S: Final = 1.0
# Bytes read of a four-letter answer (srvr's is a few hundred).
FOUR_LETTER_BYTES_MAX: Final = 16 * 1024
# Servers asked per summary (a connect string lists a handful).
SERVERS_MAX: Final = 16


def servers_of(connect: str) -> list[tuple[str, int]]:
    """``host:port`` pairs of a ZooKeeper connect string (its chroot dropped)."""
    out: list[tuple[str, int]] = []
    for part in connect.split("/", 1)[0].split(","):
        host, _sep, port = part.strip().rpartition(":")
        if port.isdigit():
            out.append((host.strip("[]") or "127.0.0.1", int(port)))
    return out[:SERVERS_MAX]


async def four_letter_word(host: str, port: int, word: str) -> str:
    """ZooKeeper's answer to ``word`` ('' when it does not answer in time)."""
    try:
        async with asyncio.timeout(FOUR_LETTER_TIMEOUT_S):
            reader, writer = await asyncio.open_connection(host, port)
            try:
                writer.write(word.encode("ascii"))
                await writer.drain()
                data = await reader.read(FOUR_LETTER_BYTES_MAX)
            finally:
                writer.close()
    except (OSError, TimeoutError):
        return ""
    return data.decode("ascii", "replace")


async def _server(host: str, port: int) -> dict[str, Any]:
    ruok, srvr = await asyncio.gather(
        four_letter_word(host, port, "ruok"), four_letter_word(host, port, "srvr")
    )
    mode = next(
        (line.split(":", 1)[1].strip() for line in srvr.splitlines() if line.startswith("Mode:")),
        None,
    )
    return {"address": f"{host}:{port}", "ok": ruok == "imok", "mode": mode}


async def zookeeper_state(md: MetadataClient, connect: str) -> dict[str, Any]:
    servers = await asyncio.gather(*(_server(h, p) for h, p in servers_of(connect)))
    return {"session": md.zk.state.value, "servers": list(servers)}


async def autorecovery_state(md: MetadataClient) -> dict[str, Any]:
    out: dict[str, Any] = {"auditor": None, "replication_enabled": None}
    try:
        out["auditor"] = await current_leader(md)
        out["replication_enabled"] = await md.underreplicated.replication_enabled()
    except BooklineError as exc:
        log.warning("dashboard: could not read autorecovery's state: %s", exc)
        out["error"] = exc.message
    return out
