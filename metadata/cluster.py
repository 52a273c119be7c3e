"""Cluster identity: the INSTANCEID znode (instance id + layout version) and base paths.

Init is idempotent and race-safe: the identity is a single znode created with
create-if-absent, so of two concurrent inits one creates it and both return its value.
"""

from __future__ import annotations

import logging
import time
import uuid
from dataclasses import dataclass

from foundation.errors import AlreadyExistsError, NotFoundError
from metadata import serde
from metadata.layout import LAYOUT_VERSION, Layout
from metadata.zk import ZkClient

log = logging.getLogger(__name__)

KIND = "cluster"
FORMAT_VERSION = 1


@dataclass(frozen=True, slots=True)
class ClusterInfo:
    instance_id: str  # uuid4 hex; bookie cookies must carry the same
    layout_version: int  # znode layout generation (metadata.layout.LAYOUT_VERSION)
    ctime_ms: int


def encode_cluster(info: ClusterInfo) -> bytes:
    body = {
        "instance_id": info.instance_id,
        "layout_version": info.layout_version,
        "ctime_ms": info.ctime_ms,
    }
    return serde.encode(KIND, FORMAT_VERSION, body)


def decode_cluster(data: bytes, where: str = "") -> ClusterInfo:
    _v, body = serde.decode(data, KIND, FORMAT_VERSION, where)
    return ClusterInfo(
        instance_id=serde.field(body, "instance_id", str, where),
        layout_version=serde.field(body, "layout_version", int, where),
        ctime_ms=serde.field(body, "ctime_ms", int, where),
    )


class ClusterStore:
    """Creates and reads the cluster identity."""

    def __init__(self, zk: ZkClient, layout: Layout) -> None:
        self._zk = zk
        self._layout = layout

    async def init(self) -> ClusterInfo:
        """Create the cluster if absent; return its identity (existing or new)."""
        for path in self._layout.base_paths():
            await self._zk.ensure_path(path)
        fresh = ClusterInfo(uuid.uuid4().hex, LAYOUT_VERSION, int(time.time() * 1000))
        try:
            await self._zk.create(self._layout.instance_id, encode_cluster(fresh))
        except AlreadyExistsError:
            return await self.read()
        log.info("initialised cluster %s at %s", fresh.instance_id, self._layout.root)
        return fresh

    async def read(self) -> ClusterInfo:
        """The cluster identity; NotFoundError if never initialised."""
        path = self._layout.instance_id
        try:
            data, _version = await self._zk.get(path)
        except NotFoundError as exc:
            raise NotFoundError(f"no cluster at {self._layout.root}: run cluster init") from exc
        info = decode_cluster(data, path)
        if info.layout_version > LAYOUT_VERSION:
            raise serde.MetadataFormatError(
                f"cluster at {self._layout.root} uses layout version {info.layout_version}; "
                f"this build knows up to {LAYOUT_VERSION}"
            )
        return info
