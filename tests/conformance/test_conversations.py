"""The Conversations API through its real clients (SPEC §19): the openai SDK's
``client.conversations.*`` and ``conversations.items.*`` parse every answer (the SDK is the
oracle), ``conversation`` on ``responses.create`` over HTTP and WebSocket, and the Agents SDK's
``OpenAIConversationsSession`` and ``Runner.run(conversation_id=…)``."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Literal

import openai
import pytest
from agents import Runner
from agents.memory import OpenAIConversationsSession
from agents.models.openai_responses import OpenAIResponsesModel
from openai import AsyncOpenAI
from openai.types.conversations import Conversation, ConversationDeletedResource
from openai.types.conversations.conversation_item import ConversationItem
from pydantic import TypeAdapter

from engine.core import EngineConfig
from engine.models.base import TextDelta
from engine.models.router import Router
from engine.models.sim.scripted import ScriptedModel, ScriptStep
from tests.conformance.sdk_ws import create, final, recv, until_done
from tests.support.agents_sdk import weather_agent
from tests.support.fixtures import sdk_client
from tests.support.server import LiveServer
from tests.support.tools import WEATHER
from tests.support.wait import wait_for

ITEM: TypeAdapter[Any] = TypeAdapter(ConversationItem)


def _user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": text}


async def _texts(client: AsyncOpenAI, conversation_id: str) -> list[tuple[str, str]]:
    """(type, text or call id) of every item, oldest first, through the SDK's pager."""
    out: list[tuple[str, str]] = []
    async for item in client.conversations.items.list(conversation_id, order="asc", limit=2):
        ITEM.validate_python(item.model_dump())  # strictly the SDK's union
        if item.type == "message":
            out.append((item.type, "".join(getattr(p, "text", "") for p in item.content)))
        else:
            out.append((item.type, getattr(item, "call_id", "")))
    return out


async def test_lifecycle_through_the_sdk(client: AsyncOpenAI) -> None:
    """CONV-1..CONV-4: create (items, metadata), retrieve, update, items add / list / page /
    retrieve / delete, delete; every answer parsed by the SDK's own types."""
    conv = await client.conversations.create(
        items=[_user("one"), _user("two")], metadata={"topic": "demo"}
    )
    assert isinstance(conv, Conversation) and conv.object == "conversation"
    assert conv.id.startswith("conv_") and conv.metadata == {"topic": "demo"}
    again = await client.conversations.retrieve(conv.id)
    assert again.model_dump() == conv.model_dump()
    updated = await client.conversations.update(conv.id, metadata={"topic": "other"})
    assert updated.metadata == {"topic": "other"} and updated.created_at == conv.created_at
    added = await client.conversations.items.create(conv.id, items=[_user("three")])
    assert [item.type for item in added.data] == ["message"] and not added.has_more
    assert added.first_id == added.last_id == added.data[0].id
    assert await _texts(client, conv.id) == [("message", t) for t in ("one", "two", "three")]
    newest = await client.conversations.items.list(conv.id, limit=1)  # desc by default
    assert newest.has_more and newest.data[0].id == added.data[0].id
    page = await client.conversations.items.list(conv.id, order="asc", after=newest.data[0].id)
    assert page.data == [] and not page.has_more
    first = (await client.conversations.items.list(conv.id, order="asc", limit=1)).data[0]
    fetched = await client.conversations.items.retrieve(first.id, conversation_id=conv.id)
    assert fetched.model_dump() == first.model_dump()
    after_delete = await client.conversations.items.delete(first.id, conversation_id=conv.id)
    assert isinstance(after_delete, Conversation) and after_delete.id == conv.id
    assert await _texts(client, conv.id) == [("message", "two"), ("message", "three")]
    with pytest.raises(openai.NotFoundError) as missing_item:
        await client.conversations.items.retrieve(first.id, conversation_id=conv.id)
    assert missing_item.value.code == "item_not_found"
    deleted = await client.conversations.delete(conv.id)
    assert isinstance(deleted, ConversationDeletedResource) and deleted.deleted
    assert deleted.object == "conversation.deleted"
    for call in (
        client.conversations.retrieve(conv.id),
        client.conversations.items.list(conv.id),
        client.conversations.delete(conv.id),
    ):
        with pytest.raises(openai.NotFoundError) as gone:
            await call
        assert gone.value.code == "conversation_not_found"


