"""The inspector's sign-in on a real server over real HTTP: a session token in the cookie, never
the key; same-origin evidence required; expiry, sign-out, the table's bound, and ``Secure``
under TLS (AUTH-13, AUTH-14)."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from http.cookies import Morsel
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from engine.core import Engine, EngineConfig
from engine.server.app import create_app
from engine.server.process.serve import tls_context
from engine.server.routes.inspector import COOKIE, SIGN_INS
from engine.server.transport.server_config import ServerConfig
from tests.support.server import LiveServer, serve_app
from tests.support.tls import self_signed

KEY = "sk-inspect-session-test"
KEYED = ServerConfig(api_keys=frozenset({KEY}))


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    # A cookie jar of its own would replay the cookie; each test names the cookie it sends.
    async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as session:
        yield session


def base(live: LiveServer) -> str:
    return f"http://127.0.0.1:{live.port}"


async def sign_in(
    http: aiohttp.ClientSession, root: str, headers: dict[str, str] | None = None
) -> aiohttp.ClientResponse:
    """One ``POST /inspect/login`` with the key; by default from the page's own origin."""
    sent = {"Origin": root} if headers is None else headers
    async with http.post(
        f"{root}/inspect/login", data={"key": KEY}, headers=sent, allow_redirects=False
    ) as resp:
        await resp.read()
        return resp


async def signed_in(http: aiohttp.ClientSession, root: str) -> Morsel[str]:
    resp = await sign_in(http, root)
    assert resp.status == 303 and resp.headers["Location"] == "/inspect"
    return resp.cookies[COOKIE]


async def page_status(http: aiohttp.ClientSession, root: str, token: str) -> int:
    async with http.get(f"{root}/inspect", headers={"Cookie": f"{COOKIE}={token}"}) as resp:
        return resp.status


async def feed_status(http: aiohttp.ClientSession, root: str, token: str) -> int:
    """The feed's answer to an upgrade with this cookie: 101 (it opened) or the refusal."""
    url = root.replace("http", "ws", 1) + "/inspect/feed"
    try:
        async with http.ws_connect(url, headers={"Cookie": f"{COOKIE}={token}"}):
            return 101
    except aiohttp.WSServerHandshakeError as refused:
        return refused.status


async def test_the_cookie_holds_a_session_token_not_the_key(
    server_factory: Any, http: aiohttp.ClientSession
) -> None:
    """AUTH-14: the cookie is a random token (a new one per sign-in) that opens the page and
    the feed; the key is nowhere in the answer, and the key itself as the cookie opens nothing.
    Over plain http the cookie is not ``Secure``; ``Max-Age`` is the session's lifetime."""
    live = await server_factory(server=KEYED)
    root = base(live)
    resp = await sign_in(http, root)
    assert resp.status == 303
    assert KEY not in str(resp.headers) and KEY not in str(resp.cookies)
    cookie = resp.cookies[COOKIE]
    assert len(cookie.value) >= 43  # 256 random bits, url-safe base64
    assert cookie["httponly"] and cookie["samesite"] == "Strict" and cookie["path"] == "/inspect"
    assert not cookie["secure"]
    assert cookie["max-age"] == str(int(KEYED.inspector_session_ttl_s))
    again = await signed_in(http, root)
    assert again.value != cookie.value
    for token in (cookie.value, again.value):
        assert await page_status(http, root, token) == 200
        assert await feed_status(http, root, token) == 101
    assert await page_status(http, root, KEY) == 401  # the login form
    assert await feed_status(http, root, KEY) == 401


# Requests a page of another site, or a client hiding its origin, could send (AUTH-13).
REFUSED: dict[str, dict[str, str]] = {
    "no evidence": {},
    "another origin": {"Origin": "http://evil.example"},
    "an opaque origin": {"Origin": "null"},
    "another port": {"Origin": "http://127.0.0.1:1"},
    "cross-site fetch": {"Sec-Fetch-Site": "cross-site"},
    "same-site fetch": {"Sec-Fetch-Site": "same-site"},
    "another origin, same-origin claimed": {
        "Origin": "http://evil.example",
        "Sec-Fetch-Site": "same-origin",
    },
}


