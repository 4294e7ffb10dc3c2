"""Compressed request bodies (HTTP-10): real compressed bodies, sent by aiohttp and httpx clients
to a real server, decode on every body route under one reader; the decoded size is bounded by
the body limit (LIM-9) while it grows, a bomb is a 413, a corrupt or cut stream a 400, another
coding a 415, each in the error envelope (ERR-2) without a codec's or aiohttp's text (ERR-3)."""

from __future__ import annotations

import asyncio
import gzip
import json
import sys
import zlib
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import brotli
import httpx2
import pytest
from backports import zstd

from engine.server.transport.server_config import ServerConfig
from tests.support.server import LiveServer, stdout_port

LIMIT = 64 * 1024  # the server's --max-frame-bytes in these tests
BODY = json.dumps({"model": "sim", "input": "Say hello.", "store": False}).encode()


def _raw_deflate(data: bytes) -> bytes:
    packer = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return packer.compress(data) + packer.flush()


CODECS: dict[str, Callable[[bytes], bytes]] = {
    "zstd": lambda data: zstd.compress(data, level=3),  # Codex's coding and level
    "gzip": gzip.compress,
    "deflate": zlib.compress,  # RFC 9110's deflate: the zlib format
    "br": lambda data: brotli.compress(data, quality=1),
}
SENT = {**CODECS, "deflate-raw": _raw_deflate, "x-gzip": gzip.compress}


def _header(name: str) -> str:
    return "deflate" if name == "deflate-raw" else name


@pytest.fixture
async def live(server_factory: Callable[..., Any]) -> LiveServer:
    server: LiveServer = await server_factory(server=ServerConfig(max_frame_bytes=LIMIT))
    return server


async def _post(
    live: LiveServer, path: str, data: bytes, encoding: str
) -> tuple[int, dict[str, Any], aiohttp.typedefs.LooseHeaders]:
    headers = {"Content-Type": "application/json", "Content-Encoding": encoding}
    async with (
        aiohttp.ClientSession() as http,
        http.post(f"http://127.0.0.1:{live.port}{path}", data=data, headers=headers) as r,
    ):
        return r.status, await r.json(), r.headers


def _envelope(answer: dict[str, Any], code: str) -> str:
    assert set(answer) == {"error"} and answer["error"]["code"] == code, answer
    assert answer["error"]["type"] == "invalid_request_error"
    message: str = answer["error"]["message"]
    for internal in ("install", "backports", "Brotli", "zlib", "Error", "Traceback"):
        assert internal not in message, message  # no codec or aiohttp text (ERR-3)
    return message


@pytest.mark.parametrize("name", list(SENT))
async def test_every_coding_decodes_on_responses(live: LiveServer, name: str) -> None:
    """HTTP-10: a create compressed with each coding is answered as the plain one is, and is
    counted under its coding (HTTP-7)."""
    status, answer, _ = await _post(live, "/v1/responses", SENT[name](BODY), _header(name))
    assert status == 200, answer
    assert answer["status"] == "completed" and answer["output"][0]["type"] == "message"
    coding = "gzip" if name == "x-gzip" else _header(name)
    key = "x-gzip" if name == "x-gzip" else coding
    assert live.engine.counters[f"http.content_encoding.{key}"] >= 1


@pytest.mark.parametrize("name", list(CODECS))
async def test_every_body_route_decodes_with_one_reader(live: LiveServer, name: str) -> None:
    """HTTP-10: the other body routes (`input_tokens`, `compact`, conversations and their
    items) read their bodies through the same reader, with httpx as the client."""
    pack = CODECS[name]
    headers = {"Content-Type": "application/json", "Content-Encoding": name}
    async with httpx2.AsyncClient(base_url=f"http://127.0.0.1:{live.port}") as http:
        counted = await http.post("/v1/responses/input_tokens", content=pack(BODY), headers=headers)
        assert counted.status_code == 200 and counted.json()["input_tokens"] > 0
        compact = json.dumps({"model": "sim", "input": "Some words to keep."}).encode()
        compacted = await http.post("/v1/responses/compact", content=pack(compact), headers=headers)
        assert compacted.status_code == 200, compacted.text
        made = await http.post(
            "/v1/conversations",
            content=pack(json.dumps({"metadata": {"coding": name}}).encode()),
            headers=headers,
        )
        assert made.status_code == 200 and made.json()["metadata"] == {"coding": name}
        item = {"type": "message", "role": "user", "content": "hello"}
        added = await http.post(
            f"/v1/conversations/{made.json()['id']}/items",
            content=pack(json.dumps({"items": [item]}).encode()),
            headers=headers,
        )
        assert added.status_code == 200, added.text
    assert live.engine.counters[f"http.content_encoding.{name}"] == 4


