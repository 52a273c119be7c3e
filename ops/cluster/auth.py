"""Credentials of a local cluster (``bookline local``, auth on by default).

Under ``DIR/auth/``: ``secret`` (the cluster secret, 0600, kept across restarts: tokens
signed before a restart stay valid), ``grants.toml`` (the principal ``admin`` is a
superuser; add principals and grants there; 0600) and ``admin.token`` (0600, a fresh
admin token at every start). ``cluster.json`` names the token file, never the secret,
so clients given the cluster file authenticate as admin.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from foundation.auth import generate_secret, load_secrets, sign_token, write_secret_file

__all__ = ["ADMIN_PRINCIPAL", "LocalAuth", "ensure_local_auth"]

ADMIN_PRINCIPAL: Final = "admin"
# A local cluster is a developer's: its admin token lasts a year, re-issued each start.
ADMIN_TOKEN_LIFETIME_S: Final = 365 * 24 * 3600
_GRANTS: Final = f"""\
# Grants of this local cluster (docs/security.md). Mint a token for a principal with
#   bookline auth token --secret-file {{dir}}/secret --principal NAME
superusers = ["{ADMIN_PRINCIPAL}"]

# [[grants]]
# principal = "alice"
# permission = "produce"   # produce | consume | admin
# kind = "stream"          # stream | topic | group | cluster
# prefix = "app-"
"""


@dataclass(frozen=True, slots=True)
class LocalAuth:
    """Where a local cluster's credentials are, and the admin token of this start."""

    secret_file: Path
    grants_file: Path
    token_file: Path
    token: str

    def proxy_args(self) -> list[str]:
        """The proxies' flags turning auth on with these files."""
        return [
            "--auth-enabled", "true",
            "--auth-secret-file", str(self.secret_file),
            "--auth-grants-file", str(self.grants_file),
        ]  # fmt: skip


def ensure_local_auth(directory: Path) -> LocalAuth:
    """Create (or keep) the secret and grants, and write a fresh admin token."""
    base = directory / "auth"
    base.mkdir(parents=True, exist_ok=True)
    os.chmod(base, 0o700)
    secret_file = base / "secret"
    if not secret_file.exists():
        write_secret_file(secret_file, generate_secret())
    secret = load_secrets(str(secret_file))[0]  # ConfigError when others may read it
    grants_file = base / "grants.toml"
    if not grants_file.exists():
        write_secret_file(grants_file, _GRANTS.format(dir=base).encode())
    # Who may do what is the owner's business only (made 0644 before: tighten those).
    os.chmod(grants_file, 0o600)
    token = sign_token(secret, ADMIN_PRINCIPAL, time.time() + ADMIN_TOKEN_LIFETIME_S)
    token_file = base / "admin.token"
    write_secret_file(token_file, token.encode("ascii"))
    return LocalAuth(secret_file, grants_file, token_file, token)
