"""One conversation loader, with the owner check, for every request that names a
``previous_response_id`` (OWN-2, OWN-4): ``/compact`` and ``/input_tokens`` included.

A real server with two API keys, the official SDK as both. Key A stores a response whose input
holds a secret; key B naming it must get exactly what an unknown id gets, and nothing changes
for A.
"""

from __future__ import annotations

import ast
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import openai
import pytest
from openai import AsyncOpenAI

from engine.server.transport.server_config import ServerConfig
from tests.support.server import LiveServer

MODEL = "sim"
SECRET = "the launch code is 0000-SWORDFISH"
UNKNOWN = "resp_00000000000000000000000000000000"


@pytest.fixture
async def keyed(server_factory: Callable[..., Any]) -> LiveServer:
    live: LiveServer = await server_factory(server=ServerConfig(api_keys=frozenset({"ka", "kb"})))
    return live


@pytest.fixture
async def clients(keyed: LiveServer) -> AsyncIterator[tuple[AsyncOpenAI, AsyncOpenAI]]:
    alice = AsyncOpenAI(base_url=keyed.base_url, api_key="ka", max_retries=0)
    bob = AsyncOpenAI(base_url=keyed.base_url, api_key="kb", max_retries=0)
    try:
        yield alice, bob
    finally:
        await alice.close()
        await bob.close()


def _compact(client: AsyncOpenAI) -> Callable[[str], Awaitable[Any]]:
    return lambda prev: client.responses.compact(model=MODEL, previous_response_id=prev, input="x")


def _count(client: AsyncOpenAI) -> Callable[[str], Awaitable[Any]]:
    return lambda prev: client.responses.input_tokens.count(
        model=MODEL, previous_response_id=prev, input="x"
    )


async def _refusal(call: Awaitable[Any]) -> dict[str, Any]:
    with pytest.raises(openai.BadRequestError) as info:
        await call
    body = info.value.body
    assert isinstance(body, dict)
    return body


@pytest.mark.parametrize("request_kind", [_compact, _count], ids=["compact", "input_tokens"])
async def test_another_key_gets_exactly_the_unknown_id_answer(
    clients: tuple[AsyncOpenAI, AsyncOpenAI],
    request_kind: Callable[[AsyncOpenAI], Callable[[str], Awaitable[Any]]],
) -> None:
    """OWN-2, OWN-4: key B naming key A's stored response in ``/compact`` or ``/input_tokens``
    gets 400 ``previous_response_not_found`` with the very body an unknown id gets (only the id
    differs), never A's conversation or its size; A is served as before."""
    alice, bob = clients
    made = await alice.responses.create(model=MODEL, input=f"Remember this: {SECRET}")
    foreign = await _refusal(request_kind(bob)(made.id))
    unknown = await _refusal(request_kind(bob)(UNKNOWN))
    assert foreign["code"] == "previous_response_not_found"
    assert foreign["param"] == "previous_response_id"
    assert SECRET not in str(foreign)
    assert str(foreign).replace(made.id, UNKNOWN) == str(unknown)
    served = await request_kind(alice)(made.id)  # the owner is undisturbed
    if hasattr(served, "input_tokens") and not hasattr(served, "output"):
        assert served.input_tokens > 0
    else:
        assert SECRET in str(served.output)


def test_owner_checks_use_one_loader() -> None:
    """OWN-4: the store's conversation read (``hydrate``) is called from the loader only, so a
    new request kind cannot read a conversation without the owner check."""
    engine = Path(__file__).resolve().parents[3] / "engine"
    callers: set[str] = set()
    for module in engine.rglob("*.py"):
        for node in ast.walk(ast.parse(module.read_text())):
            if isinstance(node, ast.Attribute) and node.attr == "hydrate":
                callers.add(module.relative_to(engine).as_posix())
    assert callers == {"connection/loader.py"}
