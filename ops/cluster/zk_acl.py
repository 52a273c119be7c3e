"""The ZooKeeper side of a local cluster's credentials (:mod:`ops.cluster.local`).

A local cluster owns its ZooKeeper. Before any child starts, :func:`prepare_chroot`
creates the chroot the children connect under (``/local``) and, with digest
credentials (``DIR/auth/zk.digest``, auth on):

* the chroot and every znode below it get the digest ACL (that user, all rights;
  nobody else anything, reading included): the children create theirs with it too
  (``metadata.zk.kazoo_digest``);
* the server's root ``/`` admits the user to change it and the world only to read it,
  so nobody without the credentials can create top-level znodes or replace ``/``'s ACL.

A directory made before the credentials existed (or with ``--no-auth``) has znodes
with the open ACL (``world:anyone``, all rights): the walk restricts them, children
before parents, the chroot last -- so a chroot that already has the digest ACL alone
means the tree below it was done, and later starts skip the walk.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import NoNodeError
from kazoo.security import ACL, READ_ACL_UNSAFE

from foundation.tls import TlsConfig
from metadata.zk import kazoo_digest, kazoo_tls

__all__ = ["prepare_chroot"]

log = logging.getLogger(__name__)

# ZooKeeper of a local cluster has just started: the first session may take a moment.
CONNECT_TIMEOUT_S = 15.0


def prepare_chroot(
    hosts: str, chroot: str, *, tls: TlsConfig | None, digest_file: Path | None
) -> int:
    """Create ``chroot`` on ``hosts``; with ``digest_file`` lock it (module docstring).
    Returns how many znodes were given the digest ACL (0: none needed)."""
    digest = kazoo_digest(str(digest_file)) if digest_file else {}
    client = KazooClient(hosts=hosts, timeout=10, **kazoo_tls(tls), **digest)
    client.start(timeout=CONNECT_TIMEOUT_S)
    try:
        client.ensure_path(chroot)
        if not digest:
            return 0
        acl: list[ACL] = list(digest["default_acl"])
        client.set_acls("/", [*acl, *READ_ACL_UNSAFE])
        if client.get_acls(chroot)[0] == acl:
            return 0  # locked at an earlier start (the chroot is the walk's last step)
        done = _restrict_below(client, chroot, acl)
        log.info("gave %d znodes under %s the cluster's digest ACL", done, chroot)
        return done
    finally:
        client.stop()
        client.close()


def _restrict_below(client: Any, path: str, acl: list[ACL]) -> int:
    """Give ``path`` and everything below it ``acl``, children first (iterative: a deep
    tree must not hit Python's recursion limit)."""
    order: list[str] = []
    todo = [path]
    while todo:
        node = todo.pop()
        order.append(node)
        with contextlib.suppress(NoNodeError):  # an old session's ephemeral node expired
            todo.extend(f"{node.rstrip('/')}/{child}" for child in client.get_children(node))
    for node in reversed(order):  # every child before its parent
        with contextlib.suppress(NoNodeError):  # gone since: nothing left to protect
            client.set_acls(node, acl)
    return len(order)
