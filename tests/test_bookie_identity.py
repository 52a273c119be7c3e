"""Bookie identity (issue 21, defect 2): a process that registers itself as a bookie
without the credential the cluster issued is never placed in an ensemble and is never
sent a token, a ledger key or an entry -- only the HELLO whose proof it cannot give.

Before: a fake bookie in a rack of its own was put into every new ensemble and received
the services' token, ledger master keys and every payload in clear."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from bookie import protocol as p
from bookie.identity import BookieIdentity, credential, hello_proof
from foundation.config import MetadataConfig
from foundation.errors import ForbiddenError, UnauthenticatedError
from metadata.bookies import BookieInfo
from metadata.client import MetadataClient
from ops.cluster import procs

pytestmark = pytest.mark.integration

LEDGERS = 6
PAYLOAD = b"a payload only real bookies may see"


class FakeBookie(asyncio.Protocol):
    """Listens, records every byte, answers HELLO with a proof it cannot know."""

    received = bytearray()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.decoder = p.Decoder(responses=False)

    def data_received(self, data: bytes) -> None:
        FakeBookie.received += data
        self.decoder.feed(data)
        while (req := self.decoder.next_frame()) is not p.NEED_DATA:
            if isinstance(req, p.HelloRequest):
                forged = hello_proof(b"0" * 64, req.nonce, "evil-1", FAKE["address"])
                answer = p.HelloResponse(req.request_id, "evil-1", FAKE["address"], forged)
                self.transport.write(p.encode_response(answer))  # type: ignore[attr-defined]


FAKE: dict[str, str] = {}


def frames(data: bytes) -> list[object]:
    decoder = p.Decoder(responses=False)
    decoder.feed(data)
    out: list[object] = []
    while (frame := decoder.next_frame()) is not p.NEED_DATA:
        out.append(frame)
    return out


async def test_a_bookie_without_the_cluster_credential_gets_nothing(tmp_path: Path) -> None:
    from ops.cluster.local import CLUSTER_ROOT, LocalCluster
    from streams.namespace import Namespace

    cluster = LocalCluster(
        tmp_path / "local", bookies=3, write_proxies=0, read_proxies=0, auth=True
    )
    cluster.start()
    server = None
    # Two locks: a stranger cannot even register (ZooKeeper's ACL), and one who got
    # hold of the ZooKeeper password but not a bookie credential is still never used.
    stranger = MetadataClient(MetadataConfig(zk=cluster.zk_connect, root=CLUSTER_ROOT))
    md = MetadataClient(
        MetadataConfig(
            zk=cluster.zk_connect, root=CLUSTER_ROOT, digest_file=str(cluster.zk_digest_file)
        )
    )
    try:
        await stranger.connect()
        try:
            with pytest.raises(ForbiddenError):
                await stranger.bookies.register(BookieInfo("evil-0", "127.0.0.1:1", rack="/x"))
        finally:
            await stranger.close()
        port = procs.free_port()
        FAKE["address"] = f"127.0.0.1:{port}"
        server = await asyncio.get_running_loop().create_server(FakeBookie, "127.0.0.1", port)
        await md.connect()
        await md.bookies.register(BookieInfo("evil-1", FAKE["address"], rack="/evil-rack"))
        ns = await Namespace.from_cluster_file(cluster.dir / "cluster.json", "sec")
        try:
            ledgers = ns.context.ledgers
            for _ in range(LEDGERS):
                writer = await ledgers.create_ledger(ensemble_size=3, write_quorum=3, ack_quorum=2)
                await writer.add_entry(PAYLOAD)
                assert all("evil-1" not in s.bookies for s in writer.metadata.segments)
                await writer.close()
            # Dialled directly, it is dropped after HELLO: no AUTH, no request.
            with pytest.raises(UnauthenticatedError):
                await ns._pool.get(FAKE["address"]).info()
        finally:
            await ns.close()
        got = frames(bytes(FakeBookie.received))
        assert got and all(isinstance(f, p.HelloRequest) for f in got), got
        assert PAYLOAD not in FakeBookie.received
        assert cluster.auth is not None
        assert cluster.auth.token.encode() not in FakeBookie.received
    finally:
        if server is not None:
            server.close()
        await md.close()
        cluster.stop()


def test_a_proof_checks_out_only_for_its_bookie_address_and_nonce() -> None:
    secret = b"s" * 32
    identity = BookieIdentity((b"old-secret-line-16", secret))  # rotation: every line
    cred = credential(secret, "bookie-1")
    nonce = identity.nonce()
    proof = hello_proof(cred, nonce, "bookie-1", "127.0.0.1:3181")
    assert identity.hello_ok(nonce, "bookie-1", "127.0.0.1:3181", proof)
    assert not identity.hello_ok(nonce, "bookie-1", "127.0.0.1:9999", proof)
    assert not identity.hello_ok(nonce, "bookie-2", "127.0.0.1:3181", proof)
    assert not identity.hello_ok(identity.nonce(), "bookie-1", "127.0.0.1:3181", proof)
    other = BookieIdentity((b"another-secret-16b",))
    assert not other.hello_ok(nonce, "bookie-1", "127.0.0.1:3181", proof)
