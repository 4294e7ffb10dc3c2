"""What the reasoning tests share (REASON-*, HARMONY-*): a Qwen3-style template that renders
``reasoning_content`` only after the last user query (so a re-rendered history loses earlier
thinking, as Qwen3's does), and a token peer that samples gpt-oss harmony completions in
o200k ids (vLLM's token API, the same peer as ``token_peer.TokenPeer``)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from clients.bench.services.tiny_model import QWEN_TEMPLATE
from engine.models.config import build_router, parse_config
from engine.models.router import Router
from engine.models.tokens.harmony import harmony_encoding
from tests.upstream.token_peer import TokenPeer, TokenTurn

# Qwen3's structure: thinking is rendered for assistant turns after the last user query only.
QWEN3_TEMPLATE = (
    "{%- set ns = namespace(last_query=-1) %}\n"
    "{%- for message in messages %}{%- if message.role == 'user' %}"
    "{%- set ns.last_query = loop.index0 %}{%- endif %}{%- endfor %}\n"
    + QWEN_TEMPLATE.replace(
        """{{- '<|im_start|>assistant' }}
{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}
{%- for call in message.tool_calls or [] %}
{{- '\\n<tool_call>\\n{\\"name\\": \\"' + call.function.name + '\\", \\"arguments\\": ' }}""",
        """{{- '<|im_start|>assistant\\n' }}
{%- if loop.index0 > ns.last_query and message.reasoning_content %}
{{- '<think>\\n' + message.reasoning_content.strip('\\n') + '\\n</think>\\n\\n' }}
{%- endif %}
{{- message.content or '' }}
{%- for call in message.tool_calls or [] %}
{%- if message.content or not loop.first %}{{- '\\n' }}{%- endif %}
{{- '<tool_call>\\n{\\"name\\": \\"' + call.function.name + '\\", \\"arguments\\": ' }}""",
    )
)
assert QWEN3_TEMPLATE != QWEN_TEMPLATE

# A gpt-oss chain: (analysis, a get_weather call), (analysis, the answer), a final reply.
HARMONY_SCRIPT = [
    "<|channel|>analysis<|message|>The user wants the weather.<|end|>"
    "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
    '<|message|>{"city": "Paris"}<|call|>',
    "<|channel|>analysis<|message|>The tool said sunny.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>It is sunny in Paris.<|return|>",
    "<|channel|>final<|message|>You are welcome.<|return|>",
]

# The weather chain the training and sealed-reasoning tests script, three sampling steps each:
# (a get_weather call), (the answer), a polite reply; as a Qwen3 think model, a plain one and
# gpt-oss (whose every step opens with analysis).
WEATHER_CALL = json.dumps({"name": "get_weather", "arguments": {"city": "Paris"}})
THINK_CHAIN = [
    f"<think>\nThe user wants the weather.\n</think>\n\n<tool_call>\n{WEATHER_CALL}\n</tool_call>",
    "<think>\nThe tool said sunny.\n</think>\n\nIt is sunny in Paris.",
    "<think>\nPolite.\n</think>\n\nYou are welcome.",
]
PLAIN_CHAIN = [
    f"<tool_call>\n{WEATHER_CALL}\n</tool_call>",
    "It is sunny in Paris.",
    "You are welcome.",
]
HARMONY_CHAIN = [
    *HARMONY_SCRIPT[:2],
    "<|channel|>analysis<|message|>Polite.<|end|>"
    "<|start|>assistant<|channel|>final<|message|>You are welcome.<|return|>",
]


@dataclass
class _Ids:
    ids: list[int]


class HarmonyText:
    """The peer's tokenizer for harmony: text with harmony's special tokens <-> o200k ids."""

    def encode(self, text: str, add_special_tokens: bool = False) -> _Ids:
        return _Ids(harmony_encoding().encode(text, allowed_special="all"))

    def decode(self, ids: list[int], skip_special_tokens: bool = False) -> str:
        text: str = harmony_encoding().decode(ids)
        return text


class HarmonyPeer(TokenPeer):
    """Samples the scripted harmony completions (each ends with its own stop token)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.tokenizer = HarmonyText()  # type: ignore[assignment]

    def _answer(self, api: str, body: dict[str, Any], prompt: list[int]) -> TokenTurn:
        turn = TokenTurn(api, body, list(prompt))
        self.turns.append(turn)
        if not self.script:
            raise web.HTTPBadRequest(text="the harmony peer has no scripted answer left")
        step = self.script.popleft()
        turn.answer = step if isinstance(step, list) else self.tokenizer.encode(step).ids
        return turn


def harmony_router(peer: TokenPeer, **extra: Any) -> Router:
    route = {
        "backend": "tokens",
        "api": "vllm",
        "base_url": peer.base_url,
        "model": "gpt-oss-tiny",
        "template": "harmony",
        **extra,
    }
    return build_router(parse_config({"default": "model-a", "models": {"model-a": route}}))
