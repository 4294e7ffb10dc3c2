"""Items -> chat-completions request body (UP-CHAT-1..UP-CHAT-4), without any I/O."""

from __future__ import annotations

from typing import Any

from engine.models.upstreams.chat_wire import ChatOptions, build_body
from protocol.response import ToolChoiceFunction
from tests.upstream.sampling import request

CONVERSATION: list[dict[str, Any]] = [
    {"role": "developer", "content": "Answer in French."},
    {"role": "user", "content": "Weather in Paris and Rome?"},
    {"type": "reasoning", "id": "rs_1", "summary": [{"type": "summary_text", "text": "hmm"}]},
    {"role": "assistant", "content": [{"type": "output_text", "text": "Checking."}]},
    {
        "type": "function_call",
        "call_id": "c1",
        "name": "get_weather",
        "arguments": '{"city":"Paris"}',
    },
    {
        "type": "function_call",
        "call_id": "c2",
        "name": "get_weather",
        "arguments": '{"city":"Rome"}',
    },
    {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
    {
        "type": "function_call_output",
        "call_id": "c2",
        "output": [{"type": "input_text", "text": "rain"}],
    },
]


def test_full_conversation_maps_turn_by_turn() -> None:
    payload = build_body(request(CONVERSATION), ChatOptions(model="up"))
    assert payload.body["messages"] == [
        {"role": "system", "content": "Be brief."},
        {"role": "system", "content": "Answer in French."},
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {
            "role": "assistant",
            "content": "Checking.",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Paris"}'},
                },
                {
                    "id": "c2",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city":"Rome"}'},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        {"role": "tool", "tool_call_id": "c2", "content": "rain"},
    ]
    assert payload.dropped == {"reasoning": 1}
    assert payload.body["model"] == "up"


def test_stream_tools_and_settings() -> None:
    body = build_body(
        request(
            [{"role": "user", "content": "hi"}],
            parallel_tool_calls=False,
            max_output_tokens=64,
            temperature=0.2,
            top_p=0.9,
        ),
        ChatOptions(),
    ).body
    assert body["model"] == "client-model"  # no upstream name configured: passed through
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "description": "Weather",
                "parameters": {"type": "object"},
            },
        }
    ]
    assert body["tool_choice"] == "auto" and body["parallel_tool_calls"] is False
    assert body["max_tokens"] == 64 and "max_completion_tokens" not in body
    assert body["temperature"] == 0.2 and body["top_p"] == 0.9


def test_max_completion_tokens_field_and_developer_role() -> None:
    options = ChatOptions(max_tokens_field="max_completion_tokens", system_role="developer")
    body = build_body(request(CONVERSATION[:2], max_output_tokens=5), options).body
    assert body["max_completion_tokens"] == 5 and "max_tokens" not in body
    assert [m["role"] for m in body["messages"]] == ["developer", "developer", "user"]


def test_tool_choice_variants_and_no_tools() -> None:
    named = build_body(
        request(CONVERSATION[:2], tool_choice=ToolChoiceFunction("get_weather")), ChatOptions()
    ).body
    assert named["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    required = build_body(request(CONVERSATION[:2], tool_choice="required"), ChatOptions()).body
    assert required["tool_choice"] == "required"
    bare = build_body(request(CONVERSATION[:2], tools=[], instructions=None), ChatOptions()).body
    # Servers reject tool_choice / parallel_tool_calls without tools, so none are sent.
    assert not {"tools", "tool_choice", "parallel_tool_calls"} & set(bare)
    assert bare["messages"][0] == {"role": "system", "content": "Answer in French."}
    assert "temperature" not in bare and "max_tokens" not in bare


def test_params_are_defaults_and_cannot_override_owned_fields() -> None:
    options = ChatOptions(params={"temperature": 0.7, "top_k": 20, "stream": False, "n": 3})
    body = build_body(request(CONVERSATION[:2], temperature=0.1), options).body
    assert body["temperature"] == 0.1  # the request wins
    assert body["top_k"] == 20
    assert body["stream"] is True and "n" not in body


def test_images_become_image_url_parts_and_unmappable_media_is_counted() -> None:
    items: list[dict[str, Any]] = [
        {
            "role": "user",
            "content": [
                {"type": "input_text", "text": "What is this?"},
                {"type": "input_image", "image_url": "data:image/png;base64,AAAA"},
                {"type": "input_image", "file_id": "file_1"},
            ],
        },
        {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
        {
            "type": "function_call_output",
            "call_id": "c1",
            "output": [
                {"type": "input_text", "text": "chart:"},
                {"type": "input_image", "image_url": "https://x/y.png"},
            ],
        },
    ]
    payload = build_body(request(items, instructions=None), ChatOptions())
    user, _, tool = payload.body["messages"]
    assert user["content"] == [
        {"type": "text", "text": "What is this?"},
        {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA", "detail": "auto"}},
    ]
    assert tool == {"role": "tool", "tool_call_id": "c1", "content": "chart:"}
    assert payload.dropped == {"image_file_id": 1, "tool_output_media": 1}


def test_only_function_tools_reach_a_chat_server() -> None:
    """TOOL-4, UP-CHAT-1: functions (also those inside a namespace) are sent; custom and hosted
    tools cannot be called by a chat server and are counted as dropped."""
    from dataclasses import replace

    import msgspec

    from protocol.tools import parse_tools
    from tests.conformance.samples import ALL_TOOLS

    tools = parse_tools([msgspec.Raw(msgspec.json.encode(t)) for t in ALL_TOOLS])
    base = request([{"role": "user", "content": "hi"}])
    payload = build_body(replace(base, tools=tools), ChatOptions())
    names = [t["function"]["name"] for t in payload.body["tools"]]
    assert names == ["get_weather", "lookup"]
    assert payload.dropped["tool.custom"] == 2  # apply_patch and docs.grep_docs
    assert payload.dropped["tool.web_search"] == 1 and payload.dropped["tool.mcp"] == 1
