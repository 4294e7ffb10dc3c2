"""TLS-1: the server speaks https:// and wss:// itself; the openai SDK connects with our CA."""

from __future__ import annotations

import ssl
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from openai import AsyncOpenAI, DefaultAsyncHttpxClient

from engine.core import Engine, EngineConfig
from engine.server.app import create_app
from engine.server.process.serve import tls_context
from tests.support.server import serve_app
from tests.support.tls import self_signed


@pytest.fixture
async def tls_server(tmp_path: Path) -> AsyncIterator[tuple[int, ssl.SSLContext]]:
    cert, key = self_signed(tmp_path)
    app = create_app(Engine(EngineConfig(tokens_per_second=0)))
    runner, port = await serve_app(app, ssl_context=tls_context(cert, key))
    try:
        yield port, ssl.create_default_context(cafile=str(cert))
    finally:
        await runner.cleanup()


async def test_sdk_over_https_and_wss(tls_server: tuple[int, ssl.SSLContext]) -> None:
    port, client_ssl = tls_server
    client = AsyncOpenAI(
        base_url=f"https://127.0.0.1:{port}/v1",
        api_key="x",
        http_client=DefaultAsyncHttpxClient(verify=client_ssl),
    )
    response = await client.responses.create(model="sim", input="hi over https")
    assert response.status == "completed"
    options: Any = {"ssl": client_ssl}
    async with client.responses.connect(websocket_connection_options=options) as conn:
        await conn.response.create(model="sim", input="hi over wss")
        async for event in conn:
            if event.type == "response.completed":
                assert "hi over wss" in event.response.output_text
                break
    await client.close()


def test_tls_flags_must_come_together(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="go together"):
        tls_context(tmp_path / "cert.pem", None)
