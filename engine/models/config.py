"""The routing config file: model names and aliases -> backends (SPEC: CFG-1..CFG-5).

TOML, validated with pydantic; every problem is reported with the dotted path of the offending
key (``models.qwen.base_url: field required``). Example::

    default = "qwen"                        # unknown model names go here (optional)

    [models.qwen]
    backend = "chat"                        # sim | chat | responses
    base_url = "http://127.0.0.1:8001/v1"
    model = "Qwen/Qwen2.5-7B-Instruct"      # upstream name; omitted: the client's name is sent
    api_key_env = "VLLM_API_KEY"            # the *name* of the variable; never the key itself
    aliases = ["gpt-4o-mini"]
    params = { top_k = 20 }                 # extra body fields (defaults; requests override)

    [models.qwen-tokens]
    backend = "tokens"                      # the engine renders the model's own tokens (TOK-1)
    api = "vllm"                            # vllm | sglang | llamacpp
    base_url = "http://127.0.0.1:8001"
    tokenizer = "/models/qwen3"             # tokenizer.json, or a directory with it and
                                            # tokenizer_config.json
    chat_template = "/models/qwen3/chat_template.jinja"   # optional
    tool_parser = "hermes"                  # hermes | qwen3_coder | llama3_json | mistral
    reasoning_parser = "think"              # optional: <think> reasoning items (REASON-1)
    history = "exact"                       # exact | rerender (TOK-4)
    sglang_stream = "auto"                  # auto | cumulative | incremental (TOK-32)
    llamacpp_stream = false                 # api = "llamacpp": stream (lossy, TOK-44)
    weights = "qwen3-8b-step-1200"          # optional tag stored with trajectories (EXPORT-4)
    training_fields = true                  # each step's ids on its last item (TOK-61)

    [models.gpt-oss]
    backend = "tokens"
    api = "vllm"
    base_url = "http://127.0.0.1:8002"
    template = "harmony"                    # gpt-oss: no tokenizer file (HARMONY-1)

    [models.sim]
    backend = "sim"
    speed = 1000                            # tokens per second; 0 = unpaced
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import pydantic
from pydantic import BaseModel, ConfigDict, Field

from engine.models.base import Backend
from engine.models.router import Router
from engine.models.sim.scenarios import SCENARIOS
from engine.models.sim.simulator import SimulatedModel
from engine.models.tokens.backend import TokensBackend
from engine.models.tokens.harmony import HarmonySetupError
from engine.models.tokens.options import TokensOptions
from engine.models.tokens.reasoning import REASONING_PARSERS
from engine.models.tokens.registry import Registry
from engine.models.tokens.render import RENDERERS
from engine.models.tokens.servers import SERVERS
from engine.models.tokens.tokenizer import TokenizerError, load_tokenizer
from engine.models.tokens.tool_parsers import PARSERS
from engine.models.upstreams.chat import ChatBackend
from engine.models.upstreams.chat_wire import ChatOptions
from engine.models.upstreams.endpoint import Endpoint
from engine.models.upstreams.http_pool import HttpPool
from engine.models.upstreams.responses import ResponsesBackend
from engine.models.upstreams.responses_wire import ResponsesOptions

BACKENDS = ("sim", "chat", "responses", "tokens")
Kind = Literal["text", "image", "file"]


class ConfigError(ValueError):
    """The config file is unusable; ``str()`` lists every problem, one per line."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class SimRoute(_Strict):
    backend: Literal["sim"]
    speed: float = Field(default=1000.0, ge=0)
    scenario: str | None = None
    aliases: list[str] = []

    @pydantic.field_validator("scenario")
    @classmethod
    def _known_scenario(cls, value: str | None) -> str | None:
        if value is not None and value not in SCENARIOS:
            raise ValueError(f"unknown scenario; known: {', '.join(sorted(SCENARIOS))}")
        return value


