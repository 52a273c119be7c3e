"""A cluster started from the deploy kit's own files, on loopback (issue 21, 11).

The credentials come from ``ops/deploy/make-credentials.sh``; ``bookline.toml``, the
systemd units' environment (``Environment=``, ``EnvironmentFile=``) and the instances'
environment files are the kit's, with only what loopback needs changed: the hosts'
names become 127.0.0.1, ports are free ones, /etc and /srv are under the test's
directory. ZooKeeper serves TLS only, as the kit's zoo.cfg says (started with
ops/cluster/zookeeper.py's TLS settings, the same ones). Three bookies, each with the identity
the script issued it, and a write proxy (which holds the ledger secret, so it checks
bookies' proofs) take writes over https with the admin token; a fourth bookie started
from the kit without its identity file registers but is in no ensemble (issue 21, 2).
Then a ZooKeeper client holding the CA (no secret) but not the digest credentials can
neither read nor create, change, re-ACL or delete any znode under the cluster's root.
"""

from __future__ import annotations

import asyncio
import functools
import os
import shutil
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from bookie.identity import BookieIdentity
from foundation.tls import TlsConfig
from ledger.keys import read_secret
from metadata.bookies import BookieInfo
from metadata.ledger_metadata import LedgerMetadata
from ops.cluster import procs
from ops.cluster.children import READY_MARKERS
from ops.cluster.zookeeper import ZooKeeperServer
from tests.test_deploy_kit import DEPLOY, ROOT, _env_file, _units, unit_environment
from tests.waiting import wait_until
from tests.zk_attack import assert_locked, every_znode, kazoo
from thinclient.proxy_client import ProxyClient

pytestmark = pytest.mark.integration

KIT_CREDENTIALS = "/etc/bookline/credentials"
KIT_HOSTS = "h1:2281,h2:2281,h3:2281"
READY_TIMEOUT_S = 90.0
CLUSTER_ROOT = "/bookline"
# Streams written, one new ledger each: were the unproven bookie placeable, it would be
# in one of these ensembles (3 of 4 bookies each) but with chance (1/4)^6.
STREAMS = 6
IDENTITY_ENV = "BOOKLINE_BOOKIE_IDENTITY_FILE"


def _make_credentials(base: Path) -> Path:
    """The kit's script, for a host answering as 127.0.0.1/localhost, installed as a
    host's /etc/bookline/credentials is (its own tls/HOST/* as tls/*)."""
    made = base / "made"
    env = {**os.environ, "BOOKLINE": f"{sys.executable} -m ops.cli", "PYTHONPATH": str(ROOT)}
    script = DEPLOY / "make-credentials.sh"
    subprocess.run([str(script), str(made), "local,127.0.0.1,localhost"], check=True,
                   env=env, cwd=ROOT, capture_output=True, timeout=120)  # fmt: skip
    creds = base / "etc" / "credentials"
    shutil.copytree(made, creds)
    for item in (made / "tls" / "local").iterdir():
        shutil.copy2(item, creds / "tls" / item.name)
    return creds


