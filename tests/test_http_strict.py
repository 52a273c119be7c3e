"""HTTP strictness of the proxies' plumbing (issue 15, scope item 9), in process.

Every error answer is the documented ``{code, name, message}`` JSON body, including
those aiohttp produces itself before any handler runs (a request line or headers it
cannot parse, a bad Content-Length): raw sockets send what no HTTP client library
would. Wrong methods get 405 with ``Allow``; unknown body media types 415; unknown
fields and deep nesting 400; connections beyond ``connections_max`` and idle ones are
closed.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry, Counter

from foundation.errors import AlreadyExistsError
from httpapi import server as http
from httpapi.proxy_config import ProxyConfig
from httpapi.strict import scrub_message

API = "/v1/streams"


async def _health(request: web.Request) -> web.Response:
    return web.json_response({"state": "ok"})


async def _leak(request: web.Request) -> web.Response:
    raise AlreadyExistsError("znode at /bookline/streams/default/x (transaction rolled back)")


async def _create(request: web.Request) -> web.Response:
    return http.respond(request, await http.read_body(request), status=201)


async def _serve(config: ProxyConfig, closed: Counter | None = None) -> tuple[web.AppRunner, int]:
    registry = CollectorRegistry()
    requests = Counter("requests", "answers", ["endpoint", "status"], registry=registry)
    app = http.proxy_app(
        health=_health, registry=registry, requests=requests, connections_closed=closed
    )
    app.router.add_post(API, _create)
    app.router.add_get(API, _health)
    app.router.add_get("/v1/leak", _leak)
    runner, url = await http.start_site(app, config)
    return runner, int(url.rsplit(":", 1)[1])


@pytest.fixture
async def port() -> AsyncIterator[int]:
    runner, bound = await _serve(ProxyConfig(port=0))
    try:
        yield bound
    finally:
        await runner.cleanup()


async def exchange(port: int, raw: bytes) -> tuple[int, dict[str, str], Any]:
    """Send ``raw`` bytes, read the whole answer: (status, headers, JSON body)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(raw)
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5.0)
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {
            k.strip().lower(): v.strip()
            for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)
        }
        length = int(headers.get("content-length", "0"))
        body = await asyncio.wait_for(reader.readexactly(length), 5.0)
    finally:
        writer.close()
    assert headers.get("content-type", "").startswith("application/json"), (status, headers, body)
    return status, headers, json.loads(body)