@pytest.mark.parametrize("order", ["asc", "desc"])
async def test_item_pages_at_the_edge(client: AsyncOpenAI, order: Literal["asc", "desc"]) -> None:
    """CONV-3: ``has_more`` exactly at a page's edge. Three items: ``limit=3`` holds them all
    (no more), ``limit=2`` leaves one (more); after the first, two remain for ``limit=2`` (no
    more); after the last, an empty page (no more, ids ``""``)."""
    conv = await client.conversations.create(items=[_user("a"), _user("b"), _user("c")])
    whole = await client.conversations.items.list(conv.id, order=order, limit=3)
    texts = [_text(item) for item in whole.data]
    assert texts == (["a", "b", "c"] if order == "asc" else ["c", "b", "a"])
    assert whole.has_more is False
    ids = [item.id for item in whole.data]
    short = await client.conversations.items.list(conv.id, order=order, limit=2)
    assert [item.id for item in short.data] == ids[:2] and short.has_more is True
    rest = await client.conversations.items.list(conv.id, order=order, limit=2, after=ids[0])
    assert [item.id for item in rest.data] == ids[1:] and rest.has_more is False
    last = await client.conversations.items.list(conv.id, order=order, limit=1, after=ids[1])
    assert [item.id for item in last.data] == ids[2:] and last.has_more is False
    past = await client.conversations.items.list(conv.id, order=order, limit=3, after=ids[2])
    assert past.data == [] and past.has_more is False
    assert past.first_id == past.last_id == ""


def _text(item: Any) -> str:
    return "".join(getattr(part, "text", "") for part in item.content)


async def test_bad_requests_are_answered_clearly(client: AsyncOpenAI) -> None:
    """CONV-5, CONV-9: conversation with previous_response_id, a bad shape, an unknown id,
    too many items at once, bad list parameters."""
    conv = await client.conversations.create()
    first = await client.responses.create(model="gpt-x", input="hi")
    with pytest.raises(openai.BadRequestError) as both:
        await client.responses.create(
            model="gpt-x", input="x", conversation=conv.id, previous_response_id=first.id
        )
    assert both.value.code == "invalid_value" and both.value.param == "conversation"
    with pytest.raises(openai.BadRequestError) as shape:
        await client.responses.create(model="gpt-x", input="x", extra_body={"conversation": 5})
    assert shape.value.param == "conversation"
    with pytest.raises(openai.NotFoundError) as unknown:
        await client.responses.create(model="gpt-x", input="x", conversation="conv_nope")
    assert unknown.value.code == "conversation_not_found"
    assert unknown.value.param == "conversation"
    with pytest.raises(openai.BadRequestError) as many:
        await client.conversations.items.create(conv.id, items=[_user("x")] * 21)
    assert many.value.code == "too_many_items"
    with pytest.raises(openai.BadRequestError) as order:
        await client.conversations.items.list(conv.id, extra_query={"order": "up"})
    assert order.value.param == "order"


async def test_create_on_a_conversation_over_http(server: LiveServer, client: AsyncOpenAI) -> None:
    """CONV-5, CONV-6: the conversation's items are the context (the tool call the model made
    in the first response is what the second answers), input and output are appended when
    the response ends, the response names its conversation, and a continuation reads the
    stored response's context (here its parked rollout), not the items again."""
    conv = await client.conversations.create(items=[_user("You help with weather.")])
    first = await client.responses.create(
        model="gpt-x", input="weather in Oslo?", tools=[WEATHER], conversation=conv.id
    )
    assert first.conversation is not None and first.conversation.id == conv.id
    assert first.previous_response_id is None
    call = first.output[0]
    assert call.type == "function_call"
    second = await client.responses.create(
        model="gpt-x",
        input=[{"type": "function_call_output", "call_id": call.call_id, "output": "rain"}],
        tools=[WEATHER],
        conversation={"id": conv.id},
    )
    assert second.output_text.startswith("Based on the tool results")
    assert await _texts(client, conv.id) == [
        ("message", "You help with weather."),
        ("message", "weather in Oslo?"),
        ("function_call", call.call_id),
        ("function_call_output", call.call_id),
        ("message", second.output_text),
    ]
    counters = server.engine.counters
    assert counters["create.conversation"] == 1  # the first: the items, rendered
    # the second: the first response's rollout, parked at its end (PARK-4), not the items
    assert counters["create.unparked"] == 1


async def test_create_on_a_conversation_over_websocket(
    server: LiveServer, client: AsyncOpenAI
) -> None:
    """CONV-5, CONV-6 over ``responses.connect()``: the second create resumes the rollout the
    first suspended (the fast path), because the conversation's stored response is that one."""
    conv = await client.conversations.create()
    async with client.responses.connect() as conn:
        first = final(
            await create(conn, input="weather in Rome?", tools=[WEATHER], conversation=conv.id)
        )
        call = first.output[0]
        assert call.type == "function_call" and first.conversation is not None
        output = {"type": "function_call_output", "call_id": call.call_id, "output": "sun"}
        second = final(
            await create(conn, input=[output], tools=[WEATHER], conversation={"id": conv.id})
        )
    assert second.conversation is not None and second.conversation.id == conv.id
    assert second.output_text.startswith("Based on the tool results")
    assert len(await _texts(client, conv.id)) == 4
    assert server.engine.counters["create.fast_path"] == 1