@pytest.mark.parametrize("headers", list(REFUSED.values()), ids=list(REFUSED))
async def test_a_sign_in_without_same_origin_evidence_is_refused(
    server_factory: Any, http: aiohttp.ClientSession, headers: dict[str, str]
) -> None:
    """AUTH-13: a sign-in with the right key but no evidence that the inspector's own page
    posted it is refused (403 cross_origin_login) and opens no session."""
    live = await server_factory(server=KEYED)
    async with http.post(
        f"{base(live)}/inspect/login", data={"key": KEY}, headers=headers, allow_redirects=False
    ) as resp:
        assert resp.status == 403
        assert (await resp.json())["error"]["code"] == "cross_origin_login"
        assert COOKIE not in resp.cookies
    assert len(live.runner.app[SIGN_INS]) == 0


@pytest.mark.parametrize("evidence", ["origin", "sec-fetch-site"])
async def test_a_sign_in_from_the_page_itself_is_accepted(
    server_factory: Any, http: aiohttp.ClientSession, evidence: str
) -> None:
    """AUTH-13: either header is enough: ``Origin`` of this host, or, without an ``Origin``,
    ``Sec-Fetch-Site: same-origin``."""
    live = await server_factory(server=KEYED)
    root = base(live)
    headers = {"Origin": root} if evidence == "origin" else {"Sec-Fetch-Site": "same-origin"}
    resp = await sign_in(http, root, headers)
    assert resp.status == 303
    assert await page_status(http, root, resp.cookies[COOKIE].value) == 200


async def test_a_session_expires(server_factory: Any, http: aiohttp.ClientSession) -> None:
    """AUTH-14: past ``inspector_session_ttl_s`` the token opens neither the page nor the feed,
    and the expired session leaves the table. The server's clock is moved, not waited for."""
    config = ServerConfig(api_keys=frozenset({KEY}), inspector_session_ttl_s=600)
    live = await server_factory(server=config)
    root, sign_ins = base(live), live.runner.app[SIGN_INS]
    token = (await signed_in(http, root)).value
    assert await page_status(http, root, token) == 200
    real = sign_ins.clock
    sign_ins.clock = lambda: real() + 599
    assert await page_status(http, root, token) == 200
    sign_ins.clock = lambda: real() + 601
    assert await feed_status(http, root, token) == 401
    assert await page_status(http, root, token) == 401
    assert len(sign_ins) == 0


async def test_sign_out_revokes_the_session(
    server_factory: Any, http: aiohttp.ClientSession
) -> None:
    """AUTH-14: ``POST /inspect/logout`` ends the session on the server (its token is nobody's,
    even if a copy of the cookie survives) and clears the cookie; it needs the same evidence
    as the sign-in, so another site cannot end it."""
    live = await server_factory(server=KEYED)
    root = base(live)
    token, other = (await signed_in(http, root)).value, (await signed_in(http, root)).value
    cookie = {"Cookie": f"{COOKIE}={token}"}
    logout = f"{root}/inspect/logout"
    async with http.post(logout, headers=cookie, allow_redirects=False) as resp:
        assert resp.status == 403  # no evidence: nothing ended
    assert await page_status(http, root, token) == 200
    headers = {**cookie, "Origin": root}
    async with http.post(logout, headers=headers, allow_redirects=False) as resp:
        assert resp.status == 303 and resp.headers["Location"] == "/inspect"
        assert resp.cookies[COOKIE].value == "" and resp.cookies[COOKIE]["max-age"] == "0"
    assert await page_status(http, root, token) == 401
    assert await feed_status(http, root, token) == 401
    assert await page_status(http, root, other) == 200  # another sign-in is its own session