class KitCluster:
    """ZooKeeper (TLS), the kit's bookies 1-3 and write proxy 1, on loopback."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.creds = _make_credentials(base)
        self.tls = TlsConfig(
            enabled=True,
            cert_file=str(self.creds / "tls" / "node.pem"),
            key_file=str(self.creds / "tls" / "node-key.pem"),
            ca_file=str(self.creds / "tls" / "ca.pem"),
        )
        self.zk = ZooKeeperServer(base / "zookeeper", procs.free_port(), tls=self.tls)
        self.procs: list[tuple[str, subprocess.Popen[bytes], Path]] = []
        self.proxy_url = ""

    def _local(self, text: str, host: str = "shared") -> str:
        """A kit file's text with the hosts' paths and names made loopback ones (/srv
        of each instance apart: the kit's bookies 1-3 use the same paths on 3 hosts)."""
        return (
            text.replace(KIT_CREDENTIALS, str(self.creds))
            .replace("/srv/", f"{self.base}/{host}/srv/")
            .replace(KIT_HOSTS, f"127.0.0.1:{self.zk.port}")
        )

    def _environment(self, kind: str, index: int) -> dict[str, str]:
        unit = _units()[f"bookline-{kind}@.service"]
        env, env_files = unit_environment(unit)
        out = {k: v for k, v in os.environ.items() if not k.startswith("BOOKLINE_")}
        out["PYTHONPATH"] = str(ROOT)
        out.update({k: self._local(v) for k, v in env.items()})
        for name in env_files:
            if name.startswith(KIT_CREDENTIALS):
                out.update(_env_file(Path(self._local(name))))
            else:  # the instance's own file, from the kit
                out.update(_env_file(DEPLOY / "env" / Path(name.replace("%i", str(index))).name))
        prefix = f"BOOKLINE_{kind.upper()}_"
        port = procs.free_port()
        here = f"{kind}-{index}"
        out.update({k: self._local(v, here) for k, v in out.items() if k.startswith(prefix)})
        out[f"{prefix}HOST"] = "127.0.0.1"
        out[f"{prefix}PORT"] = str(port)
        if kind == "bookie":
            out[f"{prefix}METRICS_PORT"] = str(procs.free_port())
        else:
            out[f"{prefix}ADVERTISE_URL"] = self.proxy_url = f"https://127.0.0.1:{port}"
        return out

    def _spawn(self, kind: str, index: int, without: str = "") -> None:
        """The kit's instance ``index`` of ``kind``; ``without``: a variable of its
        environment left out."""
        toml = self.base / "etc" / "bookline.toml"
        log = self.base / f"{kind}-{index}.log"
        argv = [sys.executable, "-m", "ops.cli", kind, "--config", str(toml)]
        env = self._environment(kind, index)
        env.pop(without, None)
        proc = procs.spawn(argv, log_path=log, env=env, cwd=ROOT)
        self.procs.append((kind, proc, log))

    def start(self) -> None:
        self.zk.start()
        toml = self.base / "etc" / "bookline.toml"
        toml.write_text(self._local((DEPLOY / "bookline.toml").read_text()))
        for i in (1, 2, 3):
            self._spawn("bookie", i)
        self._wait_ready()
        self._spawn("writeproxy", 1)
        self._wait_ready()
        # bookie-4 as someone would start it who forgot (or never had) its identity.
        self._spawn("bookie", 4, without=IDENTITY_ENV)
        self._wait_ready()

    def registrations(self) -> dict[str, BookieInfo]:
        """Every bookie registered as writable, as ZooKeeper holds it."""
        with kazoo(f"127.0.0.1:{self.zk.port}", self.creds / "zk.digest", self.tls) as zk:
            where = f"{CLUSTER_ROOT}/bookies/available"
            return {b: BookieInfo.decode(zk.get(f"{where}/{b}")[0]) for b in zk.get_children(where)}

    def ensembles(self) -> list[tuple[str, ...]]:
        """The ensemble of every segment of every ledger."""
        out: list[tuple[str, ...]] = []
        with kazoo(f"127.0.0.1:{self.zk.port}", self.creds / "zk.digest", self.tls) as zk:
            for node in every_znode(zk, f"{CLUSTER_ROOT}/ledgers/L"):
                if node.rsplit("/", 1)[1].startswith("L") and node.count("/") == 7:
                    metadata = LedgerMetadata.decode(zk.get(node)[0], node)
                    out.extend(s.bookies for s in metadata.segments)
        return out

    def _wait_ready(self) -> None:
        for kind, proc, log in self.procs:
            wait_until(functools.partial(_ready, kind, proc, log), kind, timeout_s=READY_TIMEOUT_S)

    def restrict_parents(self) -> None:
        """What docs/deployment.md has the operator run once after the first start."""
        env = self._environment("writeproxy", 1)
        env.update({f"BOOKLINE_TLS_{k.upper()}": str(v) for k, v in (
            ("enabled", "true"), ("ca_file", self.tls.ca_file),
            ("cert_file", self.tls.cert_file), ("key_file", self.tls.key_file))})  # fmt: skip
        argv = ["zk", "restrict", "--zk", f"127.0.0.1:{self.zk.port}", "--root", CLUSTER_ROOT]
        done = subprocess.run(
            [sys.executable, "-m", "ops.cli", *argv, "--parents", "--json"],
            env=env, cwd=ROOT, capture_output=True, timeout=120, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr.decode()[-2000:]

    def stop(self) -> None:
        for _kind, proc, _log in reversed(self.procs):
            procs.stop(proc)
        self.zk.stop()


def _ready(kind: str, proc: subprocess.Popen[bytes], log: Path) -> bool:
    if proc.poll() is not None:
        raise AssertionError(f"{kind} exited: {log.read_text()[-3000:]}")
    return READY_MARKERS[kind] in log.read_bytes()


@pytest.fixture(scope="module")
def kit(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KitCluster]:
    cluster = KitCluster(tmp_path_factory.mktemp("kit"))
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


def test_a_cluster_from_the_kit_serves_its_token_over_tls_and_locks_zookeeper(
    kit: KitCluster,
) -> None:
    token = (kit.creds / "admin.token").read_text().strip()
    context = ssl.create_default_context(cafile=kit.tls.ca_file)

    async def write() -> None:
        async with ProxyClient(write_urls=[kit.proxy_url], ssl=context, token=token) as client:
            await client.write("kit-stream", b"acknowledged")
            for i in range(STREAMS):
                await client.write(f"kit-stream-{i}", b"acknowledged")

    asyncio.run(write())
    # Bookies 1-3 prove the identity make-credentials.sh issued them; bookie-4, started
    # without its file, registered too, yet the write proxy placed nothing on it.
    identity = BookieIdentity.from_secret(read_secret(str(kit.creds / "ledger.secret")))
    assert identity is not None
    registered = kit.registrations()
    assert set(registered) == {"bookie-1", "bookie-2", "bookie-3", "bookie-4"}
    for bookie_id, info in registered.items():
        proven = identity.registration_ok(bookie_id, info.address, info.proof)
        assert proven == (bookie_id != "bookie-4"), (bookie_id, info)
    ensembles = kit.ensembles()
    assert len(ensembles) >= STREAMS + 1, ensembles
    assert all("bookie-4" not in e for e in ensembles), ensembles
    kit.restrict_parents()  # docs/deployment.md: once, after the first start
    stranger_tls = TlsConfig(enabled=True, ca_file=kit.tls.ca_file)  # the CA is no secret
    nodes = assert_locked(
        f"127.0.0.1:{kit.zk.port}", CLUSTER_ROOT, kit.creds / "zk.digest", tls=stranger_tls
    )
    for part in ("/streams/default/kit-stream", "/ledgers/", "/bookies/available/",
                 "/proxies/", "/cookies/"):  # fmt: skip
        assert any(part in n for n in nodes), (part, nodes)