async def test_added_items_and_unstored_responses_continue(
    server: LiveServer, client: AsyncOpenAI
) -> None:
    """CONV-6: items added through the items API, and a ``store: false`` response's items,
    come before the next input on top of the last stored response's context; once that
    response is deleted the conversation's items are rendered again."""
    conv = await client.conversations.create()
    first = await client.responses.create(model="gpt-x", input="a", conversation=conv.id)
    await client.conversations.items.create(conv.id, items=[_user("b")])
    await client.responses.create(model="gpt-x", input="c", conversation=conv.id, store=False)
    third = await client.responses.create(model="gpt-x", input="d", conversation=conv.id)
    assert third.usage is not None and first.usage is not None
    assert third.usage.input_tokens > first.usage.input_tokens
    texts = [text for _, text in await _texts(client, conv.id)]
    assert [t for t in texts if t in ("a", "b", "c", "d")] == ["a", "b", "c", "d"]
    assert len(texts) == 7  # a, answer, b, c, answer, d, answer
    await client.responses.delete(third.id)
    before = server.engine.counters["create.conversation"]
    fourth = await client.responses.create(model="gpt-x", input="e", conversation=conv.id)
    assert server.engine.counters["create.conversation"] == before + 1
    assert fourth.usage is not None and fourth.usage.input_tokens > third.usage.input_tokens


async def test_agents_sdk_conversations_session(server: LiveServer, client: AsyncOpenAI) -> None:
    """The Agents SDK's ``OpenAIConversationsSession``: the run's history lives in a
    conversation (items listed and added through the items API), and a second run sees it."""
    calls: list[str] = []
    agent = weather_agent(calls, model=OpenAIResponsesModel("gpt-x", client))
    session = OpenAIConversationsSession(openai_client=client)
    result = await Runner.run(agent, "Weather in Lima?", session=session)
    assert calls == ["Lima"] and "sunny in Lima" in str(result.final_output)
    items = await session.get_items()
    kinds = [item.get("type", "message") for item in items]
    assert kinds == ["message", "function_call", "function_call_output", "message"]
    await Runner.run(agent, "And in Quito?", session=session)
    assert calls == ["Lima", "Quito"]
    assert len(await session.get_items()) == 8
    popped = await session.pop_item()
    assert popped is not None and len(await session.get_items()) == 7
    await session.clear_session()


async def test_agents_sdk_runner_with_conversation_id(
    server: LiveServer, client: AsyncOpenAI
) -> None:
    """``Runner.run(conversation_id=…)``: the SDK sends ``conversation`` on every create and
    only the new items; the server's conversation holds the whole run (CONV-5)."""
    calls: list[str] = []
    agent = weather_agent(calls, model=OpenAIResponsesModel("gpt-x", client))
    conv = await client.conversations.create()
    result = await Runner.run(agent, "Weather in Cairo?", conversation_id=conv.id)
    assert calls == ["Cairo"] and "sunny in Cairo" in str(result.final_output)
    kinds = [kind for kind, _ in await _texts(client, conv.id)]
    assert kinds == ["message", "function_call", "function_call_output", "message"]


async def test_background_create_on_a_conversation(client: AsyncOpenAI) -> None:
    """CONV-5 with ``background: true``: the response runs detached and its items are in the
    conversation once it has ended."""
    conv = await client.conversations.create()
    started = await client.responses.create(
        model="gpt-x", input="hello there", conversation=conv.id, background=True
    )
    assert started.conversation is not None and started.conversation.id == conv.id

    async def ended() -> Any:
        polled = await client.responses.retrieve(started.id)
        return polled if polled.status not in ("queued", "in_progress") else None

    done = await wait_for(ended, "the background response to end")
    assert done.status == "completed"
    texts = await _texts(client, conv.id)
    assert texts == [("message", "hello there"), ("message", done.output_text)]


