"""HTTP conformance: the official ``openai`` SDK (3.51) as client and oracle, over HTTP and SSE.

Each test drives the real server through ``AsyncOpenAI(base_url=...)`` and checks what the SDK
sees (PROTOCOL.md §4, §5, §6, §10). Every event the server emitted is also parsed with the SDK's
models at teardown by the autouse ``sdk_oracle`` fixture. Each test's docstring names the SPEC.md
rules it checks.
"""

from __future__ import annotations

import asyncio
from typing import Any, Literal

import aiohttp
import msgspec
import openai
import pydantic
import pytest
from openai import AsyncOpenAI
from openai.types.responses import ResponseItem

from engine.server.transport.server_config import ServerConfig
from tests.support.server import LiveServer
from tests.support.tools import WEATHER

MODEL = "gpt-x"
TERMINAL = {"response.completed", "response.failed", "response.incomplete"}


def call_output(call_id: str, output: str) -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call_id, "output": output}


def item_reference(item_id: str) -> dict[str, Any]:
    return {"type": "item_reference", "id": item_id}


# ----------------------------------------------------------------------------- plain create


async def test_http_create_returns_completed_response(client: AsyncOpenAI) -> None:
    """HTTP-2, RESP-1, RESP-4: a JSON create returns the terminal Response with full usage."""
    response = await client.responses.create(model=MODEL, input="Say hi")
    assert response.object == "response"
    assert response.id.startswith("resp_")
    assert response.status == "completed"
    assert response.model == MODEL
    assert response.output_text == "This is a simulated answer to: Say hi"
    message = response.output[0]
    assert message.type == "message" and message.role == "assistant"
    assert message.status == "completed"
    assert message.id.startswith("msg_")
    assert response.error is None and response.incomplete_details is None
    assert response.store is True
    assert response.usage is not None
    usage = response.usage
    assert usage.input_tokens > 0 and usage.output_tokens > 0
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert usage.input_tokens_details.cached_tokens == 0
    assert usage.output_tokens_details.reasoning_tokens == 0
    assert response.completed_at is not None and response.completed_at >= response.created_at


# ----------------------------------------------------------------------------- streaming (SSE)


async def test_http_stream_sequence_numbers_consecutive_created_first_one_terminal_last(
    client: AsyncOpenAI,
) -> None:
    """HTTP-3, ORD-1, ORD-2, ORD-3, ORD-5, ORD-7 over SSE, as the SDK's ``AsyncStream`` sees it."""
    stream = await client.responses.create(model=MODEL, input="Stream me please", stream=True)
    events = [event async for event in stream]
    types = [e.type for e in events]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert types[0] == "response.created"
    assert types[1] == "response.in_progress"
    assert types[-1] == "response.completed"
    assert sum(t in TERMINAL for t in types) == 1
    created = events[0].response
    assert created.status == "in_progress" and created.output == [] and created.usage is None
    ids = {e.response.id for e in events if hasattr(e, "response")}
    assert ids == {created.id}  # every lifecycle event names the same response
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == events[-1].response.output_text
    assert types.index("response.output_item.added") < types.index("response.content_part.added")
    assert types.index("response.content_part.added") < types.index("response.output_text.delta")
    assert types.index("response.output_text.done") < types.index("response.output_item.done")


async def test_http_stream_sse_event_name_equals_type(server: LiveServer) -> None:
    """Raw SSE framing: ``event:`` equals the JSON ``type``; the stream ends at the terminal."""
    url = f"{server.base_url}/responses"
    body = {"model": MODEL, "input": "Frame check", "stream": True}
    async with (
        aiohttp.ClientSession() as http,
        http.post(url, json=body, headers={"Authorization": "Bearer x"}) as resp,
    ):
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        assert resp.headers["Cache-Control"] == "no-cache"
        raw = (await resp.read()).decode()
    blocks = [b for b in raw.split("\n\n") if b.strip()]
    assert blocks
    for block in blocks:
        lines = block.split("\n")
        assert lines[0].startswith("event: ") and lines[1].startswith("data: ")
        data = msgspec.json.decode(lines[1][len("data: ") :])
        assert data["type"] == lines[0][len("event: ") :]
    assert "[DONE]" not in raw
    assert msgspec.json.decode(blocks[-1].split("\n")[1][6:])["type"] == "response.completed"


