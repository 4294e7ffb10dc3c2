"""Responses items -> a chat-completions request body (pure; SPEC: UP-CHAT-1..UP-CHAT-4).

Mapping, per item:
* instructions (the rollout header)       -> a leading ``system`` message
* ``message`` system/developer            -> ``system`` (or ``developer``, per config)
* ``message`` user                        -> ``user``; text parts become one string, images
                                             become ``image_url`` parts, files ``file`` parts
* ``message`` assistant                   -> ``assistant`` (output_text and refusal as text)
* ``function_call``                       -> ``tool_calls`` on the assistant message it
                                             follows (several calls share one message)
* ``function_call_output``                -> ``tool`` message with ``tool_call_id``
* ``custom_tool_call`` / its output       -> like a function call (``arguments`` = the input)
* ``reasoning``, opaque                    -> dropped (chat has no place for them), counted;
                                             with ``reasoning_field`` (the ``tokens`` route's
                                             templates, REASON-4) reasoning text rides on the
                                             assistant message that follows it
* ``compaction``                            -> a ``user`` message with the summary
* tools: functions (those inside namespaces too); custom and hosted tools are dropped and
  counted (``tool.<type>``): chat servers cannot call them (TOOL-4)
Things the chat format cannot carry are dropped and counted in ``ChatPayload.dropped`` (images
in tool outputs, image parts given only by ``file_id``), which the backend exposes as stats.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Literal

from engine.conversation.compaction import summary_text
from engine.models.base import SampleRequest
from protocol.items import (
    Compaction,
    ContentPart,
    CustomToolCall,
    FunctionCall,
    InputFile,
    InputImage,
    InputItem,
    Message,
    OpaqueItem,
    Reasoning,
    ToolOutput,
    reasoning_text,
    text_of,
)
from protocol.tools import CallableTool, FunctionTool, ToolChoice, ToolChoiceFunction, Toolset

ChatMessage = dict[str, Any]
MaxTokensField = Literal["max_tokens", "max_completion_tokens"]
# Fields the engine owns; ``params`` from the config can never override them.
RESERVED = frozenset({"model", "messages", "stream", "stream_options", "tools", "n"})


@dataclass(frozen=True)
class ChatOptions:
    """Per-route mapping choices (from the config file)."""

    model: str | None = None  # None: pass the client's model name through
    max_tokens_field: MaxTokensField = "max_tokens"
    system_role: Literal["system", "developer"] = "system"
    params: dict[str, Any] = field(default_factory=dict)
    # The key under which reasoning items' text joins the next assistant message (None: they
    # are dropped). Chat templates read it as ``reasoning_content`` (REASON-4).
    reasoning_field: str | None = None


@dataclass
class ChatPayload:
    body: dict[str, Any]
    dropped: Counter[str] = field(default_factory=Counter)


def build_body(request: SampleRequest, options: ChatOptions) -> ChatPayload:
    dropped: Counter[str] = Counter()
    header = request.context.header_key
    instructions = header[0] if header is not None else None
    body: dict[str, Any] = {
        "model": options.model or request.model,
        "messages": messages_for(request.context.items, instructions, options, dropped),
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    tools = functions_for(request.tools, dropped)
    if tools:
        body["tools"] = tools
        body["tool_choice"] = tool_choice_for(request.tool_choice)
        body["parallel_tool_calls"] = request.parallel_tool_calls
    if request.max_output_tokens is not None:
        body[options.max_tokens_field] = request.max_output_tokens
    if request.temperature is not None:
        body["temperature"] = request.temperature
    if request.top_p is not None:
        body["top_p"] = request.top_p
    for key, value in options.params.items():
        if key not in RESERVED:
            body.setdefault(key, value)  # the request's own settings win over config defaults
    return ChatPayload(body, dropped)


def messages_for(
    items: list[InputItem],
    instructions: str | None,
    options: ChatOptions,
    dropped: Counter[str],
) -> list[ChatMessage]:
    out: list[ChatMessage] = []
    if instructions:
        out.append({"role": options.system_role, "content": instructions})
    thinking: list[str] = []  # reasoning waiting for the assistant message it precedes
    for item in items:
        if isinstance(item, Reasoning) and options.reasoning_field is not None:
            thinking.append(reasoning_text(item))
            continue
        if isinstance(item, Message):
            out.append(_message(item, options, dropped))
        elif isinstance(item, FunctionCall | CustomToolCall):
            _attach_call(out, item)
        elif isinstance(item, ToolOutput):
            out.append(_tool_result(item, dropped))
        elif isinstance(item, Reasoning):
            dropped["reasoning"] += 1
        elif isinstance(item, Compaction):  # COMPACT-5: the model reads the summary
            summary = f"Summary of the earlier conversation:\n{summary_text(item)}"
            out.append({"role": "user", "content": summary})
        elif isinstance(item, OpaqueItem):
            dropped[item.type] += 1
        # item_reference never reaches a backend: the pipeline resolves it first.
        if thinking:
            _attach_reasoning(out, item, thinking, options.reasoning_field)
    return out


def _attach_reasoning(
    out: list[ChatMessage], item: InputItem, thinking: list[str], key: str | None
) -> None:
    """Reasoning belongs to the assistant message made from the item right after it; before
    anything else (a user turn, a tool result) it has nothing to attach to and is dropped."""
    answers = isinstance(item, FunctionCall | CustomToolCall) or (
        isinstance(item, Message) and item.role == "assistant"
    )
    if key is not None and answers and out and out[-1]["role"] == "assistant":
        before = out[-1].get(key)
        out[-1][key] = "\n".join([before, *thinking] if before else thinking)
    thinking.clear()


def _message(item: Message, options: ChatOptions, dropped: Counter[str]) -> ChatMessage:
    role: str = item.role
    if role in ("system", "developer"):
        role = options.system_role
    if role == "user":
        return {"role": role, "content": _user_content(item.content, dropped)}
    return {"role": role, "content": text_of(item.content)}


def _user_content(content: str | list[ContentPart], dropped: Counter[str]) -> Any:
    """Plain string when it is all text (every server accepts that); parts otherwise."""
    if isinstance(content, str) or not any(isinstance(p, InputImage | InputFile) for p in content):
        return text_of(content)
    parts: list[dict[str, Any]] = []
    for part in content:
        if isinstance(part, InputImage):
            if part.image_url:
                url = {"url": part.image_url, "detail": part.detail}
                parts.append({"type": "image_url", "image_url": url})
            else:
                dropped["image_file_id"] += 1  # chat cannot resolve our file ids
        elif isinstance(part, InputFile):
            parts.append({"type": "file", "file": _file(part)})
        else:
            parts.append({"type": "text", "text": text_of([part])})
    return parts


def _file(part: InputFile) -> dict[str, str]:
    fields = {"file_id": part.file_id, "file_data": part.file_data, "filename": part.filename}
    return {k: v for k, v in fields.items() if v is not None}


def _attach_call(out: list[ChatMessage], item: FunctionCall | CustomToolCall) -> None:
    """Consecutive calls (and the text just before them) form one assistant message."""
    arguments = item.arguments if isinstance(item, FunctionCall) else item.input
    call = {
        "id": item.call_id,
        "type": "function",
        "function": {"name": item.name, "arguments": arguments},
    }
    last = out[-1] if out else None
    if last is not None and last["role"] == "assistant":
        last.setdefault("tool_calls", []).append(call)
        return
    # Empty text rather than null or no key: llama-cpp-python's schema rejects null and its
    # chat templates read ``content`` unconditionally; OpenAI and vLLM accept "".
    out.append({"role": "assistant", "content": "", "tool_calls": [call]})


def _tool_result(item: ToolOutput, dropped: Counter[str]) -> ChatMessage:
    if not isinstance(item.output, str):
        skipped = sum(1 for p in item.output if isinstance(p, InputImage | InputFile))
        if skipped:
            dropped["tool_output_media"] += skipped  # chat tool messages carry text only
    return {"role": "tool", "tool_call_id": item.call_id, "content": text_of(item.output)}


def functions_for(tools: Toolset, dropped: Counter[str]) -> list[dict[str, Any]]:
    """The function tools a chat server can call; custom and hosted tools are counted."""
    out = [tool_for(t.spec) for t in tools.callables if isinstance(t.spec, FunctionTool)]
    dropped.update(f"tool.{t.spec.__struct_config__.tag}" for t in tools.callables if t.custom)
    dropped.update(f"tool.{kind}" for kind in tools.specs if isinstance(kind, str))
    if tools.mcp:  # the rollout offers their listed tools as functions instead (MCP-6)
        dropped["tool.mcp"] += len(tools.mcp)
    return out


def tool_for(tool: FunctionTool | CallableTool) -> dict[str, Any]:
    if isinstance(tool, CallableTool):
        assert isinstance(tool.spec, FunctionTool)
        tool = tool.spec
    function: dict[str, Any] = {"name": tool.name}
    if tool.description:
        function["description"] = tool.description
    function["parameters"] = tool.parameters or {"type": "object", "properties": {}}
    if tool.strict is not None:
        function["strict"] = tool.strict
    return {"type": "function", "function": function}


def tool_choice_for(choice: ToolChoice) -> Any:
    if isinstance(choice, ToolChoiceFunction):
        return {"type": "function", "function": {"name": choice.name}}
    return choice
