"""Ledger keys: one per ledger, never one shared default, and never in a world-readable
znode when the cluster has a ledger secret.

Every new ledger gets its own key (issue 15). With a *cluster ledger secret* -- a file of
at least :data:`SECRET_BYTES_MIN` bytes that only the services and core-library users can
read (``ledger.secret_file``, mode 0600) -- the key is derived::

    key = HMAC-SHA256(secret, "bookline-ledger-key" 0x00 || ledger id (u64) || salt)

with a random :data:`SALT_BYTES` salt kept in the ledger's metadata. ZooKeeper then
holds the salt and a one-way check value of the master key (``key_check``), neither of
which reveals the key, so a client that can read every znode still cannot read, fence
or write the ledger. Without a secret the key is :data:`KEY_BYTES` random bytes kept in
the metadata's ``password`` field: still one per ledger, guarded only by ZooKeeper ACLs
(``[metadata]`` digest credentials). The file may hold several secrets, one a line: the
first derives new ledgers' keys, each opens the ledgers made with it (rotation: put a new
secret first, drop the old line once no ledger made with it is left).

Ledgers made before per-ledger keys (no key check in their metadata) keep the password
they were created with (the ``password`` setting, ``bookline`` by default); opening one
still compares that setting with it.

:func:`ledger_key` is the one way every handle -- writer, reader, recovery, fencing,
autorecovery, scrub, the Spark connector, the proxies, the CLI -- obtains a ledger's key.
"""

from __future__ import annotations

import hmac
import os
import stat
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from bookie.identity import BookieIdentity
from foundation.errors import ConfigError, UnauthorizedError
from ledger.config import LedgerConfig
from ledger.digest import DigestManager
from metadata.ledger_metadata import LedgerMetadata, master_key, master_key_check

__all__ = [
    "KEY_BYTES",
    "SALT_BYTES",
    "SECRET_BYTES_MIN",
    "SECRET_FILE_ENV",
    "LedgerAccess",
    "NewLedgerKey",
    "bookie_identity",
    "check_legacy_password",
    "cluster_secret",
    "derive_key",
    "ledger_access",
    "ledger_key",
    "new_ledger_key",
    "read_secret",
    "write_secret",
]

# Names the secret file for processes whose settings have no [ledger] section.
SECRET_FILE_ENV: Final = "BOOKLINE_LEDGER_SECRET_FILE"
# Random salt per ledger (metadata ``key_salt``).
SALT_BYTES: Final = 16
# A random key of a ledger made without a cluster secret.
KEY_BYTES: Final = 32
# A shorter secret is guessable; refuse it rather than derive weak keys from it.
SECRET_BYTES_MIN: Final = 16
_DERIVE_PREFIX: Final = b"bookline-ledger-key\x00"
_LEDGER_ID = struct.Struct(">Q")


@dataclass(frozen=True, slots=True)
class NewLedgerKey:
    """A new ledger's key and what its metadata keeps of it."""

    key: bytes
    password: bytes  # metadata ``password``: the random key, or empty when derived
    key_salt: bytes
    key_check: bytes


def derive_key(secret: bytes, ledger_id: int, salt: bytes) -> bytes:
    """The key of ledger ``ledger_id`` whose metadata holds ``salt``."""
    return hmac.new(secret, _DERIVE_PREFIX + _LEDGER_ID.pack(ledger_id) + salt, "sha256").digest()


def _lines(secret: bytes) -> list[bytes]:
    """The secrets a secret file's content holds, one a line (the first is current)."""
    return [line for line in secret.split(b"\n") if line]


def new_ledger_key(ledger_id: int, secret: bytes) -> NewLedgerKey:
    """A fresh key for a new ledger: derived from the first secret of ``secret`` (a
    secret file's content) with a random salt, or random when there is none."""
    secrets = _lines(secret)
    if secrets:
        salt = os.urandom(SALT_BYTES)
        key = derive_key(secrets[0], ledger_id, salt)
        return NewLedgerKey(key, b"", salt, master_key_check(master_key(key)))
    key = os.urandom(KEY_BYTES)
    return NewLedgerKey(key, key, b"", master_key_check(master_key(key)))