async def test_http_stream_helper_get_final_response(client: AsyncOpenAI) -> None:
    """The SDK's stream accumulator (strict ordering checks) rebuilds the final response."""
    async with client.responses.stream(model=MODEL, input="Helper stream") as stream:
        deltas = [e.delta async for e in stream if e.type == "response.output_text.delta"]
        final = await stream.get_final_response()
    assert final.status == "completed"
    assert final.output_text == "".join(deltas) == "This is a simulated answer to: Helper stream"


async def test_http_stream_function_call_events(client: AsyncOpenAI) -> None:
    """ORD-5 for a function call, through the SDK stream helper."""
    async with client.responses.stream(
        model=MODEL, input="Weather in Paris?", tools=[WEATHER]
    ) as stream:
        events = [e async for e in stream]
        final = await stream.get_final_response()
    call = final.output[0]
    assert call.type == "function_call" and call.name == "get_weather"
    assert call.arguments == '{"city":"Paris"}'
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert len(done) == 1 and done[0].arguments == call.arguments and done[0].item_id == call.id
    deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    assert "".join(deltas) == call.arguments


# ----------------------------------------------------------------------------- state over HTTP


async def test_http_function_call_round_trip_previous_response_id(
    client: AsyncOpenAI, server: LiveServer
) -> None:
    """PARK-4, HTTP-5: over HTTP a continuation of a recent response of this process resumes
    its parked rollout (HYD-1 with parking off, COMPAT-4 with the cache off too)."""
    first = await client.responses.create(model=MODEL, input="Weather in Paris?", tools=[WEATHER])
    call = first.output[0]
    assert call.type == "function_call"
    assert call.call_id.startswith("call_") and call.id.startswith("fc_")
    assert call.call_id != call.id
    assert call.status == "completed"
    assert first.status == "completed"
    second = await client.responses.create(
        model=MODEL,
        previous_response_id=first.id,
        input=[call_output(call.call_id, "sunny")],
        tools=[WEATHER],
    )
    assert second.status == "completed"
    assert second.previous_response_id == first.id
    assert second.output_text == "Based on the tool results: sunny"
    assert server.engine.counters["create.unparked"] == 1


async def test_http_continuation_with_full_history_without_previous_id(client: AsyncOpenAI) -> None:
    """Stateless replay (what the Agents SDK does by default): the call item is echoed back."""
    first = await client.responses.create(model=MODEL, input="Weather in Oslo?", tools=[WEATHER])
    call = first.output[0]
    second = await client.responses.create(
        model=MODEL,
        input=[
            {"role": "user", "content": "Weather in Oslo?"},
            call.model_dump(exclude_none=True),
            call_output(call.call_id, "snow"),
        ],
        tools=[WEATHER],
        store=False,
    )
    assert second.output_text == "Based on the tool results: snow"
    assert second.store is False


async def test_http_retrieve_then_delete_then_not_found(client: AsyncOpenAI) -> None:
    """HTTP-6: retrieve, delete, then 404 for both."""
    created = await client.responses.create(model=MODEL, input="Keep me")
    fetched = await client.responses.retrieve(created.id)
    assert fetched.id == created.id
    assert fetched.status == "completed"
    assert fetched.output_text == created.output_text
    await client.responses.delete(created.id)
    with pytest.raises(openai.NotFoundError) as info:
        await client.responses.retrieve(created.id)
    assert info.value.status_code == 404
    with pytest.raises(openai.NotFoundError):
        await client.responses.delete(created.id)


