"""Building a ``SampleRequest`` the way the rollout does, for backend-level tests."""

from __future__ import annotations

from typing import Any

from engine.context import Context
from engine.models.base import SampleRequest
from protocol.codec import parse_input
from protocol.response import FunctionTool, ToolChoice

TOOL = FunctionTool(name="get_weather", parameters={"type": "object"}, description="Weather")


def request(
    items: list[dict[str, Any]],
    *,
    instructions: str | None = "Be brief.",
    tools: list[FunctionTool] | None = None,
    tool_choice: ToolChoice = "auto",
    **settings: Any,
) -> SampleRequest:
    tools = [TOOL] if tools is None else tools
    ctx = Context(items=parse_input(items), header_key=(instructions, tuple(tools)))
    return SampleRequest(
        model="client-model",
        context=ctx,
        tools=tools,
        tool_choice=tool_choice,
        parallel_tool_calls=settings.pop("parallel_tool_calls", True),
        max_output_tokens=settings.pop("max_output_tokens", None),
        **settings,
    )