@pytest.mark.parametrize("name", list(CODECS))
async def test_a_bomb_is_refused_once_it_decodes_past_the_limit(
    live: LiveServer, name: str
) -> None:
    """HTTP-10, LIM-9: a body far under the limit compressed that decodes to 16 MiB (256 times
    the limit) is 413 `request_too_large`; one that decodes to exactly the limit is served."""
    bomb = CODECS[name](b" " * (16 * 1024 * 1024) + BODY)
    assert len(bomb) < LIMIT // 2  # the compressed bytes are well within the limit
    status, answer, _ = await _post(live, "/v1/responses", bomb, name)
    assert status == 413
    _envelope(answer, "request_too_large")
    at_limit = b" " * (LIMIT - len(BODY)) + BODY
    status, answer, _ = await _post(live, "/v1/responses", CODECS[name](at_limit), name)
    assert status == 200, answer
    over = b" " + at_limit  # one byte past
    status, answer, _ = await _post(live, "/v1/responses", CODECS[name](over), name)
    assert status == 413
    _envelope(answer, "request_too_large")


@pytest.mark.parametrize("name", list(CODECS))
async def test_a_corrupt_or_cut_stream_is_a_clear_400(live: LiveServer, name: str) -> None:
    """HTTP-10, ERR-3: bytes that are not the coding's, and a valid stream cut short, are 400
    `invalid_body` naming the coding, never the codec's own words."""
    packed = CODECS[name](BODY * 20)
    flipped = packed[:8] + bytes(b ^ 0x5A for b in packed[8:])
    for data in (b"this is not compressed at all" * 4, flipped, packed[: len(packed) // 2]):
        status, answer, _ = await _post(live, "/v1/responses", data, name)
        assert status == 400, (data[:16], answer)
        assert name in _envelope(answer, "invalid_body")


async def test_another_coding_is_a_415_with_the_accepted_list(live: LiveServer) -> None:
    """HTTP-10: a coding the server does not decode, or two stacked, is 415
    `unsupported_content_encoding` with `Accept-Encoding`; `identity` is no coding."""
    for encoding, data in (("compress", BODY), ("gzip, gzip", gzip.compress(gzip.compress(BODY)))):
        status, answer, headers = await _post(live, "/v1/responses", data, encoding)
        assert status == 415
        _envelope(answer, "unsupported_content_encoding")
        assert headers["Accept-Encoding"] == "zstd, gzip, deflate, br"
    status, answer, _ = await _post(live, "/v1/responses", BODY, "identity")
    assert status == 200, answer


@pytest.fixture
async def serve_process(tmp_path: Path) -> AsyncIterator[int]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "cli", "serve", "--port", "0", "--announce-port", "--tps", "0",
        "--store", f"sqlite:///{tmp_path / 'bodies.db'}", "--max-frame-bytes", str(LIMIT),
        "--log-level", "WARNING",
        stdout=asyncio.subprocess.PIPE,
    )  # fmt: skip
    try:
        yield await stdout_port(proc)
    finally:
        proc.kill()
        await proc.wait()


async def test_rollout_serve_decodes_with_its_own_reader(serve_process: int) -> None:
    """HTTP-10: `rollout serve`'s runner leaves bodies to the reader (aiohttp's decoding off):
    a zstd create is served, a zstd bomb refused with the envelope's 413."""
    url = f"http://127.0.0.1:{serve_process}/v1/responses"
    headers = {"Content-Type": "application/json", "Content-Encoding": "zstd"}
    async with aiohttp.ClientSession() as http:
        async with http.post(url, data=zstd.compress(BODY), headers=headers) as r:
            assert r.status == 200 and (await r.json())["status"] == "completed"
        bomb = zstd.compress(b" " * (4 * 1024 * 1024) + BODY)
        async with http.post(url, data=bomb, headers=headers) as r:
            assert r.status == 413
            _envelope(await r.json(), "request_too_large")
