"""A minimal Kafka listener shell: answers ApiVersions and Metadata from a fixed broker
list and a fixed topic table, over the codec in ``kafkaapi/protocol`` (issue 25's first
step; Produce, Fetch and the group APIs come with the serving core behind them).

One handler per API key, in a table. A connection reads frames with a bounded
:class:`FrameReader`, answers requests in order, and is closed on bytes the codec
refuses (as a Kafka broker closes it). ApiVersions at a version the table does not know
is answered, as Kafka does, with a v0 body carrying UNSUPPORTED_VERSION and the versions
this listener does speak, so the client can retry.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from kafkaapi.protocol import errors as kerr
from kafkaapi.protocol.apis_cluster import API_VERSIONS, METADATA
from kafkaapi.protocol.errors import KafkaProtocolError
from kafkaapi.protocol.frames import FRAME_BYTES_MAX, FrameReader, NeedData, frame
from kafkaapi.protocol.messages import (
    Request,
    UnsupportedVersionError,
    decode_request,
    encode_response,
)
from kafkaapi.protocol.schema import Api

__all__ = ["Broker", "KafkaListener"]

log = logging.getLogger(__name__)

# Bytes asked of the socket per read: bounds what one feed adds to the frame buffer.
_READ_BYTES: Final = 64 * 1024
# Kafka's "no authorized operations asked for" value in Metadata.
_NO_OPERATIONS: Final = -(1 << 31)


@dataclass(frozen=True, slots=True)
class Broker:
    """One Kafka broker as clients see it: a stable node id and where to connect."""

    node_id: int
    host: str
    port: int
    rack: str | None = None


Handler = Callable[[Request], Awaitable[dict[str, Any]]]


class KafkaListener:
    """Serves ApiVersions and Metadata. ``topics`` maps a topic to its partition count;
    every partition's leader is the first broker announced (a fixed answer until the
    serving core's ownership is behind it). The brokers are announced after
    :meth:`start`, which may pick the port."""

    def __init__(
        self,
        *,
        cluster_id: str,
        topics: Mapping[str, int] | None = None,
        frame_bytes_max: int = FRAME_BYTES_MAX,
    ) -> None:
        self._brokers: tuple[Broker, ...] = ()
        self._cluster_id = cluster_id
        self._topics = dict(topics or {})
        self._frame_bytes_max = frame_bytes_max
        self._handlers: dict[int, tuple[Api, Handler]] = {
            API_VERSIONS.key: (API_VERSIONS, self._api_versions),
            METADATA.key: (METADATA, self._metadata),
        }
        self._server: asyncio.Server | None = None
        # Open connections, closed by stop() (Python 3.12's wait_closed waits for them).
        self._connections: set[asyncio.StreamWriter] = set()

    async def start(self, host: str, port: int) -> int:
        """Listen; returns the bound port (``port`` 0 picks a free one)."""
        self._server = await asyncio.start_server(self._serve, host, port)
        bound: int = self._server.sockets[0].getsockname()[1]
        return bound

    def announce(self, brokers: Sequence[Broker]) -> None:
        """The brokers Metadata names (this one among them)."""
        if not brokers:
            raise ValueError("a Kafka listener needs at least one broker to announce")
        self._brokers = tuple(brokers)

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            for writer in list(self._connections):
                writer.close()
            await self._server.wait_closed()
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        frames = FrameReader(self._frame_bytes_max)
        peer = writer.get_extra_info("peername")
        self._connections.add(writer)
        try:
            while data := await reader.read(_READ_BYTES):
                frames.feed(data)
                while not isinstance(item := frames.next_frame(), NeedData):
                    writer.write(frame(await self._answer(item)))
                await writer.drain()
        except KafkaProtocolError as exc:
            log.warning("closing Kafka connection from %s: %s", peer, exc)
        except ConnectionError as exc:
            log.info("Kafka connection from %s broken: %s", peer, exc)
        finally:
            self._connections.discard(writer)
            writer.close()

    async def _answer(self, raw: bytes) -> bytes:
        try:
            request = decode_request(raw)
        except UnsupportedVersionError as exc:
            if exc.api_key != API_VERSIONS.key:
                raise
            body = {"error_code": kerr.UNSUPPORTED_VERSION.code, "api_keys": self._api_keys()}
            return encode_response(API_VERSIONS, 0, exc.correlation_id, body)
        entry = self._handlers.get(request.api.key)
        if entry is None or not _advertised(entry[0], request.version):
            raise KafkaProtocolError(
                kerr.INVALID_REQUEST, f"{request.api.name} v{request.version} is not served"
            )
        api, handler = entry
        body = await handler(request)
        return encode_response(api, request.version, request.correlation_id, body)

    def _api_keys(self) -> list[dict[str, int]]:
        return [
            {"api_key": api.key, "min_version": api.advertised[0], "max_version": api.advertised[1]}
            for api, _ in self._handlers.values()
        ]

    async def _api_versions(self, request: Request) -> dict[str, Any]:
        return {"error_code": 0, "api_keys": self._api_keys(), "throttle_time_ms": 0}

    async def _metadata(self, request: Request) -> dict[str, Any]:
        if not self._brokers:
            raise KafkaProtocolError(kerr.INVALID_REQUEST, "Metadata before brokers are announced")
        asked = request.body["topics"]
        if asked is None or (request.version == 0 and not asked):
            names = sorted(self._topics)  # null (v0: empty) asks for every topic
        else:
            names = [topic["name"] for topic in asked]
        return {
            "throttle_time_ms": 0,
            "brokers": [
                {"node_id": b.node_id, "host": b.host, "port": b.port, "rack": b.rack}
                for b in self._brokers
            ],
            "cluster_id": self._cluster_id,
            "controller_id": self._brokers[0].node_id,
            "topics": [self._topic_metadata(name) for name in names],
            "cluster_authorized_operations": _NO_OPERATIONS,
        }

    def _topic_metadata(self, name: str | None) -> dict[str, Any]:
        count = self._topics.get(name or "")
        if count is None:
            code = kerr.code_named("UNKNOWN_TOPIC_OR_PARTITION").code
            return {"error_code": code, "name": name, "partitions": []}
        leader = self._brokers[0].node_id
        return {
            "error_code": 0,
            "name": name,
            "is_internal": False,
            "partitions": [
                {
                    "error_code": 0,
                    "partition_index": index,
                    "leader_id": leader,
                    "leader_epoch": 0,
                    "replica_nodes": [leader],
                    "isr_nodes": [leader],
                    "offline_replicas": [],
                }
                for index in range(count)
            ],
            "topic_authorized_operations": _NO_OPERATIONS,
        }


def _advertised(api: Api, version: int) -> bool:
    return api.advertised[0] <= version <= api.advertised[1]
