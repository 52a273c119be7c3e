"""Who is asking (tokens) and what they may do (grants). Pure: no I/O but file loading.

Tokens
------
A signed token names one principal and an expiry, HMAC-SHA256 over its first three
parts with a cluster secret::

    bl1.<principal, base64url without padding>.<expiry, unix seconds>.<signature, base64url>

``sign_token`` makes one; ``verify_token`` checks it against *several* secrets (the
first signs, every one verifies: rotation adds a new secret first, re-issues tokens,
then drops the old one). The signature is compared with ``hmac.compare_digest``. Every
refusal is an :class:`~foundation.errors.UnauthenticatedError` whose message never
repeats the token.

A static token file is the alternative for clients that cannot be re-issued tokens:
per principal the SHA-256 (hex) of an opaque token, so the file itself grants nothing.

Grants
------
Per principal a list of ``(permission, kind, prefix)``: permission in ``produce``,
``consume``, ``admin`` (admin implies the other two), kind in ``stream``, ``topic``,
``group``, ``cluster``, and a name prefix (``""`` matches every name). Superusers may do
everything. :data:`SERVICE_PRINCIPAL`, the cluster's own services, may administer the
cluster (the bookies' inventory requests) and nothing of a tenant's: no stream, topic or
group (least privilege; the proxies refuse it on every route that is not open).

Files (TOML, or JSON when the name ends in ``.json``)::

    # grants file
    superusers = ["ops"]
    [[grants]]
    principal = "alice"
    permission = "produce"      # produce | consume | admin
    kind = "stream"             # stream | topic | group | cluster
    prefix = "app-"

    # tokens file (static tokens)
    [tokens]
    bob = "<sha256 hex of bob's token>"

The secret file holds one secret per line (the first signs); it must be readable by
its owner only, or it is refused with a ConfigError naming it.
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import hmac
import json
import os
import re
import secrets as _secrets
import stat
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final, Literal, get_args

from foundation.errors import ConfigError, ForbiddenError, UnauthenticatedError

__all__ = [
    "SERVICE_PRINCIPAL",
    "TOKEN_ENV",
    "TOKEN_VERSION",
    "AuthConfig",
    "Authenticator",
    "Authority",
    "Grant",
    "Grants",
    "Kind",
    "Permission",
    "bearer",
    "env_token",
    "generate_secret",
    "hash_static_token",
    "load_authority",
    "load_grants",
    "load_secrets",
    "load_static_tokens",
    "read_token_file",
    "sees_detail",
    "sign_token",
    "token_expiry",
    "verify_token",
    "write_secret_file",
]

Permission = Literal["produce", "consume", "admin"]
Kind = Literal["stream", "topic", "group", "cluster"]
PERMISSIONS: Final[tuple[str, ...]] = get_args(Permission)
KINDS: Final[tuple[str, ...]] = get_args(Kind)

TOKEN_VERSION: Final = "bl1"
# Where clients look for a token when none is given.
TOKEN_ENV: Final = "BOOKLINE_TOKEN"
# The principal the cluster's own services use among themselves (to the bookies, for
# another service's /health); only a holder of the secret can sign for it. It may do
# what services need of each other and nothing of a tenant's (Grants.allows).
SERVICE_PRINCIPAL: Final = "bookline-service"
# Principals are names in logs and grants, not data: short and printable.
PRINCIPAL_CHARS_MAX: Final = 128
# A token longer than this is garbage; refuse it before decoding anything.
TOKEN_CHARS_MAX: Final = 1024
# 32 random bytes: the HMAC-SHA256 key size; shorter secrets are refused.
SECRET_BYTES_MIN: Final = 16
_SECRET_BYTES: Final = 32
# An expiry is ASCII digits only: str.isdigit() also takes Arabic-Indic, fullwidth and
# superscript digits, which int() reads (or not) and ASCII encoding refuses.
_EXPIRY: Final = re.compile(r"[0-9]{1,20}")


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _check_principal(principal: str) -> str:
    if not principal or len(principal) > PRINCIPAL_CHARS_MAX:
        raise ValueError(f"a principal has 1..{PRINCIPAL_CHARS_MAX} characters")
    if not principal.isprintable() or any(ch.isspace() for ch in principal):
        raise ValueError("a principal has printable characters and no whitespace")
    return principal


def _signature(secret: bytes, payload: str) -> bytes:
    return hmac.new(secret, payload.encode("ascii"), hashlib.sha256).digest()


def sign_token(secret: bytes, principal: str, expires_at: float) -> str:
    """A token for ``principal`` valid until ``expires_at`` (unix seconds)."""
    if len(secret) < SECRET_BYTES_MIN:
        raise ValueError(f"a secret has at least {SECRET_BYTES_MIN} bytes")
    payload = f"{TOKEN_VERSION}.{_b64(_check_principal(principal).encode())}.{int(expires_at)}"
    return f"{payload}.{_b64(_signature(secret, payload))}"


def _parse(token: str) -> tuple[str, str, int, bytes]:
    """(signed payload, principal, expiry, signature) or UnauthenticatedError; any
    malformed part (non-ASCII anywhere, an expiry that is not ASCII digits, bad base64,
    a principal that is not UTF-8) is refused here, never an exception of another kind."""
    ok = len(token) <= TOKEN_CHARS_MAX and token.isascii()
    parts = token.split(".") if ok else []
    if len(parts) != 4 or parts[0] != TOKEN_VERSION or not _EXPIRY.fullmatch(parts[2]):
        raise UnauthenticatedError("malformed token")
    try:
        principal = _unb64(parts[1]).decode("utf-8")
        signature = _unb64(parts[3])
    except (ValueError, UnicodeDecodeError) as exc:
        raise UnauthenticatedError("malformed token") from exc
    return ".".join(parts[:3]), principal, int(parts[2]), signature


def verify_token(secrets: Sequence[bytes], token: str, now: float) -> str:
    """The principal a signed token names, if one of ``secrets`` signed it and it has
    not expired; UnauthenticatedError otherwise (the message never repeats the token)."""
    payload, principal, expires_at, signature = _parse(token)
    matched = False
    for secret in secrets:  # every secret is tried: timing says nothing of which matched
        matched |= hmac.compare_digest(_signature(secret, payload), signature)
    if not matched:
        raise UnauthenticatedError("token signature does not check out")
    if expires_at <= now:
        raise UnauthenticatedError(f"token of {principal!r} expired")
    try:
        return _check_principal(principal)
    except ValueError as exc:
        raise UnauthenticatedError("malformed token") from exc


def token_expiry(token: str) -> float | None:
    """When a signed token says it expires (unix seconds), unverified: what a client
    renews by and a server holds a connection to after verifying it; None for a static
    or malformed token."""
    if not token.startswith(f"{TOKEN_VERSION}."):
        return None
    try:
        return float(_parse(token)[2])
    except UnauthenticatedError:
        return None


def env_token() -> str | None:
    """The token in ``$BOOKLINE_TOKEN`` (clients' fallback), or None."""
    return os.environ.get(TOKEN_ENV, "").strip() or None


def read_token_file(path: str | Path) -> str:
    """The token a token file holds (``bookline local`` writes one, mode 0600)."""
    try:
        token = Path(path).read_text().strip()
    except OSError as exc:
        raise ConfigError(f"cannot read token file {path}: {exc.strerror}") from exc
    if not token:
        raise ConfigError(f"token file {path} is empty")
    return token


def hash_static_token(token: str) -> str:
    """What a tokens file stores for a static token: its SHA-256, hex."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def generate_secret() -> bytes:
    """A fresh cluster secret (printable, so a secret file stays a text file)."""
    return _secrets.token_urlsafe(_SECRET_BYTES).encode("ascii")


@dataclasses.dataclass(frozen=True, slots=True)
class Authenticator:
    """Turns a presented token into a principal: signed tokens, then static ones."""

    secrets: tuple[bytes, ...] = ()
    # principal -> SHA-256 hex of its static token
    static_tokens: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def principal(self, token: str, now: float) -> str:
        if not token.isascii() or not token.isprintable():  # tokens are printable ASCII
            raise UnauthenticatedError("malformed token")
        if token.startswith(f"{TOKEN_VERSION}.") and self.secrets:
            return verify_token(self.secrets, token, now)
        if len(token) <= TOKEN_CHARS_MAX and self.static_tokens:
            digest = hash_static_token(token)
            found = ""
            for principal, stored in self.static_tokens.items():
                if hmac.compare_digest(stored, digest):
                    found = principal
            if found:
                return found
        raise UnauthenticatedError("token not recognised")


@dataclasses.dataclass(frozen=True, slots=True)
class Grant:
    """May ``permission`` on names of ``kind`` starting with ``prefix``."""

    permission: Permission
    kind: Kind
    prefix: str = ""

    def allows(self, permission: str, kind: str, name: str) -> bool:
        if self.kind != kind or not name.startswith(self.prefix):
            return False
        return self.permission in (permission, "admin")


@dataclasses.dataclass(frozen=True, slots=True)
class Grants:
    """Every principal's grants; unknown principals may do nothing."""

    by_principal: Mapping[str, tuple[Grant, ...]] = dataclasses.field(default_factory=dict)
    superusers: frozenset[str] = frozenset()

    def allows(self, principal: str, permission: str, kind: str, name: str) -> bool:
        if principal == SERVICE_PRINCIPAL:  # the services' own: the cluster, no tenant's
            return kind == "cluster"
        if principal in self.superusers:
            return True
        grants = self.by_principal.get(principal, ())
        return any(grant.allows(permission, kind, name) for grant in grants)

    def authorize(self, principal: str, permission: str, kind: str, name: str) -> None:
        """Return if allowed; ForbiddenError naming what was refused otherwise."""
        if not self.allows(principal, permission, kind, name):
            what = f"{kind} {name!r}" if kind != "cluster" else "the cluster"
            raise ForbiddenError(f"{principal!r} may not {permission} on {what}")


@dataclasses.dataclass(frozen=True, slots=True)
class AuthConfig:
    """Authentication and authorization of a service's API (its ``[auth]`` section)."""

    # Refuse requests without a valid token, and check grants. Off for library use;
    # `bookline local` turns it on.
    enabled: bool = False
    # File of cluster secrets, one per line, the first signing; owner-only (0600).
    secret_file: str = ""
    # TOML/JSON file of grants and superusers; without one only superusers and the
    # service principal may do anything.
    grants_file: str = ""
    # Optional TOML/JSON file of static tokens (SHA-256 hex per principal).
    tokens_file: str = ""

    def __post_init__(self) -> None:
        if self.enabled and not (self.secret_file or self.tokens_file):
            raise ConfigError(
                "auth enabled needs a secret file or a tokens file (auth secret_file/tokens_file)"
            )

    @classmethod
    def of(cls, settings: Any) -> AuthConfig:
        """The ``auth_enabled``/``auth_secret_file``/``auth_grants_file``/
        ``auth_tokens_file`` settings a service's config section carries (bookie,
        proxies, autorecovery), as one :class:`AuthConfig`."""
        return cls(
            enabled=settings.auth_enabled,
            secret_file=settings.auth_secret_file,
            grants_file=settings.auth_grants_file,
            tokens_file=settings.auth_tokens_file,
        )


@dataclasses.dataclass(frozen=True, slots=True)
class Authority:
    """A service's whole auth policy: who is asking, and may they."""

    authenticator: Authenticator
    grants: Grants

    def authenticate(self, token: str | None, now: float) -> str:
        if not token:
            raise UnauthenticatedError("a token is required (Authorization: Bearer <token>)")
        return self.authenticator.principal(token, now)

    def service_token(self, now: float, lifetime_s: float = 3600.0) -> str:
        """A token for the cluster's own calls (needs a signing secret)."""
        if not self.authenticator.secrets:
            raise ConfigError("service tokens need auth.secret_file")
        return sign_token(self.authenticator.secrets[0], SERVICE_PRINCIPAL, now + lifetime_s)


def bearer(authorization: str) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header's value, or None."""
    scheme, _sep, value = authorization.partition(" ")
    if scheme.lower() != "bearer":
        return None
    return value.strip() or None


def sees_detail(authority: Authority | None, token: str | None, now: float) -> bool:
    """Whether a service's open ``/health`` and ``/metrics`` may show tenants' names
    (log lines, per-group figures) to a caller presenting ``token``: auth off (no
    authority), or a valid token allowed ``consume`` on the cluster (an admin, the
    services' own principal, a scraper granted just that)."""
    if authority is None:
        return True
    if token is None:
        return False
    try:
        principal = authority.authenticate(token, now)
    except UnauthenticatedError:
        return False
    return authority.grants.allows(principal, "consume", "cluster", "")


def _read_private(path: str, what: str) -> bytes:
    """The bytes of a file only its owner may read; ConfigError naming it otherwise."""
    try:
        mode = os.stat(path).st_mode
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise ConfigError(
                f"{what} {path} is readable by others (mode {stat.S_IMODE(mode):04o}); "
                f"run: chmod 600 {path}"
            )
        return Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc.strerror}") from exc