async def test_http_store_false_is_not_retrievable(client: AsyncOpenAI) -> None:
    """STORE-1, HTTP-5: store=false is neither retrievable nor continuable over HTTP."""
    created = await client.responses.create(model=MODEL, input="Forget me", store=False)
    assert created.store is False
    with pytest.raises(openai.NotFoundError):
        await client.responses.retrieve(created.id)
    with pytest.raises(openai.BadRequestError) as info:
        await client.responses.create(model=MODEL, previous_response_id=created.id, input="again")
    assert info.value.code == "previous_response_not_found"


async def test_http_input_items_listing_order_and_pagination(client: AsyncOpenAI) -> None:
    """HTTP-6: ``order``, ``limit``, ``has_more`` and SDK auto-pagination via ``after``."""
    created = await client.responses.create(
        model=MODEL,
        input=[
            {"role": "developer", "content": "Be brief."},
            {"role": "user", "content": "First question"},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Q2"}]},
        ],
    )
    page = await client.responses.input_items.list(created.id)
    assert page.object == "list"
    assert page.has_more is False
    assert [item.type for item in page.data] == ["message"] * 3
    assert [item.role for item in page.data] == ["user", "user", "developer"]  # default desc
    assert all(item.id for item in page.data)
    assert page.first_id == page.data[0].id and page.last_id == page.data[-1].id
    asc = await client.responses.input_items.list(created.id, order="asc")
    assert [i.id for i in asc.data] == [i.id for i in reversed(page.data)]
    assert asc.data[0].role == "developer"
    one = await client.responses.input_items.list(created.id, limit=1, order="asc")
    assert len(one.data) == 1 and one.has_more is True
    walked = [item.id async for item in client.responses.input_items.list(created.id, limit=1)]
    assert walked == [i.id for i in page.data]  # auto-pagination via ``after``


@pytest.mark.parametrize("order", ["asc", "desc"])
async def test_http_input_items_pages_at_the_edge(
    client: AsyncOpenAI, order: Literal["asc", "desc"]
) -> None:
    """HTTP-6: ``has_more`` exactly at a page's edge. Three input items: ``limit=3`` holds them
    all (no more), ``limit=2`` leaves one (more); after the first, two remain for ``limit=2``
    (no more); after the last, an empty page (no more)."""
    created = await client.responses.create(
        model=MODEL,
        input=[{"role": "user", "content": text} for text in ("a", "b", "c")],
    )
    listing = client.responses.input_items
    whole = await listing.list(created.id, order=order, limit=3)
    texts = [item.content[0].text for item in whole.data if item.type == "message"]
    assert texts == (["a", "b", "c"] if order == "asc" else ["c", "b", "a"])
    assert whole.has_more is False
    ids = [item.id for item in whole.data]
    short = await listing.list(created.id, order=order, limit=2)
    assert [item.id for item in short.data] == ids[:2] and short.has_more is True
    rest = await listing.list(created.id, order=order, limit=2, after=ids[0])
    assert [item.id for item in rest.data] == ids[1:] and rest.has_more is False
    last = await listing.list(created.id, order=order, limit=1, after=ids[1])
    assert [item.id for item in last.data] == ids[2:] and last.has_more is False
    past = await listing.list(created.id, order=order, limit=3, after=ids[2])
    assert past.data == [] and past.has_more is False


async def test_http_input_items_validate_as_sdk_response_items(server: LiveServer) -> None:
    """HTTP-6, PROTOCOL §10.5: listed items have ids, ``status`` and list ``content``, and
    validate strictly as the SDK's ``ResponseItem``."""
    sdk = AsyncOpenAI(base_url=server.base_url, api_key="x", max_retries=0)
    first = await sdk.responses.create(model=MODEL, input="Weather in Bern?", tools=[WEATHER])
    call = first.output[0]
    second = await sdk.responses.create(
        model=MODEL,
        previous_response_id=first.id,
        input=[
            call_output(call.call_id, "cold"),
            {"role": "user", "content": "Thanks"},
        ],
    )
    await sdk.close()
    adapter = pydantic.TypeAdapter(ResponseItem)
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"{server.base_url}/responses/{second.id}/input_items?order=asc") as resp,
    ):
        listing = await resp.json()
    assert [item["type"] for item in listing["data"]] == ["function_call_output", "message"]
    for item in listing["data"]:
        adapter.validate_python(item)
        assert item["status"] == "completed"
    assert listing["data"][1]["content"] == [{"type": "input_text", "text": "Thanks"}]


