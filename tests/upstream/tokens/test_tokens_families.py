"""PARSE-5..PARSE-7 through the real server: a route names its parser (``tool_parser``), a
small chat template of each family renders the conversation, the token peer samples the
family's call (its markers special tokens, as the family's tokenizers ship them), and the
openai SDK gets a ``function_call`` with the arguments typed, then the answer, token-exact."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from openai import AsyncOpenAI
from tokenizers import AddedToken, Tokenizer

from clients.bench.services.tiny_model import QWEN_TEMPLATE
from tests.upstream.conftest import StartEngine
from tests.upstream.token_peer import TokenPeer, assert_exact, make_tokenizer, tokens_router

QWEN_CALLS = """\
{%- for call in message.tool_calls or [] %}
{{- '\\n<tool_call>\\n{\\"name\\": \\"' + call.function.name + '\\", \\"arguments\\": ' }}
{{- call.function.arguments | tojson }}
{{- '}\\n</tool_call>' }}
{%- endfor %}"""
# Qwen3-Coder: the same turns, calls as XML with one parameter element per argument.
QWEN3_CODER_CALLS = """\
{%- for call in message.tool_calls or [] %}
{{- '\\n<tool_call>\\n<function=' + call.function.name + '>\\n' }}
{%- for key, value in call.function.arguments.items() %}
{{- '<parameter=' + key + '>\\n' }}
{{- value if value is string else value | tojson }}
{{- '\\n</parameter>\\n' }}
{%- endfor %}
{{- '</function>\\n</tool_call>' }}
{%- endfor %}"""
assert QWEN_CALLS in QWEN_TEMPLATE
QWEN3_CODER_TEMPLATE = QWEN_TEMPLATE.replace(QWEN_CALLS, QWEN3_CODER_CALLS)

LLAMA3_TEMPLATE = """\
{%- if tools %}
{{- '<|start_header_id|>system<|end_header_id|>\\n\\nTools:' }}
{%- for tool in tools %}{{- ' ' + tool | tojson }}{%- endfor %}
{{- '<|eot_id|>' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'assistant' and message.tool_calls %}
{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n<|python_tag|>' }}
{%- for call in message.tool_calls %}
{{- '{\\"name\\": \\"' + call.function.name + '\\", \\"parameters\\": ' }}
{{- call.function.arguments | tojson }}{{- '}' }}
{%- if not loop.last %}{{- '; ' }}{%- endif %}
{%- endfor %}
{{- '<|eot_id|>' }}
{%- elif message.role == 'tool' %}
{{- '<|start_header_id|>ipython<|end_header_id|>\\n\\n' + message.content + '<|eot_id|>' }}
{%- else %}
{{- '<|start_header_id|>' + message.role + '<|end_header_id|>\\n\\n' }}
{{- message.content + '<|eot_id|>' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
{{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}
{%- endif %}
"""

# Mistral (v11+ tokenizers): no generation prompt, the model continues after ``[/INST]``.
MISTRAL_TEMPLATE = """\
{%- if tools %}
{{- '[AVAILABLE_TOOLS]' + tools | tojson + '[/AVAILABLE_TOOLS]' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'system' %}
{{- '[SYSTEM_PROMPT]' + message.content + '[/SYSTEM_PROMPT]' }}
{%- elif message.role == 'user' %}
{{- '[INST]' + message.content + '[/INST]' }}
{%- elif message.role == 'assistant' %}
{{- message.content or '' }}
{%- for call in message.tool_calls or [] %}
{{- '[TOOL_CALLS]' + call.function.name + '[ARGS]' + call.function.arguments | tojson }}
{%- endfor %}
{{- '</s>' }}
{%- elif message.role == 'tool' %}
{{- '[TOOL_RESULTS]' + message.content + '[/TOOL_RESULTS]' }}
{%- endif %}
{%- endfor %}
"""

MISTRAL_SPECIALS = (
    *("[INST]", "[/INST]", "[TOOL_CALLS]", "[ARGS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]"),
    *("[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "</s>"),
)
ADD = {
    "type": "function",
    "name": "add",
    "description": "Add two numbers.",
    "parameters": {
        "type": "object",
        "properties": {
            "a": {"type": "integer"},
            "b": {"type": "number"},
            "note": {"type": "string"},
        },
        "required": ["a", "b"],
    },
}
ARGS = {"a": 12, "b": 2.5, "note": "12"}


@dataclass(frozen=True)
class Family:
    parser: str
    template: str
    specials: tuple[str, ...]
    end: str
    call: str  # what the model samples for ``add(ARGS)``


FAMILIES = [
    Family(
        "qwen3_coder",
        QWEN3_CODER_TEMPLATE,
        (),
        "<|im_end|>",
        "<tool_call>\n<function=add>\n<parameter=a>\n12\n</parameter>\n<parameter=b>\n2.5\n"
        "</parameter>\n<parameter=note>\n12\n</parameter>\n</function>\n</tool_call>",
    ),
    Family(
        "llama3_json",
        LLAMA3_TEMPLATE,
        ("<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|python_tag|>"),
        "<|eot_id|>",
        '<|python_tag|>{"name": "add", "parameters": ' + json.dumps(ARGS) + "}",
    ),
    Family(
        "mistral",
        MISTRAL_TEMPLATE,
        MISTRAL_SPECIALS,
        "</s>",
        "[TOOL_CALLS]add[ARGS]" + json.dumps(ARGS),
    ),
]


def family_tokenizer(directory: Path, family: Family) -> Path:
    make_tokenizer(directory, family.template)
    file = directory / "tokenizer.json"
    tokenizer = Tokenizer.from_file(str(file))
    tokenizer.add_special_tokens([AddedToken(t, special=True) for t in family.specials])
    tokenizer.save(str(file))
    config_file = directory / "tokenizer_config.json"
    config: dict[str, Any] = json.loads(config_file.read_text())
    config["eos_token"] = family.end
    config_file.write_text(json.dumps(config))
    return directory


@pytest.fixture(params=FAMILIES, ids=[f.parser for f in FAMILIES])
async def family_peer(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[tuple[Family, Path, TokenPeer]]:
    family: Family = request.param
    directory = family_tokenizer(tmp_path / family.parser, family)
    peer = TokenPeer(directory)
    end_id = peer.tokenizer.token_to_id(family.end)
    assert end_id is not None
    peer.end_id = end_id
    await peer.start()
    try:
        yield family, directory, peer
    finally:
        await peer.stop()


async def test_each_family_calls_a_tool_through_the_sdk(
    family_peer: tuple[Family, Path, TokenPeer], engine_for: StartEngine
) -> None:
    family, directory, peer = family_peer
    router = tokens_router(peer, directory, "vllm", tool_parser=family.parser)
    server = await engine_for(router)
    peer.script.extend([family.call, "The sum is 14.5."])
    client = AsyncOpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
    try:
        first = await client.responses.create(model="model-a", input="Add them.", tools=[ADD])
        assert [item.type for item in first.output] == ["function_call"], first.output
        call = first.output[0]
        assert call.name == "add" and json.loads(call.arguments) == ARGS
        output = {"type": "function_call_output", "call_id": call.call_id, "output": "14.5"}
        second = await client.responses.create(
            model="model-a", previous_response_id=first.id, input=[output], tools=[ADD]
        )
    finally:
        await client.close()
    assert second.output_text == "The sum is 14.5."
    assert_exact(peer)
    ids = {peer.tokenizer.token_to_id(t) for t in family.specials}
    marker_ids = {
        i
        for i in ids
        if peer.tokenizer.decode([i], skip_special_tokens=False)
        in ("<|python_tag|>", "[TOOL_CALLS]", "[ARGS]")
    }
    assert marker_ids <= set(peer.turns[0].answer)  # the markers were special tokens