def load_secrets(path: str) -> tuple[bytes, ...]:
    """The secrets of a secret file, first (signing) first."""
    lines = [line.strip() for line in _read_private(path, "secret file").splitlines()]
    found = tuple(line for line in lines if line and not line.startswith(b"#"))
    if not found:
        raise ConfigError(f"secret file {path} holds no secret")
    if any(len(secret) < SECRET_BYTES_MIN for secret in found):
        raise ConfigError(f"secret file {path}: each secret has at least {SECRET_BYTES_MIN} bytes")
    return found


def write_secret_file(path: str | Path, secret: bytes) -> None:
    """Create a secret file readable by its owner only (never briefly wider)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        os.fchmod(fh.fileno(), 0o600)
        fh.write(secret + b"\n")


def _load_table(path: str, what: str) -> dict[str, Any]:
    try:
        raw = Path(path).read_bytes()
        data = json.loads(raw) if path.endswith(".json") else tomllib.loads(raw.decode())
    except OSError as exc:
        raise ConfigError(f"cannot read {what} {path}: {exc.strerror}") from exc
    except (ValueError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"{what} {path} is not valid: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{what} {path} must hold a table")
    return data


def _grant(path: str, index: int, entry: object) -> tuple[str, Grant]:
    where = f"grants file {path}, grant #{index + 1}"
    if not isinstance(entry, dict):
        raise ConfigError(f"{where} must be a table")
    unknown = set(entry) - {"principal", "permission", "kind", "prefix"}
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {sorted(unknown)}")
    principal, permission = entry.get("principal"), entry.get("permission")
    kind, prefix = entry.get("kind"), entry.get("prefix", "")
    if not isinstance(principal, str) or not principal:
        raise ConfigError(f"{where}: principal must be a non-empty string")
    if permission not in PERMISSIONS:
        raise ConfigError(f"{where}: permission must be one of {', '.join(PERMISSIONS)}")
    if kind not in KINDS:
        raise ConfigError(f"{where}: kind must be one of {', '.join(KINDS)}")
    if not isinstance(prefix, str):
        raise ConfigError(f"{where}: prefix must be a string")
    return principal, Grant(permission, kind, prefix)


def load_grants(path: str) -> Grants:
    """Parse a grants file (format in the module docstring)."""
    data = _load_table(path, "grants file")
    unknown = set(data) - {"superusers", "grants"}
    if unknown:
        raise ConfigError(f"grants file {path}: unknown key(s) {sorted(unknown)}")
    supers = data.get("superusers", [])
    entries = data.get("grants", [])
    if not isinstance(supers, list) or not all(isinstance(s, str) for s in supers):
        raise ConfigError(f"grants file {path}: superusers must be a list of names")
    if not isinstance(entries, list):
        raise ConfigError(f"grants file {path}: grants must be a list of tables")
    by_principal: dict[str, list[Grant]] = {}
    for index, entry in enumerate(entries):
        principal, grant = _grant(path, index, entry)
        by_principal.setdefault(principal, []).append(grant)
    return Grants({p: tuple(g) for p, g in by_principal.items()}, frozenset(supers))


def load_static_tokens(path: str) -> dict[str, str]:
    """principal -> SHA-256 hex, from a tokens file."""
    table = _load_table(path, "tokens file").get("tokens")
    if not isinstance(table, dict) or not all(
        isinstance(v, str) and len(v) == 64 for v in table.values()
    ):
        raise ConfigError(f"tokens file {path}: [tokens] maps principals to SHA-256 hex")
    return {str(k): str(v).lower() for k, v in table.items()}


def load_authority(config: AuthConfig) -> Authority | None:
    """The policy ``config`` describes, or None when auth is off."""
    if not config.enabled:
        return None
    authenticator = Authenticator(
        load_secrets(config.secret_file) if config.secret_file else (),
        load_static_tokens(config.tokens_file) if config.tokens_file else {},
    )
    grants = load_grants(config.grants_file) if config.grants_file else Grants()
    return Authority(authenticator, grants)