async def test_http_input_items_unknown_response_not_found(client: AsyncOpenAI) -> None:
    """HTTP-6: unknown id is 404."""
    with pytest.raises(openai.NotFoundError):
        await client.responses.input_items.list("resp_doesnotexist")


# ----------------------------------------------------------------------------- errors


async def test_http_unknown_previous_response_id_is_400_previous_response_not_found(
    client: AsyncOpenAI,
) -> None:
    """COMPAT-4, ERR-2: the SDK raises BadRequestError with code and param."""
    with pytest.raises(openai.BadRequestError) as info:
        await client.responses.create(model=MODEL, previous_response_id="resp_nope", input="hi")
    err = info.value
    assert err.status_code == 400
    assert err.code == "previous_response_not_found"
    assert err.param == "previous_response_id"
    assert err.type == "invalid_request_error"
    assert "resp_nope" in err.message


async def test_http_invalid_body_is_400_with_param(client: AsyncOpenAI) -> None:
    """CODEC-3, ERR-2, ERR-3: a wrong type names the field, no internal text."""
    with pytest.raises(openai.BadRequestError) as info:
        await client.responses.create(model=MODEL, input="hi", max_output_tokens="x")
    err = info.value
    assert err.status_code == 400
    assert err.param == "max_output_tokens"
    assert err.type == "invalid_request_error"
    assert err.code is not None
    assert "msgspec" not in err.message and "Traceback" not in err.message


async def test_http_invalid_input_item_param_is_json_path(client: AsyncOpenAI) -> None:
    """CODEC-3, CODEC-4: item errors carry ``input[i]…`` paths."""
    with pytest.raises(openai.BadRequestError) as info:
        await client.responses.create(
            model=MODEL,
            input=[
                {"role": "user", "content": "ok"},
                {"type": "function_call_output", "output": "missing call id"},
            ],
        )
    assert info.value.param is not None and info.value.param.startswith("input[1]")


async def test_http_invalid_json_body_is_400(server: LiveServer) -> None:
    """ERR-2: the JSON error envelope for an undecodable body."""
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            f"{server.base_url}/responses",
            data=b"{not json",
            headers={"Content-Type": "application/json", "Authorization": "Bearer x"},
        ) as resp,
    ):
        assert resp.status == 400
        body = await resp.json()
    assert set(body) == {"error"}
    assert body["error"]["type"] == "invalid_request_error"
    assert isinstance(body["error"]["code"], str)
    assert {"message", "param"} <= set(body["error"])


async def test_http_tool_output_for_unknown_call_is_400(client: AsyncOpenAI) -> None:
    """VAL-1 over HTTP."""
    first = await client.responses.create(model=MODEL, input="Weather in Rome?", tools=[WEATHER])
    with pytest.raises(openai.BadRequestError) as info:
        await client.responses.create(
            model=MODEL,
            previous_response_id=first.id,
            input=[{"type": "function_call_output", "call_id": "call_bogus", "output": "x"}],
            tools=[WEATHER],
        )
    assert info.value.param is not None and info.value.param.startswith("input")


# ----------------------------------------------------------------------------- limits / incomplete


async def test_http_max_output_tokens_gives_incomplete(client: AsyncOpenAI) -> None:
    """SIM-5, ORD-8, RESP-3: ``incomplete`` / ``max_output_tokens``, open item kept incomplete."""
    response = await client.responses.create(
        model=MODEL, input="Tell me a long story about dragons", max_output_tokens=3
    )
    assert response.status == "incomplete"
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.max_output_tokens == 3
    assert response.usage is not None and response.usage.output_tokens == 3
    message = response.output[0]
    assert message.status == "incomplete"


