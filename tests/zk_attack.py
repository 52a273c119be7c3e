"""What an attacker who reaches ZooKeeper with no credentials can do to a cluster's
znodes: nothing. :func:`assert_locked` lists every znode (with the cluster's digest
credentials, when it has any) and, from a bare kazoo client, tries on each to read it,
create a child, change its data, replace its ACL and delete it: every try must be
refused with NoAuth. Used against ``bookline local``, ``bookline chaos``'s cluster and
a cluster started from the deploy kit's files."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import KazooException, NoAuthError
from kazoo.security import OPEN_ACL_UNSAFE

from foundation.tls import TlsConfig
from metadata.zk import kazoo_digest, kazoo_tls

# ZooKeeper's own subtree (quotas, config): not the cluster's.
ZK_OWN = "/zookeeper"


@contextmanager
def kazoo(
    hosts: str, digest_file: Path | None = None, tls: TlsConfig | None = None
) -> Iterator[Any]:
    """A started kazoo client on ``hosts`` (no chroot), with the digest credentials of
    ``digest_file`` or none at all (over TLS with ``tls``)."""
    credentials = kazoo_digest(str(digest_file)) if digest_file else {}
    client = KazooClient(hosts=hosts, timeout=10, **credentials, **kazoo_tls(tls))
    client.start(timeout=15)
    try:
        yield client
    finally:
        client.stop()
        client.close()


def every_znode(client: Any, top: str) -> list[str]:
    """``top`` and everything below it, parents first."""
    out: list[str] = []
    todo = [top]
    while todo:
        node = todo.pop()
        out.append(node)
        todo.extend(f"{node.rstrip('/')}/{c}" for c in client.get_children(node))
    return out


def _attempts(client: Any, node: str) -> dict[str, Callable[[], object]]:
    attempts: dict[str, Callable[[], object]] = {
        "create": lambda: client.create(f"{node.rstrip('/')}/intruder", b"x"),
        "set": lambda: client.set(node, b"overwritten"),
        "set_acls": lambda: client.set_acls(node, OPEN_ACL_UNSAFE),
    }
    if node != "/":  # the server's root is world-readable, nothing below it
        attempts["get"] = lambda: client.get(node)
        attempts["delete"] = lambda: client.delete(node)
    return attempts


def assert_locked(
    hosts: str,
    cluster_root: str,
    digest_file: Path | None,
    *,
    top: str = "/",
    tls: TlsConfig | None = None,
) -> list[str]:
    """Every znode from ``top`` down (ZooKeeper's own subtree aside) refuses a client
    with no credentials: no create, set, set-ACL or delete; no read below ``/``. Returns
    the znodes tried (the cluster's root among them, so the walk was not vacuous).
    ``tls``: dial ZooKeeper's TLS port with these settings (a stranger may well hold the
    CA's certificate: it is no secret)."""
    with kazoo(hosts, digest_file, tls) as owner:
        nodes = [n for n in every_znode(owner, top) if not n.startswith(ZK_OWN)]
    assert cluster_root in nodes, nodes
    let_in: list[str] = []
    with kazoo(hosts, None, tls) as stranger:
        for node in nodes:
            for what, attempt in _attempts(stranger, node).items():
                try:
                    attempt()
                except NoAuthError:
                    continue
                except KazooException as exc:  # refused, but not for want of rights
                    let_in.append(f"{what} {node}: {type(exc).__name__}")
                else:
                    let_in.append(f"{what} {node}: done")
    assert not let_in, f"{len(let_in)} of {len(nodes)} znodes let a stranger in: {let_in[:20]}"
    return nodes
