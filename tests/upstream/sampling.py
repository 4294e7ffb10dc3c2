"""Building a ``SampleRequest`` the way the rollout does, for backend-level tests."""

from __future__ import annotations

from typing import Any

from engine.conversation.context import Context
from engine.models.base import SampleRequest
from protocol.codec import parse_input
from protocol.response import FunctionTool, ToolChoice
from protocol.tools import toolset_from

TOOL = FunctionTool(name="get_weather", parameters={"type": "object"}, description="Weather")


def request(
    items: list[dict[str, Any]],
    *,
    instructions: str | None = "Be brief.",
    tools: list[FunctionTool] | None = None,
    tool_choice: ToolChoice = "auto",
    **settings: Any,
) -> SampleRequest:
    toolset = toolset_from([TOOL] if tools is None else list(tools))
    ctx = Context(items=parse_input(items), header_key=(instructions, toolset))
    return SampleRequest(
        model="client-model",
        context=ctx,
        tools=toolset,
        tool_choice=tool_choice,
        parallel_tool_calls=settings.pop("parallel_tool_calls", True),
        max_output_tokens=settings.pop("max_output_tokens", None),
        **settings,
    )
