"""Authentication and authorization of the proxies' HTTP and WebSocket APIs.

One aiohttp middleware (:func:`auth_middleware`) runs before every handler of a proxy
whose ``auth_enabled`` is set:

1. the route's rule (:data:`ROUTE_RULES`, keyed by method and route pattern) says what
   it needs; a route without a rule is refused (fail closed), and
   :func:`check_rules` makes a proxy with such a route fail at start;
2. open routes (``/health``, ``/metrics``, ``/openapi.json``, the dashboard's static
   files) pass: probes and scrapers carry no credentials. Without a token ``/health``
   and ``/metrics`` say only whether the service is up and how it performs, nothing of
   tenants' data; a token allowed ``consume`` on the cluster (admins, the services'
   own principal) sees the detail (:func:`sees_detail`);
3. otherwise the token -- ``Authorization: Bearer <token>``; on the WebSocket tail's
   real upgrade (and nowhere else) also the ``token`` query parameter, since browsers
   cannot set headers there -- names the principal (401 UNAUTHENTICATED and
   ``WWW-Authenticate: Bearer`` when it is missing or does not check out), whose grants
   must allow the route's permission on the name in the path (403 FORBIDDEN). The
   services' own principal (:data:`~foundation.auth.SERVICE_PRINCIPAL`) gets 403 on
   every such route: the cluster's services never call them, so its token is no key
   to tenants' data.

Names a route carries in its body (create stream/topic, a group's topics on join,
commit and reset) are checked by the handler with :func:`require`, which is a no-op
when auth is off. A connection is marked authenticated (:func:`httpapi.strict.
mark_authenticated`) by its first request whose token checks out, which lifts the short
deadline of connections that have not shown one; a WebSocket's token expiry is kept on
the request (:func:`token_expiry`) so the tail can end at it.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final

from aiohttp import hdrs, web
from aiohttp.typedefs import Middleware

from foundation.auth import (
    SERVICE_PRINCIPAL,
    AuthConfig,
    Authority,
    bearer,
    env_token,
    load_authority,
)
from foundation.auth import sees_detail as _sees_detail
from foundation.auth import token_expiry as _signed_expiry
from foundation.errors import ConfigError, ForbiddenError
from httpapi import strict

__all__ = [
    "ROUTE_RULES",
    "Rule",
    "auth_middleware",
    "auth_middlewares",
    "bearer_token",
    "check_rules",
    "principal_of",
    "require",
    "sees_detail",
    "service_token_source",
    "token_expiry",
]

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

_PRINCIPAL: Final = "bookline.principal"  # request key of who asked
_AUTHORITY: Final = "bookline.authority"  # request key of the Authority in force
_EXPIRES: Final = "bookline.expires"  # request key of the token's expiry (unix s)
# The query parameter a browser's WebSocket puts its token in.
WS_TOKEN_PARAM: Final = "token"
# A service token a proxy signs for itself ([*proxy] auth_service_token_lifetime_s's
# default): a leaked one ages out in minutes; bookie connections renew theirs.
SERVICE_TOKEN_LIFETIME_S: Final = 300.0


@dataclass(frozen=True, slots=True)
class Rule:
    """What a route needs: nothing (``open``), a valid token (``authenticated``), or
    one of ``permissions`` on the ``kind`` named by the path's ``key`` (an empty key:
    the cluster; ``check_body``: the handler checks a name from the body)."""

    permissions: tuple[str, ...] = ()
    kind: str = ""
    key: str = ""
    open: bool = False
    check_body: bool = False
    # The WebSocket tail: a real upgrade may carry its token in the query string.
    query_token: bool = False

    @property
    def guarded(self) -> bool:
        """Whether grants are checked (403 possible), not just the token."""
        return bool(self.permissions) or self.check_body


_OPEN = Rule(open=True)
_ANY = Rule()  # any authenticated principal
_BODY = Rule(check_body=True)  # authenticated; the handler authorizes the body's names


def _on(kind: str, key: str, *permissions: str) -> Rule:
    return Rule(permissions, kind, key)


_S, _T, _G = "/v1/streams/{name}", "/v1/topics/{topic}", "/v1/groups/{group}"
_SUB = f"{_S}/subscriptions"

# (method, route pattern) -> rule. Every route a proxy serves is listed here: the
# OpenAPI document's and the dashboard's.
ROUTE_RULES: Final[dict[tuple[str, str], Rule]] = {
    ("GET", "/health"): _OPEN,
    ("GET", "/metrics"): _OPEN,
    ("GET", "/openapi.json"): _OPEN,
    ("GET", "/dashboard"): _OPEN,
    ("GET", "/dashboard/{file}"): _OPEN,
    ("GET", "/v1/cluster"): _on("cluster", "", "admin"),
    # Listings show names only, to every authenticated principal.
    ("GET", "/v1/streams"): _ANY,
    ("GET", "/v1/topics"): _ANY,
    ("GET", "/v1/groups"): _ANY,
    # Creations name the stream/topic in the body: admin on it (the handler checks).
    ("POST", "/v1/streams"): _BODY,
    ("POST", "/v1/topics"): _BODY,
    ("GET", _S): _on("stream", "name", "produce", "consume"),
    ("DELETE", _S): _on("stream", "name", "admin"),
    ("POST", f"{_S}/records"): _on("stream", "name", "produce"),
    ("GET", f"{_S}/records"): _on("stream", "name", "consume"),
    ("GET", f"{_S}/recordsets"): _on("stream", "name", "consume"),
    ("GET", f"{_S}/tail"): Rule(("consume",), "stream", "name", query_token=True),
    ("POST", f"{_S}/heartbeat"): _on("stream", "name", "produce"),
    ("POST", f"{_S}/release"): _on("stream", "name", "produce"),
    ("GET", f"{_S}/owner"): _on("stream", "name", "produce", "consume"),
    ("POST", f"{_S}/truncate"): _on("stream", "name", "admin"),
    ("GET", _SUB): _on("stream", "name", "consume"),
    ("GET", f"{_SUB}/{{sub}}"): _on("stream", "name", "consume"),
    ("POST", f"{_SUB}/{{sub}}"): _on("stream", "name", "consume"),
    ("DELETE", f"{_SUB}/{{sub}}"): _on("stream", "name", "admin"),
    ("GET", _T): _on("topic", "topic", "produce", "consume"),
    ("GET", f"{_T}/partitions"): _on("topic", "topic", "produce", "consume"),
    ("PATCH", _T): _on("topic", "topic", "admin"),
    ("PATCH", f"{_T}/configs"): _on("topic", "topic", "admin"),
    ("DELETE", _T): _on("topic", "topic", "admin"),
    ("POST", f"{_T}/partitions/{{partition}}/records"): _on("topic", "topic", "produce"),
    ("GET", f"{_T}/partitions/{{partition}}/records"): _on("topic", "topic", "consume"),
    ("GET", f"{_T}/partitions/{{partition}}/offsets"): _on("topic", "topic", "consume"),
    # Group routes check the group here and the topics of the body in the handler.
    ("GET", _G): _on("group", "group", "consume"),
    ("GET", f"{_G}/offsets"): _on("group", "group", "consume"),
    ("POST", f"{_G}/join"): _on("group", "group", "consume"),
    ("POST", f"{_G}/heartbeat"): _on("group", "group", "consume"),
    ("POST", f"{_G}/commit"): _on("group", "group", "consume"),
    ("POST", f"{_G}/leave"): _on("group", "group", "consume"),
    ("POST", f"{_G}/reset-offsets"): _on("group", "group", "admin"),
    ("DELETE", _G): _on("group", "group", "admin"),
}


def _route_key(request: web.Request) -> tuple[str, str] | None:
    """(method, pattern) of the matched route; None when nothing matched (404/405)."""
    resource = request.match_info.route.resource
    if resource is None:
        return None
    method = "GET" if request.method == hdrs.METH_HEAD else request.method
    return method, resource.canonical


def _is_websocket_upgrade(request: web.Request) -> bool:
    """A real WebSocket handshake (RFC 6455 4.1): GET, ``Connection: upgrade``,
    ``Upgrade: websocket``, version 13 and a key -- not just an ``Upgrade`` header."""
    headers = request.headers
    connection = {t.strip().lower() for t in headers.get(hdrs.CONNECTION, "").split(",")}
    return (
        request.method == hdrs.METH_GET
        and "upgrade" in connection
        and headers.get(hdrs.UPGRADE, "").strip().lower() == "websocket"
        and headers.get(hdrs.SEC_WEBSOCKET_VERSION, "").strip() == "13"
        and bool(headers.get(hdrs.SEC_WEBSOCKET_KEY, "").strip())
    )


def bearer_token(request: web.Request, rule: Rule | None = None) -> str | None:
    """The token a request carries, or None. The query parameter counts only on a
    route whose ``rule`` allows it (the tail), on a real WebSocket upgrade."""
    token = bearer(request.headers.get(hdrs.AUTHORIZATION, ""))
    if token is not None:
        return token
    if rule is not None and rule.query_token and _is_websocket_upgrade(request):
        return request.query.get(WS_TOKEN_PARAM) or None
    return None


def token_expiry(request: web.Request) -> float | None:
    """When the token that authenticated ``request`` expires (unix seconds); None when
    auth is off, the route is open or the token is static."""
    expires = request.get(_EXPIRES)
    return expires if isinstance(expires, float) else None


def sees_detail(request: web.Request) -> bool:
    """Whether ``/health`` and ``/metrics`` may show tenants' names to this request:
    auth off, or a valid token allowed ``consume`` on the cluster (an admin, the
    services' own principal, a scraper granted just that)."""
    authority = request.get(_AUTHORITY)
    shown = authority if isinstance(authority, Authority) else None
    return _sees_detail(shown, bearer_token(request), time.time())


def service_token_source(
    config: AuthConfig, lifetime_s: float = SERVICE_TOKEN_LIFETIME_S
) -> Callable[[], str | None]:
    """What a proxy presents to bookies and to another service's ``/health``: a fresh
    token of the services' principal signed with its own secret, valid ``lifetime_s``
    (the bookie client renews it before then), else ``$BOOKLINE_TOKEN``."""
    authority = load_authority(config)
    if authority is None or not authority.authenticator.secrets:
        return env_token
    signer = authority
    return lambda: signer.service_token(time.time(), lifetime_s)


def principal_of(request: web.Request) -> str | None:
    """Who made the request (None when auth is off or the route is open)."""
    principal = request.get(_PRINCIPAL)
    return principal if isinstance(principal, str) else None


def require(request: web.Request, permission: str, kind: str, name: str) -> None:
    """Raise ForbiddenError unless the request's principal may ``permission`` on
    ``name``; a no-op when auth is off (no authority on the request)."""
    authority = request.get(_AUTHORITY)
    if not isinstance(authority, Authority):
        return
    principal = principal_of(request)
    if principal is None:  # an open route asked: refuse rather than guess
        raise ForbiddenError(f"{request.path} is open; it cannot authorize {kind} {name!r}")
    authority.grants.authorize(principal, permission, kind, name)


def _authorize(authority: Authority, principal: str, rule: Rule, request: web.Request) -> None:
    if principal == SERVICE_PRINCIPAL:  # least privilege: no tenant route (docstring)
        raise ForbiddenError(f"{principal!r} may not use {request.method} {request.path}")
    if not rule.permissions:
        return
    name = request.match_info.get(rule.key, "") if rule.key else ""
    grants = authority.grants
    if any(grants.allows(principal, p, rule.kind, name) for p in rule.permissions):
        return
    what = f"{rule.kind} {name!r}" if rule.kind != "cluster" else "the cluster"
    raise ForbiddenError(f"{principal!r} may not {' or '.join(rule.permissions)} on {what}")


def auth_middleware(authority: Authority, clock: Callable[[], float] = time.time) -> Middleware:
    """Authenticate and authorize every request before its handler (module docstring)."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        key = _route_key(request)
        if key is None:
            return await handler(request)  # 404 / 405: nothing to protect
        rule = ROUTE_RULES.get(key)
        if rule is None:
            raise ForbiddenError(f"{key[0]} {key[1]} has no access rule")
        request[_AUTHORITY] = authority
        if rule.open:
            return await handler(request)
        token = bearer_token(request, rule)
        principal = authority.authenticate(token, clock())
        strict.mark_authenticated(request)  # a valid token: no longer a stranger
        _authorize(authority, principal, rule, request)
        request[_PRINCIPAL] = principal
        if token is not None:
            request[_EXPIRES] = _signed_expiry(token)
        return await handler(request)

    return middleware


def auth_middlewares(config: AuthConfig) -> list[Middleware]:
    """The middleware ``config`` asks for (none when auth is off); loading the secret,
    grants and tokens files here makes a proxy with bad ones fail at start."""
    authority = load_authority(config)
    return [] if authority is None else [auth_middleware(authority)]


def check_rules(app: web.Application) -> None:
    """ConfigError naming every route of ``app`` without an access rule."""
    missing = []
    for route in app.router.routes():
        resource = route.resource
        if resource is None or route.method == hdrs.METH_HEAD:
            continue
        if (route.method, resource.canonical) not in ROUTE_RULES:
            missing.append(f"{route.method} {resource.canonical}")
    if missing:
        raise ConfigError(f"routes without an access rule: {', '.join(sorted(missing))}")
