"""SaslHandshake and SaslAuthenticate: SASL PLAIN with a Bookline token as password, and
SASL OAUTHBEARER carrying a Bookline token.

With auth on, a connection must authenticate before any API but ApiVersions and the
two SASL ones (KIP-43's order: ApiVersions, SaslHandshake v1 naming ``PLAIN`` or
``OAUTHBEARER``, then SaslAuthenticate). PLAIN's message is ``authzid NUL username NUL
password``: the password is a token (signed or static, as on HTTP), which must name the
principal given as username (an authzid, if any, must be the same). OAUTHBEARER's is
RFC 7628's client initial response ``n,a=authzid,^Aauth=Bearer <token>^A^A`` (the
authzid is optional, and must be the token's principal when given; other key=value
pairs, KIP-342's extensions, are ignored): the principal is the token's. Kafka's
OAUTHBEARER server answers a bad token with an error challenge and fails on the
client's next message; Bookline fails at once, as for PLAIN. A failure is answered with
SASL_AUTHENTICATION_FAILED and the connection closed, as Kafka's broker does; the
answer's ``session_lifetime_ms`` is the token's remaining life, after which the
connection must authenticate again (KIP-368) or is closed.
"""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING, Any, Final

from foundation.auth import SERVICE_PRINCIPAL
from foundation.auth import token_expiry as signed_expiry
from foundation.errors import BooklineError
from kafkaapi.protocol import errors as kerr

if TYPE_CHECKING:
    from kafkaapi.context import KafkaServing, Session
    from kafkaapi.protocol.messages import Request

__all__ = ["MECHANISMS", "SaslFailedError", "sasl_authenticate", "sasl_handshake"]

MECHANISMS: Final = ("PLAIN", "OAUTHBEARER")
_FAILED: Final = kerr.code_named("SASL_AUTHENTICATION_FAILED")
_ILLEGAL: Final = kerr.code_named("ILLEGAL_SASL_STATE")
_UNSUPPORTED: Final = kerr.code_named("UNSUPPORTED_SASL_MECHANISM")
# RFC 7628's gs2-header: no channel binding ("n" or "y"), an optional authzid (a=...).
_GS2: Final = re.compile(r"[ny],(?:a=([^,]*))?,")


class SaslFailedError(Exception):
    """Authentication failed: the answer is sent, then the connection is closed."""

    def __init__(self, answer: dict[str, Any]) -> None:
        super().__init__(answer.get("error_message") or "SASL authentication failed")
        self.answer = answer


async def sasl_handshake(
    serving: KafkaServing, session: Session, request: Request
) -> dict[str, Any]:
    mechanism = request.body["mechanism"]
    if mechanism not in MECHANISMS:
        return {"error_code": _UNSUPPORTED.code, "mechanisms": list(MECHANISMS)}
    session.mechanism = mechanism
    return {"error_code": 0, "mechanisms": list(MECHANISMS)}


async def sasl_authenticate(
    serving: KafkaServing, session: Session, request: Request
) -> dict[str, Any]:
    if session.mechanism is None:
        raise SaslFailedError(_failure(_ILLEGAL, "SaslAuthenticate before SaslHandshake"))
    claimed, token = _credentials(session.mechanism, bytes(request.body["auth_bytes"]))
    authority = serving.authority
    if authority is None:  # auth off: any credentials pass, the principal is not checked
        session.principal = claimed or "ANONYMOUS"
        return {"error_code": 0, "auth_bytes": b"", "session_lifetime_ms": 0}
    now = time.time()
    try:
        principal = authority.authenticate(token, now)
    except BooklineError as exc:
        raise SaslFailedError(_failure(_FAILED, f"authentication failed: {exc.message}")) from exc
    if (claimed is not None and principal != claimed) or principal == SERVICE_PRINCIPAL:
        # The services' own token is no key to tenants' data (as on HTTP).
        raise SaslFailedError(_failure(_FAILED, "the token does not name this user"))
    session.principal = principal
    session.mechanism = None  # a re-authentication starts with a handshake again
    expires = signed_expiry(token)
    session.expires_at = expires
    lifetime_ms = 0 if expires is None else max(1, int((expires - now) * 1000))
    return {"error_code": 0, "auth_bytes": b"", "session_lifetime_ms": lifetime_ms}


def _credentials(mechanism: str, message: bytes) -> tuple[str | None, str]:
    """(the user the client claims to be, if it says, and its token)."""
    if mechanism == "OAUTHBEARER":
        return _oauthbearer(message)
    return _plain(message)


def _failure(code: kerr.KafkaCode, message: str) -> dict[str, Any]:
    return {"error_code": code.code, "error_message": message, "auth_bytes": b""}


def _plain(message: bytes) -> tuple[str, str]:
    """(username, password) of a PLAIN message (RFC 4616)."""
    parts = bytes(message).split(b"\x00")
    if len(parts) != 3:
        raise SaslFailedError(_failure(_FAILED, "malformed SASL/PLAIN message"))
    authzid, user, password = (p.decode("utf-8", "replace") for p in parts)
    if not user or (authzid and authzid != user):
        raise SaslFailedError(_failure(_FAILED, "SASL/PLAIN: authzid must be empty or the user"))
    return user, password


def _oauthbearer(message: bytes) -> tuple[str | None, str]:
    """(authzid or None, token) of an OAUTHBEARER client initial response (RFC 7628
    section 3.1): a GS2 header without channel binding, then ``^A``-separated
    key=value pairs, ``auth`` holding ``Bearer <token>``, then ``^A^A``."""
    try:
        text = message.decode("ascii")
    except UnicodeDecodeError:
        raise SaslFailedError(_failure(_FAILED, "SASL/OAUTHBEARER: not ASCII")) from None
    header, sep, rest = text.partition("\x01")
    if not sep or not rest.endswith("\x01\x01"):
        raise SaslFailedError(_failure(_FAILED, "SASL/OAUTHBEARER: malformed message"))
    gs2 = _GS2.fullmatch(header)
    if gs2 is None:
        raise SaslFailedError(_failure(_FAILED, "SASL/OAUTHBEARER: bad GS2 header"))
    pairs = {key: value for key, _, value in (kv.partition("=") for kv in rest[:-2].split("\x01"))}
    scheme, _, token = pairs.get("auth", "").partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise SaslFailedError(_failure(_FAILED, "SASL/OAUTHBEARER: no auth=Bearer <token>"))
    return gs2.group(1) or None, token.strip()