async def test_every_ending_lets_the_conversation_go(server_factory: Any) -> None:
    """CONV-7: a refused create (a tool output for no call), a warmup, and a streaming client
    that leaves mid-response all release the conversation: the next create on it runs, and
    only completed responses appended anything."""
    live = await server_factory(EngineConfig(tokens_per_second=40))
    async with sdk_client(live) as client:
        conv = await client.conversations.create()
        stray = {"type": "function_call_output", "call_id": "call_nope", "output": "x"}
        with pytest.raises(openai.BadRequestError):
            await client.responses.create(model="gpt-x", input=[stray], conversation=conv.id)
        warm = await client.responses.create(
            model="gpt-x", input="warm", conversation=conv.id, extra_body={"generate": False}
        )
        assert warm.output == []
        stream = await client.responses.create(
            model="gpt-x", input="a long story please", conversation=conv.id, stream=True
        )
        async for event in stream:
            if event.type == "response.output_text.delta":
                break
        await stream.close()  # the client leaves mid-response

        async def runs() -> Any:
            try:
                return await client.responses.create(
                    model="gpt-x", input="hi", conversation=conv.id
                )
            except openai.ConflictError as exc:
                assert exc.code == "conversation_locked"
                return None

        done = await wait_for(runs, "the conversation to be released")
        texts = [text for _, text in await _texts(client, conv.id)]
        assert texts == ["warm", "hi", done.output_text]


async def test_steered_response_hands_the_conversation_to_its_successor(
    server_factory: Any,
) -> None:
    """CONV-5, CONV-7 with steering (STEER-3): the steered response's items are appended when
    it ends, its successor holds the conversation until it ends too and appends its own (the
    steering input and its answer), and then the conversation is free."""
    gate = asyncio.Event()
    turns: list[list[ScriptStep]] = [
        [TextDelta("Once"), gate, TextDelta(" upon a time")],
        [TextDelta("Short answer.")],
        [TextDelta("Next.")],
    ]
    live = await server_factory(None, Router(routes={}, default=ScriptedModel(turns)))
    async with sdk_client(live) as client:
        conv = await client.conversations.create()
        async with client.responses.connect() as conn:
            await conn.response.create(model="m", input="Tell me a story", conversation=conv.id)
            created = await recv(conn)
            while (await recv(conn)).type != "response.output_text.delta":
                pass
            await conn.response.steer(previous_response_id=created.response.id, input="Be brief.")
            assert (await recv(conn)).type == "response.steer.accepted"
            gate.set()
            assert final(await until_done(conn)).status == "incomplete"  # the steered one
            successor = final(await until_done(conn))
            assert successor.output_text == "Short answer."
            then = final(await create(conn, model="m", input="Go on", conversation=conv.id))
        assert then.output_text == "Next."
        texts = [text for _, text in await _texts(client, conv.id)]
        assert texts == ["Tell me a story", "Once", "Be brief.", "Short answer.", "Go on", "Next."]


async def test_item_and_metadata_writes_are_refused_while_a_create_holds_it(
    server_factory: Any,
) -> None:
    """CONV-7: while a create on the conversation is mid-flight (its model held at a gate), the
    item and metadata routes (add items, replace metadata, delete an item, delete the
    conversation) are refused with 409 ``conversation_locked`` (param null) and write
    nothing: once the create has ended the conversation holds its first item, the create's
    input and answer, and its first metadata."""
    gate = asyncio.Event()
    turns: list[list[ScriptStep]] = [[TextDelta("Held"), gate, TextDelta(" answer.")]]
    live = await server_factory(None, Router(routes={}, default=ScriptedModel(turns)))
    async with sdk_client(live) as client:
        conv = await client.conversations.create(items=[_user("first")], metadata={"v": "1"})
        first = (await client.conversations.items.list(conv.id)).data[0]
        stream = await client.responses.create(
            model="m", input="go", conversation=conv.id, stream=True
        )
        try:
            async for event in stream:
                if event.type == "response.output_text.delta":
                    break  # the create holds the conversation now
            writes: list[Callable[[], Awaitable[object]]] = [
                lambda: client.conversations.items.create(conv.id, items=[_user("sneaked in")]),
                lambda: client.conversations.update(conv.id, metadata={"v": "2"}),
                lambda: client.conversations.items.delete(first.id, conversation_id=conv.id),
                lambda: client.conversations.delete(conv.id),
            ]
            for write in writes:
                with pytest.raises(openai.ConflictError) as refused:
                    await write()
                assert refused.value.status_code == 409
                assert refused.value.code == "conversation_locked"
                assert refused.value.param is None
        finally:
            gate.set()  # a failing check lets the held create end too
        ended = [event async for event in stream if event.type == "response.completed"]
        assert ended[0].response.output_text == "Held answer."
        assert (await client.conversations.retrieve(conv.id)).metadata == {"v": "1"}
        texts = [text for _, text in await _texts(client, conv.id)]
        assert texts == ["first", "go", "Held answer."]
