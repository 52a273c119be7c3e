"""Write proxies' registrations and stream owner records (both ephemeral).

* ``proxies/<id>``: a live write proxy, its address and load;
* ``owners/<ns>/<stream>``: the proxy serving a stream, so others can redirect clients.
  The stream lock (:mod:`metadata.ownership`) decides ownership; this record only
  advertises it and vanishes with the owner's session.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from dataclasses import dataclass

from foundation.errors import AlreadyExistsError, BadVersionError, LockOwnedError, NotFoundError
from metadata import serde
from metadata.layout import Layout
from metadata.zk import ZkClient

PROXY_KIND = "proxy"
OWNER_KIND = "owner"
FORMAT_VERSION = 1

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ProxyInfo:
    proxy_id: str
    address: str  # base URL or host:port clients talk to
    load: float = 0.0  # owned streams or requests/s: a hint for placement
    # Its Kafka listener (docs/kafka.md): "host:port" clients connect to, "" for none,
    # and its broker node id (int32; -1 without a listener).
    kafka: str = ""
    node_id: int = -1

    def encode(self) -> bytes:
        return serde.encode(PROXY_KIND, FORMAT_VERSION, dataclasses.asdict(self))

    @classmethod
    def decode(cls, data: bytes, where: str = "") -> ProxyInfo:
        _v, body = serde.decode(data, PROXY_KIND, FORMAT_VERSION, where)
        return cls(
            proxy_id=serde.field(body, "proxy_id", str, where),
            address=serde.field(body, "address", str, where),
            load=float(serde.field(body, "load", (int, float), where)),
            # Optional: registrations of proxies without a Kafka listener lack them.
            kafka=serde.field(body, "kafka", str, where) if "kafka" in body else "",
            node_id=serde.field(body, "node_id", int, where) if "node_id" in body else -1,
        )


@dataclass(frozen=True, slots=True)
class OwnerRecord:
    proxy_id: str
    address: str
    session_id: int  # the owner's ZooKeeper session (tells ours from a stale one)


class ProxyRegistry:
    def __init__(self, zk: ZkClient, layout: Layout) -> None:
        self._zk = zk
        self._layout = layout

    # -- proxies -------------------------------------------------------------------

    async def register(self, info: ProxyInfo) -> None:
        """Create this session's ephemeral registration.

        A registration of the same id held by another session that advertises the
        *same address* is taken over (deleted and re-created in one transaction): the
        caller listens on that address now, so the process behind the old registration
        is gone and only its session has not expired yet -- a proxy restarted at once.
        AlreadyExistsError if another session holds the id with another address (a
        second proxy with this id, or our previous process on another port: retry once
        its session has expired)."""
        path = self._layout.proxy(info.proxy_id)
        data = info.encode()
        try:
            await self._zk.create(path, data, ephemeral=True, makepath=True)
            return
        except AlreadyExistsError:
            pass
        try:
            raw, stat = await self._zk.get_with_stat(path)
        except NotFoundError:  # it expired meanwhile
            await self._zk.create(path, data, ephemeral=True, makepath=True)
            return
        if stat.ephemeral_owner == self._zk.session_id:
            await self._zk.set(path, data)
            return
        current = ProxyInfo.decode(raw, path)
        if current.address != info.address:
            raise AlreadyExistsError(
                f"proxy {info.proxy_id} is registered at {current.address} by session "
                f"0x{stat.ephemeral_owner:x}"
            )
        log.info(
            "proxy %s: taking over the registration of session 0x%x (same address %s)",
            info.proxy_id,
            stat.ephemeral_owner,
            info.address,
        )
        tx = self._zk.transaction().delete(path, stat.version).create(path, data, ephemeral=True)
        try:
            await tx.commit()
        except (BadVersionError, NotFoundError) as exc:  # changed meanwhile: look again
            raise AlreadyExistsError(f"proxy {info.proxy_id}: registration changed") from exc

    async def update(self, info: ProxyInfo) -> None:
        await self._zk.set(self._layout.proxy(info.proxy_id), info.encode())

    async def unregister(self, proxy_id: str) -> None:
        with contextlib.suppress(NotFoundError):  # already gone: goal reached
            await self._zk.delete(self._layout.proxy(proxy_id))

    async def get(self, proxy_id: str) -> ProxyInfo:
        path = self._layout.proxy(proxy_id)
        data, _ = await self._zk.get(path)
        return ProxyInfo.decode(data, path)

    async def list(self) -> dict[str, ProxyInfo]:
        out: dict[str, ProxyInfo] = {}
        try:
            names = await self._zk.get_children(self._layout.proxies)
        except NotFoundError:
            return out  # no proxy ever registered
        for name in names:
            with contextlib.suppress(NotFoundError):  # left while we listed
                out[name] = await self.get(name)
        return out

    # -- owner records -------------------------------------------------------------

    async def claim_owner(self, ns: str, stream: str, proxy_id: str, address: str) -> None:
        """Advertise this session's proxy as the stream's owner.

        LockOwnedError(owner=<address>) if another live session holds the record."""
        path = self._layout.owner(ns, stream)
        body = {"proxy_id": proxy_id, "address": address}
        try:
            await self._zk.create(
                path, serde.encode(OWNER_KIND, FORMAT_VERSION, body), ephemeral=True, makepath=True
            )
        except AlreadyExistsError as exc:
            current = await self.get_owner(ns, stream)
            if current is not None and current.session_id == self._zk.session_id:
                return
            holder = current.address if current else None
            raise LockOwnedError(f"{ns}/{stream} is served by {holder}", owner=holder) from exc

    async def get_owner(self, ns: str, stream: str) -> OwnerRecord | None:
        path = self._layout.owner(ns, stream)
        try:
            data, stat = await self._zk.get_with_stat(path)
        except NotFoundError:
            return None
        _v, body = serde.decode(data, OWNER_KIND, FORMAT_VERSION, path)
        return OwnerRecord(
            proxy_id=serde.field(body, "proxy_id", str, path),
            address=serde.field(body, "address", str, path),
            session_id=stat.ephemeral_owner,
        )

    async def release_owner(self, ns: str, stream: str) -> None:
        """Remove the record if this session holds it (someone else's stays)."""
        path = self._layout.owner(ns, stream)
        stat = await self._zk.exists(path)
        if stat is not None and stat.ephemeral_owner == self._zk.session_id:
            with contextlib.suppress(NotFoundError):  # expired meanwhile: goal reached
                await self._zk.delete(path, stat.version)
