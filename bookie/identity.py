"""Bookie identity: a bookie proves it belongs to the cluster before a client sends it a
token, a ledger key or an entry, and before placement puts it in an ensemble (issue 21:
any process could register a bookie and be sent all three).

The cluster issues each bookie a *credential* derived from the cluster's ledger secret
(``ledger.secret_file``, which every process that opens ledgers holds and bookies never
do)::

    credential = hex(HMAC-SHA256(ledger_secret, "bookline-bookie-credential" 0x00 || bookie_id))

kept by the bookie in a file of its own (``[bookie] identity_file``, mode 0600;
``bookline local`` writes one per bookie, ``bookline auth bookie-credential`` makes one
for a deployment). The hex text is the HMAC key of the two proofs below, so clients holding
the ledger secret can recompute it for any bookie id, and a bookie's credential says
nothing about another's or about the secret.

*HELLO* (op 11, see bookie/protocol/ops.py) is the connection's first request when the
client holds the ledger secret: the client sends a fresh 32-byte nonce, the bookie
answers its id, its registered address and::

    proof = HMAC-SHA256(credential, "bookline-bookie-hello-v1" 0x00 || nonce
                        || bookie_id || 0x00 || address)

The client checks the proof under every line of its secret file (rotation) and that
``address`` is the one it dialled (a proof relayed from another bookie names that
bookie's address), and only then sends AUTH and anything else. A bookie without a
credential answers HELLO UNAUTHENTICATED.

*Registration proof*: the bookie's registration (``bookies/available/<id>``) carries
``HMAC-SHA256(credential, "bookline-bookie-registration-v1" 0x00 || bookie_id || 0x00 ||
address)``, hex; placement (ledger/adapters.py) never picks a bookie whose registration
does not carry a valid one. A copied proof names the copied bookie's address, where its
copier does not listen.
"""

from __future__ import annotations

import hashlib
import hmac
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from foundation.auth import load_secrets, write_secret_file

__all__ = [
    "NONCE_BYTES",
    "BookieIdentity",
    "credential",
    "hello_proof",
    "load_credential",
    "registration_proof",
    "write_credential",
]

# The client's HELLO nonce: enough that a recorded answer never matches a new one.
NONCE_BYTES: Final = 32
_CREDENTIAL: Final = b"bookline-bookie-credential\x00"
_HELLO: Final = b"bookline-bookie-hello-v1\x00"
_REGISTRATION: Final = b"bookline-bookie-registration-v1\x00"


def credential(ledger_secret: bytes, bookie_id: str) -> bytes:
    """Bookie ``bookie_id``'s credential under one ledger secret (a line of the file)."""
    mac = hmac.new(ledger_secret, _CREDENTIAL + bookie_id.encode("utf-8"), hashlib.sha256)
    return mac.hexdigest().encode("ascii")


def hello_proof(cred: bytes, nonce: bytes, bookie_id: str, address: str) -> bytes:
    body = _HELLO + nonce + bookie_id.encode("utf-8") + b"\x00" + address.encode("utf-8")
    return hmac.new(cred, body, hashlib.sha256).digest()


def registration_proof(cred: bytes, bookie_id: str, address: str) -> str:
    body = _REGISTRATION + bookie_id.encode("utf-8") + b"\x00" + address.encode("utf-8")
    return hmac.new(cred, body, hashlib.sha256).hexdigest()


def load_credential(path: str) -> bytes:
    """A bookie's credential file (owner-only; ConfigError naming it otherwise)."""
    return load_secrets(path)[0]


def write_credential(path: str, ledger_secret: bytes, bookie_id: str) -> None:
    """Issue ``bookie_id`` its credential (mode 0600), replacing an older one."""
    if os.path.exists(path):
        os.unlink(path)
    write_secret_file(path, credential(ledger_secret, bookie_id) + b"\n")


@dataclass(frozen=True, slots=True)
class BookieIdentity:
    """What a client checks bookies' proofs with: the lines of the ledger secret file
    (each one, so bookies keep proving themselves while the secret is rotated)."""

    secrets: Sequence[bytes]

    @classmethod
    def from_secret(cls, secret: bytes) -> BookieIdentity | None:
        """From a ledger secret file's content; None without one (nothing to check
        with: bookies are then trusted as registered, see docs/security.md)."""
        lines = [line for line in secret.split(b"\n") if line]
        return cls(tuple(lines)) if lines else None

    def nonce(self) -> bytes:
        return os.urandom(NONCE_BYTES)

    def hello_ok(self, nonce: bytes, bookie_id: str, address: str, proof: bytes) -> bool:
        ok = False
        for secret in self.secrets:  # every line is tried: timing says nothing of which
            expected = hello_proof(credential(secret, bookie_id), nonce, bookie_id, address)
            ok |= hmac.compare_digest(expected, proof)
        return ok

    def registration_ok(self, bookie_id: str, address: str, proof: str) -> bool:
        ok = False
        for secret in self.secrets:
            expected = registration_proof(credential(secret, bookie_id), bookie_id, address)
            ok |= hmac.compare_digest(expected.encode(), proof.encode("utf-8", "replace"))
        return ok
