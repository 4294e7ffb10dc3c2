"""Standard (compat) WebSocket mode: one response per model turn, on one socket.

Each continuation is a new ``response.create`` whose ``previous_response_id`` names the response
that asked for the tools and whose ``input`` holds only the new ``function_call_output`` items,
exactly as the OpenAI WebSocket mode works; the server resumes the suspended rollout (fast path).
"""

from __future__ import annotations

from typing import Any

from clients.loop import (
    RolloutResult,
    ToolCallRecord,
    TurnEnd,
    TurnReader,
    create_body,
    drive,
    output_items,
)
from clients.toolbox import ToolRegistry
from clients.ws_base import WsClient


class CompatClient(WsClient):
    """Runs rollouts in standard WebSocket mode (the OpenAI-compatible protocol)."""

    async def run(
        self,
        model: str,
        input: str | list[Any],
        tools: ToolRegistry,
        instructions: str | None = None,
        **extra: Any,
    ) -> RolloutResult:
        """Run one rollout to completion. ``extra`` fields are added to every ``response.create``
        (e.g. ``store=False``)."""
        async with self._lock:
            reader = TurnReader(self.hooks, append=False)

            async def begin() -> TurnEnd:
                body = create_body(model, input, tools, instructions, extra)
                await self.send({"type": "response.create", **body})
                return await self.read_turn(reader)

            async def answer(end: TurnEnd, records: list[ToolCallRecord]) -> TurnEnd:
                body = create_body(model, output_items(records), tools, instructions, extra)
                body["previous_response_id"] = end.response.id
                await self.send({"type": "response.create", **body})
                return await self.read_turn(reader)

            try:
                return await drive(begin, answer, tools, reader)
            except BaseException:
                await self._drop_socket()
                raise
