"""The routing config file and the CLI shortcut (CFG-1..CFG-5): clear errors naming the key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cli.main import main
from engine.models.config import (
    ConfigError,
    build_router,
    load_config,
    parse_config,
    shortcut_config,
)
from engine.models.sim.simulator import SimulatedModel
from engine.models.upstreams.chat import ChatBackend
from engine.models.upstreams.responses import ResponsesBackend
from engine.server.process import flags
from engine.server.process import serve as run

GOOD = """
default = "qwen"

[models.qwen]
backend = "chat"
base_url = "http://127.0.0.1:8001/v1"
model = "Qwen/Qwen2.5-0.5B-Instruct"
api_key_env = "ROLLOUT_TEST_UPSTREAM_KEY"
aliases = ["gpt-4o-mini"]
max_tokens_field = "max_completion_tokens"
params = { top_k = 20 }

[models.remote]
backend = "responses"
base_url = "https://example.invalid/v1"
continue_by_id = true

[models.fast-sim]
backend = "sim"
speed = 0
scenario = "coding-agent"
"""


def problems(raw: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as caught:
        build_router(parse_config(raw, "routes.toml"), environ={})
    return str(caught.value)


def test_good_file_builds_routes_aliases_and_default(tmp_path: Path) -> None:
    path = tmp_path / "routes.toml"
    path.write_text(GOOD)
    router = build_router(load_config(path))
    qwen = router.resolve("gpt-4o-mini")
    assert isinstance(qwen, ChatBackend) and qwen is router.resolve("qwen")
    assert qwen.options.model == "Qwen/Qwen2.5-0.5B-Instruct"
    assert qwen.options.max_tokens_field == "max_completion_tokens"
    assert qwen.options.params == {"top_k": 20}
    assert isinstance(router.resolve("remote"), ResponsesBackend)
    sim = router.resolve("fast-sim")
    assert isinstance(sim, SimulatedModel) and sim.scenario == "coding-agent"
    assert router.resolve("unknown-name") is qwen
    assert router.models() == ["fast-sim", "gpt-4o-mini", "qwen", "remote"]


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (
            {"models": {"a": {"backend": "chat"}}},
            "routes.toml: models.a.base_url: required key is missing",
        ),
        (
            {"models": {"a": {"backend": "chat", "base_url": "ftp://x", "x": 1}}},
            "models.a.x: unknown key",
        ),
        (
            {"models": {"a": {"backend": "chat", "base_url": "ftp://x"}}},
            "models.a.base_url: must start with http",
        ),
        (
            {"models": {"a": {"backend": "vllm"}}},
            "models.a.backend: must be one of sim, chat, responses",
        ),
        ({"models": {"a": {"base_url": "http://x"}}}, "models.a.backend: must be one of"),
        (
            {"models": {"a": {"backend": "sim", "speed": -1}}},
            "models.a.speed: Input should be greater",
        ),
        (
            {"models": {"a": {"backend": "sim", "scenario": "nope"}}},
            "models.a.scenario: unknown scenario",
        ),
        ({"models": {}}, "models: "),
        ({"models": {"a": {"backend": "sim"}}, "default": "b"}, "default: 'b' is not a model name"),
        (
            {"models": {"a": {"backend": "sim"}, "b": {"backend": "sim", "aliases": ["a"]}}},
            "models.b.aliases: 'a' is already a model name",
        ),
        (
            {
                "models": {
                    "a": {
                        "backend": "chat",
                        "base_url": "http://x",
                        "headers": {"Authorization": "k"},
                    }
                }
            },
            "models.a.headers: put credentials in an environment variable",
        ),
        (
            {
                "models": {
                    "a": {"backend": "chat", "base_url": "http://x", "api_key_env": "NOPE_KEY"}
                }
            },
            "models.a.api_key_env: environment variable NOPE_KEY is not set",
        ),
    ],
)
def test_errors_name_the_offending_key(raw: dict[str, Any], expected: str) -> None:
    assert expected in problems(raw)


def test_unreadable_and_invalid_toml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[models.a\nbackend = 'sim'")
    with pytest.raises(ConfigError, match=r"bad.toml: not valid TOML"):
        load_config(bad)


def test_upstream_shortcut() -> None:
    router = build_router(shortcut_config("http://127.0.0.1:8001/v1", "llama", None))
    chat = router.resolve("anything")
    assert isinstance(chat, ChatBackend) and chat.options.model == "llama"
    assert chat.endpoint.base_url == "http://127.0.0.1:8001/v1"
    assert router.models() == ["llama", "sim", "sim-coding-agent"]
    passthrough = build_router(shortcut_config("http://h/v1", None, None)).resolve("client-name")
    assert isinstance(passthrough, ChatBackend) and passthrough.options.model is None


def test_cli_flags_build_the_router(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    parser_args = ["serve", "--upstream", "http://127.0.0.1:8001/v1", "--upstream-model", "m"]
    args = _parse([*parser_args, "--upstream-key-env", "ROLLOUT_TEST_UPSTREAM_KEY"])
    router, default_model = run.models(flags.serve_options(args), args.tokens_per_second)
    assert router is not None and default_model == "m"
    assert flags.engine_config(args, default_model).default_model == "m"
    path = tmp_path / "r.toml"
    path.write_text('[models.a]\nbackend = "sim"\nspeeed = 3\n')
    assert main(["serve", "--config", str(path), "--port", "0"]) == 2
    assert "models.a.speeed: unknown key" in capsys.readouterr().err
    assert main(["serve", "--config", str(path), "--upstream", "http://x/v1"]) == 2
    assert main(["serve", "--config", str(path), "--bench-models"]) == 2


def _parse(argv: list[str]) -> Any:
    import argparse

    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command")
    flags.add_serve_parser(sub)
    return parser.parse_args(argv)