def ledger_key(meta: LedgerMetadata, secret: bytes) -> bytes:
    """The key of the ledger ``meta`` describes: derived from its salt and whichever
    secret of ``secret`` (a secret file's content, one a line) it was made with, or the
    key its metadata keeps (random keys and legacy passwords). UnauthorizedError when it
    is derived and there is no secret, or none is the one the ledger was made with (its
    key check differs)."""
    if not meta.key_salt:
        return meta.password
    secrets = _lines(secret)
    if not secrets:
        raise UnauthorizedError(
            f"ledger {meta.ledger_id}'s key derives from the cluster's ledger secret: "
            "set ledger.secret_file"
        )
    for candidate in secrets:
        key = derive_key(candidate, meta.ledger_id, meta.key_salt)
        if hmac.compare_digest(master_key_check(master_key(key)), meta.key_check):
            return key
    raise UnauthorizedError(
        f"ledger {meta.ledger_id}: the cluster ledger secret is not the one it was created with"
    )


@dataclass(frozen=True, slots=True)
class LedgerAccess:
    """What a handle needs of a ledger's key: the master key every request to a bookie
    carries, and the digest that packages and verifies its entries."""

    master_key: bytes
    digest: DigestManager


def ledger_access(meta: LedgerMetadata, secret: bytes) -> LedgerAccess:
    """:func:`ledger_key`, made into what handles use."""
    key = ledger_key(meta, secret)
    return LedgerAccess(master_key(key), DigestManager(meta.ledger_id, meta.digest_type, key))


def check_legacy_password(meta: LedgerMetadata, password: bytes | None) -> None:
    """Opening a legacy ledger (no key check) still compares the configured password
    with its own, as before per-ledger keys; other ledgers ignore ``password``."""
    if meta.key_check or password is None:
        return
    if not hmac.compare_digest(meta.password, password):
        raise UnauthorizedError(f"wrong password for ledger {meta.ledger_id}")


def cluster_secret(config: LedgerConfig) -> bytes:
    """The cluster's ledger secret for a process with ``config``: ``secret_file``, else
    the file ``$BOOKLINE_LEDGER_SECRET_FILE`` names (services whose settings carry no
    ``[ledger]`` section -- proxies, autorecovery, the CLI, Spark executors -- get it
    from their environment), else none (``b""``)."""
    path = config.secret_file or os.environ.get(SECRET_FILE_ENV, "")
    return read_secret(path) if path else b""


def bookie_identity(config: LedgerConfig) -> BookieIdentity | None:
    """What bookies must prove to a process with ``config`` (bookie/identity.py): their
    credential derived from the cluster's ledger secret; None without a secret."""
    if not config.verify_bookies:
        return None
    return BookieIdentity.from_secret(cluster_secret(config))


def read_secret(path: str) -> bytes:
    """The cluster ledger secrets in file ``path``, one a line (the first derives new
    ledgers' keys; every one opens the ledgers made with it: rotation), surrounding
    whitespace and empty lines dropped. ConfigError when others may read or write the
    file, or it holds no secret or a short one."""
    p = Path(path)
    try:
        mode = p.stat().st_mode
        lines = [line.strip() for line in p.read_bytes().splitlines() if line.strip()]
    except OSError as exc:
        raise ConfigError(f"ledger.secret_file {path}: {exc.strerror}") from exc
    if mode & (stat.S_IRWXO | stat.S_IWGRP):
        raise ConfigError(
            f"ledger.secret_file {path} has mode {stat.S_IMODE(mode):o}: others may read or "
            "write it (chmod 600)"
        )
    shortest = min((len(line) for line in lines), default=0)
    if shortest < SECRET_BYTES_MIN:
        raise ConfigError(
            f"ledger.secret_file {path} holds a secret of {shortest} bytes; each needs at "
            f"least {SECRET_BYTES_MIN}"
        )
    return b"\n".join(lines)


def write_secret(path: str) -> None:
    """Create a new random secret in ``path`` (mode 0600; it must not exist yet)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, os.urandom(32).hex().encode() + b"\n")
    finally:
        os.close(fd)