async def test_the_session_table_is_bounded(
    server_factory: Any, http: aiohttp.ClientSession
) -> None:
    """AUTH-14: at most ``max_inspector_sessions`` sessions; one more sign-in ends the oldest."""
    config = ServerConfig(api_keys=frozenset({KEY}), max_inspector_sessions=2)
    live = await server_factory(server=config)
    root = base(live)
    tokens = [(await signed_in(http, root)).value for _ in range(3)]
    assert len(live.runner.app[SIGN_INS]) == 2
    assert [await page_status(http, root, t) for t in tokens] == [401, 200, 200]


@pytest.fixture
async def keyed_tls(tmp_path: Path) -> AsyncIterator[tuple[int, ssl.SSLContext]]:
    cert, key = self_signed(tmp_path)
    app = create_app(Engine(EngineConfig(tokens_per_second=0)), server=KEYED)
    runner, port = await serve_app(app, ssl_context=tls_context(cert, key))
    try:
        yield port, ssl.create_default_context(cafile=str(cert))
    finally:
        await runner.cleanup()


async def test_the_cookie_is_secure_under_tls(keyed_tls: tuple[int, ssl.SSLContext]) -> None:
    """AUTH-14, TLS-1: a sign-in over https sets a ``Secure`` cookie, which then opens the page
    over https."""
    port, client_ssl = keyed_tls
    root = f"https://127.0.0.1:{port}"
    connector = aiohttp.TCPConnector(ssl=client_ssl)
    jar = aiohttp.DummyCookieJar()
    async with aiohttp.ClientSession(connector=connector, cookie_jar=jar) as http:
        cookie = await signed_in(http, root)
        assert cookie["secure"] and cookie["httponly"] and cookie["samesite"] == "Strict"
        assert await page_status(http, root, cookie.value) == 200


UNAUTHORIZED = {  # ERR-2's HTTP body, AUTH-2's refusal
    "error": {
        "type": "invalid_request_error",
        "code": "invalid_api_key",
        "message": "Incorrect or missing API key (use Authorization: Bearer).",
        "param": None,
    }
}


async def test_the_cookie_opens_no_api_route(
    server_factory: Any, http: aiohttp.ClientSession
) -> None:
    """AUTH-14, AUTH-2: the session cookie is for the inspector's two paths only. Sent without
    ``Authorization`` to the API (a create, a stored response's read and delete, the
    conversations, the models, the WebSocket upgrade on ``/v1/responses``), a valid session's
    cookie is 401 ``invalid_api_key`` in the error envelope, and nothing is done (the response
    it tried to delete is still there for its key). The same cookie opens the page."""
    live = await server_factory(server=KEYED)
    root = base(live)
    token = (await signed_in(http, root)).value
    bearer = {"Authorization": f"Bearer {KEY}"}
    body = {"model": "sim", "input": "hello"}
    async with http.post(f"{root}/v1/responses", json=body, headers=bearer) as resp:
        assert resp.status == 200
        response_id = (await resp.json())["id"]
    cookie = {"Cookie": f"{COOKIE}={token}"}
    for method, path, sent in (
        ("POST", "/v1/responses", body),
        ("GET", f"/v1/responses/{response_id}", None),
        ("GET", f"/v1/responses/{response_id}/input_items", None),
        ("DELETE", f"/v1/responses/{response_id}", None),
        ("POST", "/v1/conversations", {}),
        ("GET", "/v1/models", None),
    ):
        async with http.request(method, root + path, json=sent, headers=cookie) as resp:
            assert (resp.status, await resp.json()) == (401, UNAUTHORIZED), (method, path)
    socket = root.replace("http", "ws", 1) + "/v1/responses"
    with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
        async with http.ws_connect(socket, headers=cookie):
            pass
    assert refused.value.status == 401
    async with http.get(f"{root}/v1/responses/{response_id}", headers=bearer) as resp:
        assert resp.status == 200  # not deleted
    assert await page_status(http, root, token) == 200