async def test_http_max_output_tokens_streamed_terminal_is_incomplete(client: AsyncOpenAI) -> None:
    """ORD-7 for an incomplete SSE stream."""
    stream = await client.responses.create(
        model=MODEL, input="Tell me a long story", max_output_tokens=2, stream=True
    )
    events = [e async for e in stream]
    assert events[-1].type == "response.incomplete"
    assert sum(e.type in TERMINAL for e in events) == 1
    assert events[-1].response.incomplete_details.reason == "max_output_tokens"
    assert [e.sequence_number for e in events] == list(range(len(events)))


# ----------------------------------------------------------------------------- input shapes


async def test_http_string_input_equals_list_input(client: AsyncOpenAI) -> None:
    """ITEM-1, ITEM-2: string, easy-form and typed messages are the same input."""
    text = "Compare inputs"
    as_string = await client.responses.create(model=MODEL, input=text)
    easy = await client.responses.create(model=MODEL, input=[{"role": "user", "content": text}])
    typed = await client.responses.create(
        model=MODEL,
        input=[
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
        ],
    )
    assert as_string.output_text == easy.output_text == typed.output_text
    assert as_string.usage.input_tokens == easy.usage.input_tokens == typed.usage.input_tokens


async def test_http_instructions_echoed_and_not_inherited(client: AsyncOpenAI) -> None:
    """RESP-2, COMPAT-6."""
    first = await client.responses.create(model=MODEL, input="hi", instructions="Be terse.")
    assert first.instructions == "Be terse."
    second = await client.responses.create(
        model=MODEL, input="again", previous_response_id=first.id
    )
    assert second.instructions is None


async def test_http_messages_without_type_field_accepted(client: AsyncOpenAI) -> None:
    """ITEM-2."""
    response = await client.responses.create(
        model=MODEL,
        input=[
            {"role": "user", "content": "Earlier question"},
            {"role": "assistant", "content": "Earlier answer"},
            {"role": "user", "content": "No type field here"},
        ],
    )
    assert response.output_text == "This is a simulated answer to: No type field here"


async def test_http_developer_and_system_roles_accepted(client: AsyncOpenAI) -> None:
    """ITEM-3: system and developer messages."""
    response = await client.responses.create(
        model=MODEL,
        input=[
            {"type": "message", "role": "system", "content": [{"type": "input_text", "text": "S"}]},
            {"type": "message", "role": "developer", "content": "Developer rules."},
            {"role": "user", "content": "Role question"},
        ],
    )
    assert response.status == "completed"
    assert response.output_text == "This is a simulated answer to: Role question"


async def test_http_assistant_replay_with_output_text_accepted(client: AsyncOpenAI) -> None:
    """ITEM-3, LEN-2: a replayed assistant output message."""
    first = await client.responses.create(model=MODEL, input="Original")
    replay = first.output[0].model_dump(exclude_none=True)
    second = await client.responses.create(
        model=MODEL,
        input=[
            {"role": "user", "content": "Original"},
            replay,
            {"role": "user", "content": "Follow up"},
        ],
    )
    assert second.output_text == "This is a simulated answer to: Follow up"


async def test_http_item_reference_to_earlier_item(client: AsyncOpenAI) -> None:
    """An ``item_reference`` names an item of the conversation continued by previous_response_id."""
    first = await client.responses.create(model=MODEL, input="Weather in Lima?", tools=[WEATHER])
    call = first.output[0]
    second = await client.responses.create(
        model=MODEL,
        previous_response_id=first.id,
        input=[
            call_output(call.call_id, "warm"),
            item_reference(call.id),
        ],
    )
    assert second.status == "completed"


async def test_http_item_reference_within_same_request(client: AsyncOpenAI) -> None:
    """ITEM-4: a reference to an item of the same request."""
    response = await client.responses.create(
        model=MODEL,
        input=[
            {"type": "message", "id": "msg_local1", "role": "user", "content": "Referenced text"},
            {"type": "item_reference", "id": "msg_local1"},
        ],
    )
    assert response.output_text == "This is a simulated answer to: Referenced text"


