"""TOK-2, TOK-6, REASON-1, HARMONY-1: every model format a route can name is one class in its
registry, and each carries a sample its own reader reads back: a tool parser's sample call is
one call with its arguments; a reasoning format's sample answer, read by the reader a route
builds, is reasoning, a message and the call."""

from __future__ import annotations

import json
import shutil
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer

from engine.models.base import ArgsDelta, CallStart, Delta, ReasoningDelta, TextDelta
from engine.models.config import ConfigError, parse_config
from engine.models.tokens.options import TokensOptions
from engine.models.tokens.parsers.common import ToolParser
from engine.models.tokens.reasoning import REASONING_PARSERS, ReasoningParser
from engine.models.tokens.registry import Registry
from engine.models.tokens.render import RENDERERS, Renderer
from engine.models.tokens.servers import SERVERS
from engine.models.tokens.servers.base import Sampling, TokenServer
from engine.models.tokens.tokenizer import load_tokenizer
from engine.models.tokens.tool_parsers import PARSERS

ARGS: dict[str, Any] = {"path": "src/app.py", "line": 12, "replace": True}
SCHEMAS = {
    "edit_file": {
        "type": "object",
        "properties": {
            "path": {"type": "string"},
            "line": {"type": "integer"},
            "replace": {"type": "boolean"},
        },
    }
}


def kinds(deltas: list[Delta]) -> list[tuple[str, str]]:
    """(kind, text) per output item, consecutive pieces of one kind joined."""
    out: list[tuple[str, str]] = []
    for delta in deltas:
        if isinstance(delta, TextDelta | ReasoningDelta | ArgsDelta):
            kind = {TextDelta: "text", ReasoningDelta: "reasoning", ArgsDelta: "args"}
            name = kind[type(delta)]
            if out and out[-1][0] == name:
                out[-1] = (name, out[-1][1] + delta.text)
            else:
                out.append((name, delta.text))
        elif isinstance(delta, CallStart):
            out.append(("call", delta.name))
    return out


@pytest.mark.parametrize(
    ("registry", "base"),
    [
        (PARSERS, ToolParser),
        (REASONING_PARSERS, ReasoningParser),
        (RENDERERS, Renderer),
        (SERVERS, TokenServer),
    ],
)
def test_every_registered_name_is_a_class_of_its_extension_point(
    registry: Registry[Any], base: type
) -> None:
    assert len(registry) >= 2
    for name in registry:
        assert issubclass(registry[name], base), name


def test_a_server_is_named_as_its_route_names_it() -> None:
    for name in SERVERS:
        server = SERVERS[name](TokensOptions(api=name))
        assert server.name == name and server.path.startswith("/")
        sampling = Sampling(model="m", max_tokens=5, temperature=None, top_p=None)
        body = json.loads(server.body(b"1,2,3", sampling))
        assert body[server.prompt_key.decode()] == [1, 2, 3]


@pytest.mark.parametrize("name", list(PARSERS))
def test_each_tool_parser_reads_its_own_sample(name: str) -> None:
    fmt = PARSERS[name]
    text = fmt.sample("edit_file", ARGS)
    parser = fmt(SCHEMAS)
    deltas = [*parser.feed(text), *parser.finish()]
    items = kinds(deltas)
    assert [kind for kind, _ in items] == ["call", "args"], items
    assert json.loads(items[1][1]) == ARGS
    assert (parser.calls, parser.malformed) == (1, 0)


def test_a_registry_refuses_a_class_of_another_extension_point() -> None:
    wrong: Registry[ToolParser] = Registry(
        ToolParser, {"vllm": "engine.models.tokens.servers.vllm:VllmServer"}
    )
    with pytest.raises(TypeError):
        wrong["vllm"]


def _marked(tokenizer_dir: Path, into: Path) -> Path:
    """The module's tokenizer with the reasoning tags as special tokens, as Qwen3's has them:
    a format's ``markers`` must still reach its parser (TOK-30)."""
    tokenizer = Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    tokenizer.add_special_tokens(["<think>", "</think>"])
    tokenizer.save(str(into / "tokenizer.json"))
    shutil.copy(tokenizer_dir / "tokenizer_config.json", into / "tokenizer_config.json")
    return into


@pytest.mark.parametrize("name", list(REASONING_PARSERS))
def test_each_reasoning_format_reads_its_own_sample(
    name: str, tokenizer_dir: Path, tmp_path: Path
) -> None:
    kind = REASONING_PARSERS[name]
    tokenizer = None
    if RENDERERS[kind.template].needs_tokenizer:
        tokenizer = load_tokenizer(str(_marked(tokenizer_dir, tmp_path)))
    renderer = RENDERERS[kind.template].build(tokenizer, False)
    fmt = kind(renderer, "hermes", Counter())
    arguments = json.dumps(ARGS)
    ids = renderer.encode(kind.sample("Think first.", "Here it is.", "edit_file", arguments))
    reader = fmt.reader(SCHEMAS)
    deltas: list[Delta] = []
    for at in range(0, len(ids), 2):
        deltas += reader.feed(ids[at : at + 2])
    deltas += reader.finish()
    items = kinds(deltas)
    assert [kind for kind, _ in items] == ["reasoning", "text", "call", "args"], items
    assert items[0][1] == "Think first." and items[1][1].strip() == "Here it is."
    assert json.loads(items[3][1]) == ARGS and reader.calls == 1 and reader.reasoning_tokens > 0


@pytest.mark.parametrize(
    ("key", "value", "known"),
    [
        ("api", "tgi", "unknown token server; known: llamacpp, sglang, vllm"),
        ("template", "chatml", "unknown template; known: harmony, jinja"),
        ("reasoning_parser", "deepthink", "unknown reasoning parser; known: harmony, think"),
        ("tool_parser", "xml", "unknown tool parser; known: hermes, llama3_json, mistral"),
    ],
)
def test_an_unknown_format_is_a_config_error_listing_the_registry(
    key: str, value: str, known: str
) -> None:
    """TOK-31: each format key is a name in its registry; the config error names the key and
    the names the registry knows."""
    route = {
        "backend": "tokens",
        "api": "vllm",
        "base_url": "http://127.0.0.1:9",
        "tokenizer": "/x",
    }
    with pytest.raises(ConfigError) as caught:
        parse_config({"models": {"m": {**route, key: value}}})
    assert f"models.m.{key}: " in str(caught.value) and known in str(caught.value)