def request(method: str, path: str, body: bytes = b"", **headers: str) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: x", f"Content-Length: {len(body)}"]
    lines += [f"{k.replace('_', '-')}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


def assert_error(answer: tuple[int, dict[str, str], Any], status: int, name: str) -> None:
    got_status, _headers, body = answer
    assert got_status == status, answer
    assert set(body) == {"code", "name", "message"}, body
    assert body["name"] == name, body
    assert isinstance(body["code"], int) and body["message"], body


GET = b"GET / HTTP/1.1\r\nHost: x\r\n"
POST = b"POST /v1/streams HTTP/1.1\r\nHost: x\r\n"
PARSER_ERRORS = {
    "bad-request-line": b"GARBAGE\r\n\r\n",
    "huge-header": GET + b"X-Big: " + b"a" * 20_000 + b"\r\n\r\n",
    "huge-line": b"GET /" + b"a" * 20_000 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
    "bad-length": POST + b"Content-Length: abc\r\n\r\n",
    "two-lengths": POST + b"Content-Length: 1\r\nContent-Length: 2\r\n\r\nab",
    "header-without-colon": GET + b"Bad Header\r\n\r\n",
}


@pytest.mark.parametrize("raw", PARSER_ERRORS.values(), ids=PARSER_ERRORS.keys())
async def test_parser_errors_answer_the_error_body(port: int, raw: bytes) -> None:
    answer = await exchange(port, raw)
    assert_error(answer, answer[0], "BAD_REQUEST")
    assert 400 <= answer[0] < 500


async def test_unknown_route_is_404_in_the_error_body(port: int) -> None:
    assert_error(await exchange(port, request("GET", "/v1/nothing")), 404, "NOT_FOUND")


async def test_wrong_method_is_405_with_allow(port: int) -> None:
    answer = await exchange(port, request("DELETE", API))
    assert_error(answer, 405, "METHOD_NOT_ALLOWED")
    assert set(answer[1]["allow"].replace(" ", "").split(",")) >= {"GET", "POST"}


@pytest.mark.parametrize("media", ["text/plain", "application/x-www-form-urlencoded", "x/y"])
async def test_unknown_content_type_is_415(port: int, media: str) -> None:
    answer = await exchange(port, request("POST", API, b'{"name":"a"}', content_type=media))
    assert_error(answer, 415, "UNSUPPORTED_MEDIA_TYPE")


async def test_known_content_types_and_fields_are_read(port: int) -> None:
    for media in ("application/json", "application/json; charset=utf-8"):
        status, _h, body = await exchange(
            port, request("POST", API, b'{"name":"a"}', content_type=media)
        )
        assert (status, body) == (201, {"name": "a"})


async def test_unknown_fields_are_refused(port: int) -> None:
    answer = await exchange(port, request("POST", API, b'{"name":"a","nmae":"b"}'))
    assert_error(answer, 400, "BAD_REQUEST")
    assert "nmae" in answer[2]["message"]


@pytest.mark.parametrize("nesting", ["[" * 100_000, '{"a":' * 100_000])
async def test_deep_nesting_is_400_not_500(port: int, nesting: str) -> None:
    answer = await exchange(port, request("POST", API, nesting.encode()))
    assert_error(answer, 400, "BAD_REQUEST")


def closed_counter() -> tuple[Counter, CollectorRegistry]:
    """What a proxy's bookline_*proxy_connections_closed counter is, in a registry of
    its own."""
    registry = CollectorRegistry()
    return Counter("closed", "closed by a limit", ["reason"], registry=registry), registry


def closed_count(registry: CollectorRegistry, reason: str) -> float | None:
    return registry.get_sample_value("closed_total", {"reason": reason})


async def test_connections_beyond_the_limit_are_closed() -> None:
    closed, registry = closed_counter()
    runner, port = await _serve(ProxyConfig(port=0, connections_max=2), closed)
    held = []
    try:
        for _ in range(2):
            held.append(await asyncio.open_connection("127.0.0.1", port))
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        held.append((reader, writer))
        assert await asyncio.wait_for(reader.read(), 5.0) == b""  # closed at once
        # The first two are still served.
        held[0][1].write(request("GET", API))
        assert (await asyncio.wait_for(held[0][0].readline(), 5.0)).startswith(b"HTTP/1.1 200")
        assert closed_count(registry, "connections_max") == 1  # counted by reason
    finally:
        for _r, w in held:
            w.close()
        await runner.cleanup()


async def test_idle_connections_are_closed() -> None:
    runner, port = await _serve(ProxyConfig(port=0, idle_timeout_s=0.5))
    try:
        silent_r, silent_w = await asyncio.open_connection("127.0.0.1", port)
        slow_r, slow_w = await asyncio.open_connection("127.0.0.1", port)
        slow_w.write(b"GET /v1/streams HTTP/1.1\r\nHost: x\r\n")  # headers never finish
        for reader in (silent_r, slow_r):
            assert await asyncio.wait_for(reader.read(), 5.0) == b""
        silent_w.close()
        slow_w.close()
    finally:
        await runner.cleanup()


async def test_error_messages_do_not_carry_znode_paths(port: int) -> None:
    status, _h, body = await exchange(port, request("GET", "/v1/leak"))
    assert status == 409 and "/bookline" not in body["message"], body
    assert body["message"] == "znode at <path> (transaction rolled back)"


@pytest.mark.parametrize(
    ("message", "shown"),
    [
        ("znode at /bookline/a/b does not exist", "znode at <path> does not exist"),
        ("cannot read /var/lib/x.toml: denied", "cannot read <path>: denied"),
        ("s is owned by http://127.0.0.1:8480/v1/s", "s is owned by http://127.0.0.1:8480/v1/s"),
        ("ns/stream already exists", "ns/stream already exists"),
        ("dlsn 1:0:0 is past the end", "dlsn 1:0:0 is past the end"),
    ],
)
def test_scrub_message_hides_paths_not_urls_or_names(message: str, shown: str) -> None:
    assert scrub_message(message) == shown


async def test_a_body_that_trickles_in_is_cut_short() -> None:
    """A body that does not arrive within body_timeout_s is answered 400 (before, the
    handler waited for it for ever, holding the write proxy's admission budget)."""
    closed, registry = closed_counter()
    runner, port = await _serve(ProxyConfig(port=0, body_timeout_s=0.5), closed)
    try:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        head = f"POST {API} HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n".encode()
        writer.write(head + b'{"name": "a')  # 11 of the 100 bytes, then nothing
        try:
            head_in = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5.0)
            assert head_in.startswith(b"HTTP/1.1 400"), head_in
            length = int(head_in.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            body = json.loads(await asyncio.wait_for(reader.readexactly(length), 5.0))
            assert body["message"] == "request body not received within 0.5 s", body
            assert closed_count(registry, "body_timeout") == 1
        finally:
            writer.close()
    finally:
        await runner.cleanup()