async def test_http_item_reference_unknown_is_400(client: AsyncOpenAI) -> None:
    """ITEM-4: unknown id is 400 item_not_found at ``input[i].id``."""
    with pytest.raises(openai.BadRequestError) as info:
        await client.responses.create(
            model=MODEL,
            input=[
                {"role": "user", "content": "hi"},
                {"type": "item_reference", "id": "msg_missing"},
            ],
        )
    assert info.value.param == "input[1].id"


async def test_http_item_reference_to_stored_item_outside_conversation_is_not_found(
    client: AsyncOpenAI,
) -> None:
    """ITEM-4 (SPEC §15 item 10, a documented deviation from PROTOCOL §6): a reference resolves
    only within the continued conversation and the same request, not in the whole store."""
    first = await client.responses.create(model=MODEL, input="Weather in Kyiv?", tools=[WEATHER])
    call = first.output[0]
    with pytest.raises(openai.BadRequestError) as info:
        await client.responses.create(
            model=MODEL,
            input=[
                {"role": "user", "content": "Weather in Kyiv?"},
                item_reference(call.id),
                call_output(call.call_id, "mild"),
            ],
        )
    assert info.value.code == "item_not_found"
    assert info.value.param == "input[1].id"


async def test_http_reasoning_item_replay_passes_through(client: AsyncOpenAI) -> None:
    """ITEM-5: reasoning replay accepted, stored and listed intact."""
    reasoning = {
        "type": "reasoning",
        "id": "rs_replayed1",
        "summary": [{"type": "summary_text", "text": "thinking about it"}],
        "encrypted_content": "opaque-blob==",
    }
    response = await client.responses.create(
        model=MODEL,
        input=[
            {"role": "user", "content": "Earlier"},
            reasoning,
            {"type": "message", "role": "assistant", "content": "Earlier answer"},
            {"role": "user", "content": "With reasoning"},
        ],
        include=["reasoning.encrypted_content"],
    )
    assert response.output_text == "This is a simulated answer to: With reasoning"
    items = await client.responses.input_items.list(response.id, order="asc")
    replayed = items.data[1]
    assert replayed.type == "reasoning"
    assert replayed.id == "rs_replayed1"
    assert replayed.encrypted_content == "opaque-blob=="
    assert replayed.summary[0].text == "thinking about it"


async def test_http_unknown_fields_are_ignored(client: AsyncOpenAI) -> None:
    """LEN-1, LEN-2, RESP-2."""
    response = await client.responses.create(
        model=MODEL,
        input="Extras",
        prompt_cache_key="k1",
        metadata={"run": "1"},
        temperature=0.5,
        top_p=0.9,
        extra_body={"client_metadata": {"a": "b"}, "totally_unknown_field": 1},
    )
    assert response.status == "completed"
    assert response.metadata == {"run": "1"}
    assert response.temperature == 0.5 and response.top_p == 0.9
    assert response.prompt_cache_key == "k1"


async def test_http_request_settings_echoed_in_response(client: AsyncOpenAI) -> None:
    """RESP-2: every echo-only setting comes back in the Response."""
    response = await client.responses.create(
        model=MODEL,
        input="Weather in Bonn?",
        tools=[WEATHER],
        tool_choice="required",
        parallel_tool_calls=False,
        max_output_tokens=50,
        temperature=0.2,
        top_p=0.5,
        top_logprobs=2,
        truncation="auto",
        reasoning={"effort": "low"},
        text={"format": {"type": "text"}, "verbosity": "low"},
        user="user-1",
        safety_identifier="safe-1",
        metadata={"k": "v"},
    )
    assert response.tool_choice == "required"
    assert response.parallel_tool_calls is False
    assert [t.name for t in response.tools] == ["get_weather"]
    assert response.tools[0].strict is True
    assert response.max_output_tokens == 50
    assert (response.temperature, response.top_p, response.top_logprobs) == (0.2, 0.5, 2)
    assert response.truncation == "auto"
    assert response.reasoning is not None and response.reasoning.effort == "low"
    assert response.text is not None and response.text.verbosity == "low"
    assert response.user == "user-1" and response.safety_identifier == "safe-1"
    assert response.metadata == {"k": "v"}
    assert response.background is False


