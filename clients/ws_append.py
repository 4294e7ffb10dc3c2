"""Experimental append mode over WebSocket: the whole rollout is ONE response.

    response.create {rollout_mode: "append"}  ->  events ... response.done {pending_calls}
    response.append {response_id, input: [function_call_output ...]}  ->  events continue ...
    ... -> response.completed (usage covers the whole rollout)

Nothing is resent: the server keeps the rollout suspended on a Future, so each continuation
carries only the new tool outputs and pre-inference runs only over them.
"""

from __future__ import annotations

from typing import Any, Literal

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

APPEND_BETA = "rollout-append=v1"


class AppendClient(WsClient):
    """Runs rollouts in append mode. ``verb="inject"`` uses OpenAI's beta event name instead,
    which the server acknowledges with ``response.inject.created`` (or ``.failed``)."""

    def __init__(
        self, base_url: str, *, verb: Literal["append", "inject"] = "append", **kwargs: Any
    ) -> None:
        super().__init__(base_url, **kwargs)
        self.verb = verb

    async def run(
        self,
        model: str,
        input: str | list[Any],
        tools: ToolRegistry,
        instructions: str | None = None,
        **extra: Any,
    ) -> RolloutResult:
        """Run one rollout to completion. ``extra`` fields are added to the ``response.create``."""
        async with self._lock:
            reader = TurnReader(self.hooks, append=True)
            body = create_body(model, input, tools, instructions, extra)

            async def begin() -> TurnEnd:
                await self.send({"type": "response.create", "rollout_mode": "append", **body})
                return await self.read_turn(reader)

            async def answer(end: TurnEnd, records: list[ToolCallRecord]) -> TurnEnd:
                await self.send(
                    {
                        "type": f"response.{self.verb}",
                        "response_id": end.response.id,
                        "input": output_items(records),
                    }
                )
                return await self.read_turn(reader)

            try:
                return await drive(begin, answer, tools, reader)
            except BaseException:
                await self._drop_socket()
                raise