class _UpstreamRoute(_Strict):
    base_url: str
    model: str | None = None
    api_key_env: str | None = None
    headers: dict[str, str] = {}
    params: dict[str, Any] = {}
    supports: list[Kind] = ["text"]
    connect_timeout: float = Field(default=10.0, gt=0)
    read_timeout: float = Field(default=300.0, gt=0)
    retries: int = Field(default=0, ge=0, le=5)
    aliases: list[str] = []

    @pydantic.field_validator("base_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError("must start with http:// or https://")
        return value

    @pydantic.field_validator("headers")
    @classmethod
    def _no_secrets(cls, value: dict[str, str]) -> dict[str, str]:
        if any(k.lower() in ("authorization", "api-key", "x-api-key") for k in value):
            raise ValueError("put credentials in an environment variable named by api_key_env")
        return value

    def endpoint(self) -> Endpoint:
        return Endpoint(
            base_url=self.base_url,
            api_key_env=self.api_key_env,
            headers=dict(self.headers),
            connect_timeout=self.connect_timeout,
            read_timeout=self.read_timeout,
            retries=self.retries,
        )


class ChatRoute(_UpstreamRoute):
    backend: Literal["chat"]
    max_tokens_field: Literal["max_tokens", "max_completion_tokens"] = "max_tokens"
    system_role: Literal["system", "developer"] = "system"


class ResponsesRoute(_UpstreamRoute):
    backend: Literal["responses"]
    continue_by_id: bool = False
    pass_reasoning: bool = False


def _known(value: str, registry: Registry[Any], what: str) -> str:
    """A name its registry knows (one registry per extension point, TOK-2)."""
    if value not in registry:
        raise ValueError(f"unknown {what}; known: {registry.known()}")
    return value


class TokensRoute(_UpstreamRoute):
    backend: Literal["tokens"]
    api: str  # a token server (``tokens.servers.SERVERS``, TOK-2)
    tokenizer: str | None = None  # required unless ``template = "harmony"``
    chat_template: str | None = None
    template: str = "jinja"  # a renderer (``tokens.render.RENDERERS``): jinja | harmony (HARMONY-1)
    tool_parser: str = "hermes"
    reasoning_parser: str | None = None  # ``tokens.reasoning.REASONING_PARSERS`` (REASON-1)
    history: Literal["exact", "rerender"] = "exact"
    sglang_stream: Literal["auto", "cumulative", "incremental"] = "auto"  # TOK-32
    llamacpp_stream: bool = False  # TOK-44: llama.cpp's stream drops ids; one answer instead
    weights: str = ""  # a tag naming the served checkpoint, stored with trajectories (EXPORT-4)
    training_fields: bool = False  # every create gets TOK-60's item fields (TOK-61)

    @pydantic.model_validator(mode="after")
    def _template_fits(self) -> TokensRoute:
        renderer = RENDERERS[self.template]
        if not renderer.needs_tokenizer:
            if self.tokenizer is not None or self.chat_template is not None:
                raise ValueError(f"tokenizer: {self.template} brings its own encoding; omit it")
        elif self.tokenizer is None:
            raise ValueError("tokenizer: required key is missing")
        if self.reasoning_parser is not None:
            wanted = REASONING_PARSERS[self.reasoning_parser].template
            if renderer.reasoning not in (None, self.reasoning_parser):
                raise ValueError(
                    f"reasoning_parser: {self.template} reads its own channels; omit it"
                )
            if wanted != self.template:
                raise ValueError(
                    f'reasoning_parser: "{self.reasoning_parser}" needs template = "{wanted}"'
                )
        return self

    @pydantic.field_validator("api")
    @classmethod
    def _known_server(cls, value: str) -> str:
        return _known(value, SERVERS, "token server")

    @pydantic.field_validator("template")
    @classmethod
    def _known_template(cls, value: str) -> str:
        return _known(value, RENDERERS, "template")

    @pydantic.field_validator("reasoning_parser")
    @classmethod
    def _known_reasoning(cls, value: str | None) -> str | None:
        return value if value is None else _known(value, REASONING_PARSERS, "reasoning parser")

    @pydantic.field_validator("tool_parser")
    @classmethod
    def _known_parser(cls, value: str) -> str:
        return _known(value, PARSERS, "tool parser")


AnyRoute = SimRoute | ChatRoute | ResponsesRoute | TokensRoute
Route = Annotated[AnyRoute, Field(discriminator="backend")]


class HttpSettings(_Strict):
    max_connections: int = Field(default=256, ge=1)


class RoutingConfig(_Strict):
    default: str | None = None
    models: dict[str, Route] = Field(min_length=1)
    http: HttpSettings = HttpSettings()

    @pydantic.model_validator(mode="after")
    def _names(self) -> RoutingConfig:
        names = set(self.models)
        for name, route in self.models.items():
            for alias in route.aliases:
                if alias in names:
                    raise ValueError(f"models.{name}.aliases: {alias!r} is already a model name")
                names.add(alias)
        if self.default is not None and self.default not in names:
            raise ValueError(f"default: {self.default!r} is not a model name or alias")
        return self


# --------------------------------------------------------------------------- loading


def load_config(path: Path) -> RoutingConfig:
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    return parse_config(raw, str(path))


def parse_config(raw: Mapping[str, Any], source: str = "config") -> RoutingConfig:
    try:
        return RoutingConfig.model_validate(raw)
    except pydantic.ValidationError as exc:
        lines = [f"{source}: {_problem(err)}" for err in exc.errors()]
        raise ConfigError("\n".join(lines)) from None


def _problem(err: Any) -> str:
    loc = [str(p) for p in err["loc"]]
    if len(loc) > 2 and loc[0] == "models" and loc[2] in BACKENDS:
        del loc[2]  # the union member pydantic tried; the user never wrote it
    kind, message = err["type"], err["msg"]
    if kind == "extra_forbidden":
        message = "unknown key"
    elif kind == "missing":
        message = "required key is missing"
    elif kind in ("union_tag_not_found", "union_tag_invalid"):
        loc.append("backend")
        message = f"must be one of {', '.join(BACKENDS)}"
    message = message.removeprefix("Value error, ")
    path = ".".join(loc)
    if not path:  # a model-level check: its message starts with the path already
        return str(message)
    return f"{path}: {message}"


def shortcut_config(base_url: str, model: str | None, api_key_env: str | None) -> RoutingConfig:
    """``rollout serve --upstream URL``: every model name goes to one chat upstream; the
    simulator stays reachable as ``sim`` and ``sim-coding-agent``."""
    name = model or "upstream"
    route = {"backend": "chat", "base_url": base_url, "model": model, "api_key_env": api_key_env}
    raw = {
        "default": name,
        "models": {
            name: route,
            "sim": {"backend": "sim"},
            "sim-coding-agent": {"backend": "sim", "scenario": "coding-agent"},
        },
    }
    return parse_config(raw, "--upstream")


# --------------------------------------------------------------------------- building


def build_router(config: RoutingConfig, environ: Mapping[str, str] | None = None) -> Router:
    """Backends for every route; aliases share their target's backend object."""
    env = os.environ if environ is None else environ
    pool = HttpPool(config.http.max_connections)
    routes: dict[str, Backend] = {}
    problems: list[str] = []
    for name, route in config.models.items():
        key_env = getattr(route, "api_key_env", None)
        if key_env and key_env not in env:
            problems.append(f"models.{name}.api_key_env: environment variable {key_env} is not set")
        try:
            backend = _backend(route, pool)
        except TokenizerError as exc:
            problems.append(f"models.{name}.tokenizer: {exc}")
            continue
        except HarmonySetupError as exc:
            problems.append(f"models.{name}.template: {exc}")
            continue
        for key in (name, *route.aliases):
            routes[key] = backend
    if problems:
        raise ConfigError("\n".join(problems))
    default = routes[config.default] if config.default is not None else None
    return Router(routes=routes, default=default, default_name=config.default, closers=[pool.close])


def _backend(route: AnyRoute, pool: HttpPool) -> Backend:
    if isinstance(route, SimRoute):
        return SimulatedModel(route.speed, scenario=route.scenario)
    supports = frozenset(route.supports)
    if isinstance(route, TokensRoute):
        options = TokensOptions(
            api=route.api,
            model=route.model,
            template=route.template,
            tool_parser=route.tool_parser,
            rerender=route.history == "rerender",
            reasoning_parser=route.reasoning_parser,
            sglang_stream=route.sglang_stream,
            llamacpp_stream=route.llamacpp_stream,
            params=dict(route.params),
            weights=route.weights,
            training_fields=route.training_fields,
        )
        tokenizer = None  # a template with its own encoding (harmony) needs none
        if route.tokenizer is not None:
            tokenizer = load_tokenizer(route.tokenizer, route.chat_template)
        return TokensBackend(route.endpoint(), pool, tokenizer, options, supports)
    if isinstance(route, ChatRoute):
        chat = ChatOptions(
            model=route.model,
            max_tokens_field=route.max_tokens_field,
            system_role=route.system_role,
            params=dict(route.params),
        )
        return ChatBackend(route.endpoint(), pool, chat, supports)
    responses = ResponsesOptions(
        model=route.model,
        continue_by_id=route.continue_by_id,
        pass_reasoning=route.pass_reasoning,
        params=dict(route.params),
    )
    return ResponsesBackend(route.endpoint(), pool, responses, supports)