async def test_http_streamed_request_error_is_plain_http_400(client: AsyncOpenAI) -> None:
    """A request rejected before creation is an HTTP error, not an SSE stream (ERR-2)."""
    with pytest.raises(openai.BadRequestError) as info:
        await client.responses.create(
            model=MODEL, previous_response_id="resp_nope", input="hi", stream=True
        )
    assert info.value.code == "previous_response_not_found"


async def test_http_cancel_non_background_response_is_rejected(client: AsyncOpenAI) -> None:
    """HTTP-6: cancel is 400 for a stored response, 404 for an unknown one."""
    created = await client.responses.create(model=MODEL, input="done already")
    with pytest.raises(openai.BadRequestError):
        await client.responses.cancel(created.id)
    with pytest.raises(openai.NotFoundError):
        await client.responses.cancel("resp_nope")


async def test_http_get_responses_without_upgrade_is_json_error(server: LiveServer) -> None:
    """HTTP-1: GET /v1/responses without an upgrade."""
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"{server.base_url}/responses") as resp,
    ):
        assert resp.status == 400
        body = await resp.json()
    assert body["error"]["code"] == "websocket_upgrade_required"


async def test_http_ignores_stream_id(client: AsyncOpenAI) -> None:
    """WS-2, HTTP-5: ``stream_id`` is WebSocket-only; over HTTP it is ignored, never echoed."""
    stream = await client.responses.create(
        model=MODEL, input="No lanes here", stream=True, extra_body={"stream_id": "main"}
    )
    events = [e async for e in stream]
    assert events[-1].type == "response.completed"
    assert all(getattr(e, "stream_id", None) is None for e in events)


async def test_http_append_mode_is_unsupported(client: AsyncOpenAI) -> None:
    """HTTP-5, APPEND-1: append mode needs the socket."""
    with pytest.raises(openai.BadRequestError) as info:
        await client.responses.create(model=MODEL, input="x", extra_body={"rollout_mode": "append"})
    assert info.value.code == "unsupported_parameter"
    assert info.value.param == "rollout_mode"


async def test_http_parallel_continuations_of_one_stored_parent(client: AsyncOpenAI) -> None:
    """COMPAT-4: a stored response can be continued more than once (branches), concurrently."""
    first = await client.responses.create(model=MODEL, input="Weather in Riga?", tools=[WEATHER])
    call = first.output[0]
    branches = await asyncio.gather(
        *(
            client.responses.create(
                model=MODEL,
                previous_response_id=first.id,
                input=[call_output(call.call_id, weather)],
                tools=[WEATHER],
            )
            for weather in ("rain", "snow", "fog")
        )
    )
    assert [b.output_text for b in branches] == [
        f"Based on the tool results: {weather}" for weather in ("rain", "snow", "fog")
    ]


async def test_http_api_key_checked(server_factory: Any) -> None:
    """AUTH-2: with keys configured a wrong key is 401 ``invalid_api_key`` (the SDK's
    ``AuthenticationError``, not retried); the right key works."""
    live: LiveServer = await server_factory(server=ServerConfig(api_keys=frozenset({"sk-good"})))
    bad = AsyncOpenAI(base_url=live.base_url, api_key="sk-bad")
    good = AsyncOpenAI(base_url=live.base_url, api_key="sk-good", max_retries=0)
    try:
        with pytest.raises(openai.AuthenticationError) as info:
            await bad.responses.create(model=MODEL, input="x")
        assert info.value.status_code == 401 and info.value.code == "invalid_api_key"
        assert (await good.responses.create(model=MODEL, input="x")).status == "completed"
    finally:
        await bad.close()
        await good.close()
