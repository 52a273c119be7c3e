"""What a local cluster (:mod:`ops.cluster.local`) keeps in its directory besides the children's
own data: ``ports.json`` (ports and bookie ids chosen once and kept, so a restart on
the same directory finds its data and cookies again), ``auth/ledger.secret``,
``auth/zk.digest`` (the ZooKeeper digest credentials), ``tls/`` (a CA and the services'
certificate) and ``cluster.json`` (written atomically; kept after a stop, marked
stopped).

Everything here is the owner's only: the directory is 0700 and every file this module
writes is 0600 (cluster.json names the credentials' files; a log may quote a stream's
name), so another user of the machine learns nothing from them.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import secrets
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from foundation.auth import write_secret_file
from foundation.cluster_file import STOPPED
from foundation.tls import CertPaths, issue, make_ca
from ledger.keys import write_secret
from ops.cluster import procs

# The ZooKeeper digest user of a local cluster; its password is random, made once.
ZK_DIGEST_USER = "bookline"


def make_private_dir(directory: Path) -> None:
    """``directory`` (and missing parents) made if need be, then mode 0700: it holds the
    cluster's credentials, logs and data, the owner's only."""
    directory.mkdir(parents=True, exist_ok=True)
    os.chmod(directory, 0o700)


def write_private(path: Path, text: str) -> None:
    """Write ``path`` atomically (a temporary file renamed over it), mode 0600 from the
    first byte on."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as fh:
        os.fchmod(fh.fileno(), 0o600)  # an older file of that name kept its mode
        fh.write(text)
    os.replace(tmp, path)


def kept_ports(directory: Path, keys: Sequence[str]) -> dict[str, int]:
    """``DIR/ports.json``'s ports, a free one added for each key it lacks."""
    path = directory / "ports.json"
    ports: dict[str, int] = {}
    if path.exists():
        ports = {k: int(v) for k, v in json.loads(path.read_text()).items()}
    for key in keys:
        if key not in ports:
            ports[key] = procs.free_port()
    write_private(path, json.dumps(ports, indent=2))
    return ports


def ensure_ledger_secret(directory: Path) -> Path:
    """``DIR/auth/ledger.secret`` (0600), made once and kept across restarts: every
    ledger's key derives from it (ledger/keys.py)."""
    path = directory / "auth" / "ledger.secret"
    if not path.exists():
        write_secret(str(path))
    return path


def ensure_zk_digest(directory: Path) -> Path:
    """``DIR/auth/zk.digest`` (0600, "user:password"), made once and kept across
    restarts: every process of the cluster authenticates its ZooKeeper session with it
    and every znode admits that user alone (metadata/zk.py, ops/cluster/zk_acl.py)."""
    make_private_dir(directory / "auth")
    path = directory / "auth" / "zk.digest"
    if not path.exists():
        password = secrets.token_hex(24)
        write_secret_file(path, f"{ZK_DIGEST_USER}:{password}".encode("ascii"))
    return path


def ensure_local_tls(directory: Path, hosts: Sequence[str]) -> CertPaths:
    """``DIR/tls/``: a CA and the services' certificate (for ``hosts``), made once and
    kept across restarts (clients trust ``ca.pem``; cluster.json names it)."""
    base = directory / "tls"
    cert = CertPaths(base / "services.pem", base / "services-key.pem", base / "ca.pem")
    if not all(p.exists() for p in (cert.cert_file, cert.key_file, cert.ca_file)):
        ca = make_ca(base / "ca", "Bookline local CA")
        issued = issue(ca, base, "services", hosts=hosts)
        (base / "ca.pem").write_bytes(ca.cert_file.read_bytes())
        cert = CertPaths(issued.cert_file, issued.key_file, base / "ca.pem")
    return cert


def now_iso() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def write_cluster_json(directory: Path, doc: dict[str, Any]) -> Path:
    """``DIR/cluster.json``, 0600: it names the credentials' files (never their content)."""
    path = directory / "cluster.json"
    write_private(path, json.dumps(doc, indent=2) + "\n")
    return path


# cluster.json's lists of children (each entry has an id, a pid and a state).
CHILD_LISTS: Final = ("zookeepers", "bookies", "autorecovery", "write_proxies", "read_proxies")


def mark_stopped(directory: Path) -> None:
    """Keep cluster.json, saying the cluster was stopped (and when): every child
    ``stopped`` and no pid anywhere, since a dead process's pid may already be another
    process's (a tool signalling it would hit that one)."""
    path = directory / "cluster.json"
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return  # never started far enough to write one
    if not isinstance(doc, dict):
        return
    doc.update(state=STOPPED, stopped_at=now_iso())
    doc.pop("pid", None)
    if isinstance(doc.get("zookeeper"), dict):
        doc["zookeeper"].pop("pid", None)
    for key in CHILD_LISTS:
        for child in doc.get(key, []):
            if isinstance(child, dict):
                child.pop("pid", None)
                child["state"] = STOPPED
    write_cluster_json(directory, doc)
