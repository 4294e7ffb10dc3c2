"""``hermes`` (Qwen2.5/Qwen3, Hermes, many fine-tunes; SPEC: TOK-6, PARSE-4): a call is
``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` anywhere in the text. A call's
JSON is read when its closing tag arrives; one that is not a JSON object with a string
``name`` stays text (counted), as does a call that never closes."""

from __future__ import annotations

import json
from typing import Any

from engine.models.tokens.parsers.common import json_object, named_call
from engine.models.tokens.parsers.tagged import TaggedCalls


class HermesParser(TaggedCalls):
    def read(self, body: str) -> tuple[str, Any] | None:
        return named_call(json_object(body))

    @staticmethod
    def sample(name: str, arguments: dict[str, Any]) -> str:
        call = {"name": name, "arguments": arguments}
        return f"<tool_call>\n{json.dumps(call)}\n</tool_call>"
