"""``cluster.json``: where a cluster is, as ``bookline local`` writes it. Read it here.

Schema (JSON object; readers ignore keys they don't know)::

    {"zk": "127.0.0.1:2181/local",            # connect string, chroot included
     "root": "/bookline",                      # cluster root inside it
     "write_proxies": [{"url": "http://..."}, ...],
     "read_proxies":  [{"url": "http://..."}, ...],
     "state": "running",                       # or "stopped" (+ "stopped_at")
     "token_file": "admin.token",              # optional: clients' token (relative to
                                               # this file's directory), auth on
     "ledger_secret_file": "auth/ledger.secret",  # optional: the cluster's ledger secret
                                               # (core-library users derive keys with it)
     "zk_digest_file": "auth/zk.digest",       # optional: ZooKeeper digest credentials
                                               # (0600 "user:password"); every znode of
                                               # the cluster admits that user alone
     "bookies": [{...}], "zookeeper": {...}, "dir": "..."}   # informational

Every failure is a :class:`~foundation.errors.ConfigError` that names the file and says
what is wrong (missing, a directory, not JSON, a key missing or of the wrong type, a
cluster that was stopped) with a hint, never a bare ``FileNotFoundError`` or
``JSONDecodeError``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from foundation.auth import read_token_file
from foundation.errors import ConfigError

__all__ = ["STOPPED", "ClusterFile", "read_cluster_file"]

_HINT = "is the cluster running? start one with `bookline local --dir DIR`"
_WRITER_HINT = "`bookline local --dir DIR` writes DIR/cluster.json"
# `state` of a cluster `bookline local` has stopped (absent or "running" otherwise).
STOPPED = "stopped"


@dataclass(frozen=True, slots=True)
class ClusterFile:
    path: str
    zk: str
    root: str
    write_urls: tuple[str, ...]
    read_urls: tuple[str, ...]
    raw: dict[str, Any]  # the whole document, for tools that show it
    token_file: str | None = None  # the token clients use, when the proxies want one
    # The cluster's ledger secret (ledger/keys.py), for core-library users; None: none.
    ledger_secret_file: str | None = None
    # ZooKeeper digest credentials (metadata.digest_file) for every ZooKeeper client
    # of the cluster; None: the cluster's znodes are not restricted.
    zk_digest_file: str | None = None

    def token(self) -> str | None:
        """The token of ``token_file`` (ConfigError naming it when unreadable)."""
        return read_token_file(self.token_file) if self.token_file else None


def _urls(doc: dict[str, Any], key: str, where: str) -> tuple[str, ...]:
    entries = doc.get(key, [])
    if not isinstance(entries, list):
        raise ConfigError(f"{where}: '{key}' must be a list")
    urls = []
    for entry in entries:
        url = entry.get("url") if isinstance(entry, dict) else None
        if not isinstance(url, str) or not url:
            raise ConfigError(f"{where}: every entry of '{key}' needs a 'url' string")
        urls.append(url)
    return tuple(urls)


def read_cluster_file(path: str | Path) -> ClusterFile:
    """The cluster ``path`` describes (a directory stands for its ``cluster.json``).
    A cluster ``bookline local`` stopped is an error that says so (its file is kept,
    marked ``"state": "stopped"``, so the next command knows what happened)."""
    if Path(path).is_dir() and (Path(path) / "cluster.json").is_file():
        path = Path(path) / "cluster.json"
    where = f"cluster file {path}"
    try:
        text = Path(path).read_text()
    except FileNotFoundError as exc:
        raise ConfigError(f"{where} does not exist; {_HINT}") from exc
    except IsADirectoryError as exc:
        raise ConfigError(f"{where} is a directory without a cluster.json; {_WRITER_HINT}") from exc
    except OSError as exc:
        raise ConfigError(f"{where} cannot be read: {exc.strerror}") from exc
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"{where} is not JSON ({exc.msg} at line {exc.lineno}); {_WRITER_HINT}"
        ) from exc
    if not isinstance(doc, dict):
        raise ConfigError(f"{where} must hold a JSON object; {_WRITER_HINT}")
    if doc.get("state") == STOPPED:
        since = doc.get("stopped_at", "")
        raise ConfigError(
            f"the cluster in {where} was stopped{' at ' + since if since else ''}; "
            f"start it again with `bookline local --dir {doc.get('dir') or 'DIR'}`"
        )
    for key in ("zk", "root"):
        if not isinstance(doc.get(key), str) or not doc[key]:
            raise ConfigError(f"{where}: '{key}' must be a non-empty string")
    return ClusterFile(
        path=str(path),
        zk=doc["zk"],
        root=doc["root"],
        write_urls=_urls(doc, "write_proxies", where),
        read_urls=_urls(doc, "read_proxies", where),
        raw=doc,
        token_file=_named_file(doc, "token_file", Path(path), where),
        ledger_secret_file=_named_file(doc, "ledger_secret_file", Path(path), where),
        zk_digest_file=_named_file(doc, "zk_digest_file", Path(path), where),
    )


def _named_file(doc: dict[str, Any], key: str, path: Path, where: str) -> str | None:
    name = doc.get(key)
    if name is None:
        return None
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{where}: '{key}' must be a non-empty string")
    return str(path.parent / name)  # an absolute name stays as it is
