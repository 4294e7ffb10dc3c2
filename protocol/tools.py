"""Tool definitions and ``tool_choice`` (SPEC: TOOL-1..TOOL-5).

Every tool type of the openai SDK's ``Tool`` union is accepted. A request's tools are kept twice:
as the raw JSON the client sent (``msgspec.Raw``), which is echoed on the Response and forwarded
to upstreams byte for byte (TOOL-1), and as typed views of the parts the engine reads: the
callable tools (``function``, ``custom``, and the functions inside a ``namespace``) and the
*types* of the hosted tools, whose insides the engine never needs (TOOL-4).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec

from protocol.errors import (
    InvalidRequest,
    invalid_value,
    missing_parameter,
    require_fields,
    validation_error,
)
from protocol.footprint import schema_size

# --------------------------------------------------------------------------- tool definitions


class FunctionTool(msgspec.Struct, tag="function", tag_field="type", kw_only=True):
    name: str
    parameters: dict[str, Any] | None = None
    strict: bool | None = None
    description: str | None = None


class CustomTool(msgspec.Struct, tag="custom", tag_field="type", kw_only=True):
    """Free-form text input (e.g. Codex's ``apply_patch``); ``format`` is text or a grammar."""

    name: str
    description: str | None = None
    format: dict[str, Any] | None = None


class NamespaceTool(msgspec.Struct, tag="namespace", tag_field="type", kw_only=True):
    """A named group of function/custom tools; a call to one carries ``namespace`` (TOOL-2)."""

    name: str
    description: str
    tools: list[FunctionTool | CustomTool]


CallableSpec = FunctionTool | CustomTool | NamespaceTool


class McpServerTool(msgspec.Struct, tag="mcp", tag_field="type", kw_only=True):
    """A remote MCP server the engine calls for the model (SPEC §18, MCP-1). ``headers`` and
    ``authorization`` live only here, in memory, for the calls: the tool's raw JSON (echo,
    store, upstreams) is kept without them (MCP-3)."""

    server_label: str
    server_url: str | None = None
    headers: dict[str, str] | None = None
    authorization: str | None = None
    allowed_tools: list[str] | dict[str, Any] | None = None
    require_approval: str | dict[str, Any] | None = None
    server_description: str | None = None
    connector_id: str | None = None
    tunnel_id: str | None = None

    def __repr__(self) -> str:  # never the secrets (MCP-3)
        return f"McpServerTool(server_label={self.server_label!r}, server_url={self.server_url!r})"


# What the echo, the store and upstreams never see of an ``mcp`` tool (MCP-3).
MCP_SECRET_KEYS = ("headers", "authorization")

# The SDK's hosted (built-in) tool types, with the fields its models require. The engine never
# calls them; only an upstream Responses server can (TOOL-4).
HOSTED_TOOL_REQUIRED: dict[str, tuple[str, ...]] = {
    "file_search": ("vector_store_ids",),
    "computer": (),
    "computer_use_preview": ("display_height", "display_width", "environment"),
    "web_search": (),
    "web_search_2025_08_26": (),
    "web_search_preview": (),
    "web_search_preview_2025_03_11": (),
    "mcp": ("server_label",),
    "code_interpreter": ("container",),
    "programmatic_tool_calling": (),
    "image_generation": (),
    "local_shell": (),
    "shell": (),
    "tool_search": (),
    "apply_patch": (),
}
CALLABLE_TOOL_TYPES = ("function", "custom", "namespace")
TOOL_TYPES = CALLABLE_TOOL_TYPES + tuple(HOSTED_TOOL_REQUIRED)


@dataclass(frozen=True, slots=True)
class CallableTool:
    """One tool the model can call and the client runs: a function or a custom tool, possibly
    inside a namespace."""

    spec: FunctionTool | CustomTool
    namespace: str | None = None

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def custom(self) -> bool:
        return isinstance(self.spec, CustomTool)

    @property
    def parameters(self) -> dict[str, Any] | None:
        return self.spec.parameters if isinstance(self.spec, FunctionTool) else None

    @property
    def description(self) -> str | None:
        return self.spec.description


@dataclass(frozen=True, slots=True)
class Toolset:
    """A request's tools: raw (echo, forwarding), callable views, hosted types; built once per
    create by ``protocol.codec.parse_tools``."""

    raw: tuple[msgspec.Raw, ...] = field(default=(), compare=False)
    # per tool: its typed view, or a hosted tool's type
    specs: tuple[CallableSpec | McpServerTool | str, ...] = field(default=(), compare=False)
    callables: tuple[CallableTool, ...] = field(default=(), compare=False)
    hosted: frozenset[str] = field(default=frozenset(), compare=False)
    mcp: tuple[McpServerTool, ...] = field(default=(), compare=False)  # remote MCP (MCP-1)
    key: tuple[bytes, ...] = ()  # the tools' bytes: equal keys, equal toolsets
    # the Response's ``tools`` (TOOL-1, CONF-3), built once: one list object per toolset, so a
    # toolset reused by the connection's next create (CACHE-5) encodes it once (CODEC-6)
    echo: list[msgspec.Raw] = field(default_factory=list, compare=False)
    # What the tools hold beyond an empty toolset (MEM-10), measured once here: a context that
    # keeps the toolset (its header's key) is charged it without walking it again
    nbytes: int = field(default=0, compare=False)

    def __bool__(self) -> bool:
        return bool(self.raw)

    def find(self, name: str, namespace: str | None = None) -> CallableTool | None:
        for tool in self.callables:
            if tool.name == name and (namespace is None or tool.namespace == namespace):
                return tool
        return None


def toolset_of(
    raw: list[msgspec.Raw], specs: Sequence[CallableSpec | McpServerTool | str]
) -> Toolset:
    # A decoded Raw is a view into the whole request frame; the toolset outlives the request
    # (rollout, lane and hydration caches, parking), so each tool keeps its own bytes (LIM-21).
    raw = [r.copy() for r in raw]
    echo = [
        _complete_function(tool) if isinstance(spec, FunctionTool) else tool
        for tool, spec in zip(raw, specs, strict=True)
    ]
    callables: list[CallableTool] = []
    hosted: set[str] = set()
    for spec in specs:
        if isinstance(spec, str):
            hosted.add(spec)
        elif isinstance(spec, McpServerTool):
            hosted.add("mcp")
        elif isinstance(spec, NamespaceTool):
            callables.extend(CallableTool(inner, spec.name) for inner in spec.tools)
        else:
            callables.append(CallableTool(spec))
    kept = tuple(specs)
    key = tuple(bytes(r) for r in raw)
    mcp = tuple(spec for spec in specs if isinstance(spec, McpServerTool))
    return Toolset(
        raw=tuple(raw),
        specs=kept,
        callables=tuple(callables),
        hosted=frozenset(hosted),
        mcp=mcp,
        key=key,
        echo=echo,
        nbytes=_footprint(raw, echo, kept, callables, mcp, key),
    )


def _footprint(
    raw: list[msgspec.Raw],
    echo: list[msgspec.Raw],
    specs: tuple[CallableSpec | McpServerTool | str, ...],
    callables: list[CallableTool],
    mcp: tuple[McpServerTool, ...],
    key: tuple[bytes, ...],
) -> int:
    """What a toolset's tools hold (MEM-10): each tool's own bytes twice (its ``Raw`` and its
    key), an echo completed with defaults (a third copy), the typed views (a ``schema_size``
    walk: ``deep_size`` less the dict keys msgspec shares), the tuples. An empty toolset's
    objects are the context's fixed part."""
    if not raw:
        return 0
    size = schema_size(specs) + 2 * _tuple_size(len(raw))
    size += sum(map(len, raw)) + sum(map(len, key)) + (_RAW_SIZE + 2 * _BYTES_SIZE) * len(raw)
    own = [e for e, r in zip(echo, raw, strict=True) if e is not r]
    size += sum(_RAW_SIZE + _BYTES_SIZE + len(e) for e in own)
    size += (_tuple_size(len(callables)) + _CALLABLE_SIZE * len(callables)) if callables else 0
    size += sys.getsizeof(echo) - _EMPTY_LIST_SIZE
    return size + (_tuple_size(len(mcp)) if mcp else 0)


def _tuple_size(n: int) -> int:
    return _EMPTY_TUPLE_SIZE + 8 * n


def same_tools(toolset: Toolset, raw: list[msgspec.Raw]) -> bool:
    """Whether a request's tools are byte for byte those ``toolset`` was built from (CACHE-5)."""
    key = toolset.key
    return len(key) == len(raw) and all(
        old == bytes(new) for old, new in zip(key, raw, strict=True)
    )


def toolset_from(specs: Sequence[CallableSpec]) -> Toolset:
    """A toolset from typed definitions (in-process callers and tests)."""
    return toolset_of([msgspec.Raw(msgspec.json.encode(s)) for s in specs], list(specs))


EMPTY_TOOLSET = Toolset()
# The objects a toolset's footprint adds up (MEM-10): a ``Raw`` (its buffer is a ``bytes``
# object of its own), a callable's view, the empty echo list every toolset has.
_RAW_SIZE = sys.getsizeof(msgspec.Raw(b""))
_BYTES_SIZE = sys.getsizeof(b"")
_CALLABLE_SIZE = sys.getsizeof(CallableTool(FunctionTool(name="")))
_EMPTY_LIST_SIZE = sys.getsizeof([])
_EMPTY_TUPLE_SIZE = sys.getsizeof(())

# --------------------------------------------------------------------------- parsing

_CALLABLE_SPEC = msgspec.json.Decoder(CallableSpec)


def parse_tools(raw: list[msgspec.Raw]) -> Toolset:
    """Typed views of a request's tools (TOOL-1): every type of the SDK's ``Tool`` union is
    accepted; callable tools are decoded, hosted ones checked for the fields the SDK requires.
    Errors name the JSON path (``tools[2].type``) as CODEC-3 does."""
    specs: list[CallableSpec | McpServerTool | str] = []
    kept = list(raw)
    for index, tool in enumerate(raw):
        where = f"tools[{index}]"
        kind = _tool_kind(tool, where)
        if kind == "mcp":
            spec = _mcp_tool(tool, where)
            specs.append(spec)
            kept[index] = _without_secrets(tool)
        elif kind in CALLABLE_TOOL_TYPES:
            try:
                specs.append(_CALLABLE_SPEC.decode(tool))
            except msgspec.ValidationError as exc:
                raise validation_error(exc, where) from None
        elif kind in HOSTED_TOOL_REQUIRED:
            require_fields(msgspec.json.decode(tool), HOSTED_TOOL_REQUIRED[kind], where)
            specs.append(kind)
        else:
            raise invalid_value(kind, f"{where}.type")
    return toolset_of(kept, specs)


_MCP_SPEC = msgspec.json.Decoder(McpServerTool)


def _mcp_tool(tool: msgspec.Raw, where: str) -> McpServerTool:
    """An ``mcp`` tool (MCP-1, MCP-2): a ``server_url`` this engine calls; connectors and
    tunnels (OpenAI-hosted) are not offered here."""
    require_fields(msgspec.json.decode(tool), ("server_label",), where)
    try:
        spec = _MCP_SPEC.decode(tool)
    except msgspec.ValidationError as exc:
        raise validation_error(exc, where) from None
    for name in ("connector_id", "tunnel_id"):
        if getattr(spec, name) is not None:
            raise InvalidRequest(
                "unsupported_parameter",
                f"'{where}.{name}' is not supported: this server calls remote MCP servers by "
                "'server_url' only.",
                f"{where}.{name}",
            )
    if not spec.server_url:
        raise missing_parameter(f"{where}.server_url")
    return spec


def _without_secrets(tool: msgspec.Raw) -> msgspec.Raw:
    """The tool as echoed, stored and forwarded: without headers or authorization (MCP-3)."""
    data: dict[str, Any] = msgspec.json.decode(tool)
    if not any(key in data for key in MCP_SECRET_KEYS):
        return tool
    return msgspec.Raw(
        msgspec.json.encode({k: v for k, v in data.items() if k not in MCP_SECRET_KEYS})
    )


class _Kind(msgspec.Struct):
    type: Any = None


_KIND = msgspec.json.Decoder(_Kind)


def _tool_kind(tool: msgspec.Raw, where: str) -> str:
    """A tool's ``type``, read without decoding the rest (Codex resends ~15 KB of tools on
    every create)."""
    try:
        kind = _KIND.decode(tool).type
    except msgspec.ValidationError:
        raise InvalidRequest(
            "invalid_type", f"Invalid type for '{where}': expected object.", where
        ) from None
    if kind is None:
        raise missing_parameter(f"{where}.type")
    if not isinstance(kind, str):
        raise invalid_value(kind, f"{where}.type")
    return kind


# --------------------------------------------------------------------------- tool_choice


class ToolChoiceFunction(msgspec.Struct, tag="function", tag_field="type"):
    name: str


class ToolChoiceCustom(msgspec.Struct, tag="custom", tag_field="type"):
    name: str


class ToolChoiceAllowed(msgspec.Struct, tag="allowed_tools", tag_field="type"):
    mode: Literal["auto", "required"]
    tools: list[dict[str, Any]]


class ToolChoiceMcp(msgspec.Struct, tag="mcp", tag_field="type", omit_defaults=True):
    server_label: str
    name: str | None = None


class _HostedChoice(msgspec.Struct, tag_field="type"):
    """Forces a hosted tool; only a backend that runs hosted tools can honour it (TOOL-5)."""


class ChoiceFileSearch(_HostedChoice, tag="file_search"):
    pass


class ChoiceWebSearchPreview(_HostedChoice, tag="web_search_preview"):
    pass


class ChoiceWebSearchPreview20250311(_HostedChoice, tag="web_search_preview_2025_03_11"):
    pass


class ChoiceComputer(_HostedChoice, tag="computer"):
    pass


class ChoiceComputerUse(_HostedChoice, tag="computer_use"):
    pass


class ChoiceComputerUsePreview(_HostedChoice, tag="computer_use_preview"):
    pass


class ChoiceImageGeneration(_HostedChoice, tag="image_generation"):
    pass


class ChoiceCodeInterpreter(_HostedChoice, tag="code_interpreter"):
    pass


class ChoiceApplyPatch(_HostedChoice, tag="apply_patch"):
    pass


class ChoiceShell(_HostedChoice, tag="shell"):
    pass


HostedChoice = (
    ChoiceFileSearch
    | ChoiceWebSearchPreview
    | ChoiceWebSearchPreview20250311
    | ChoiceComputer
    | ChoiceComputerUse
    | ChoiceComputerUsePreview
    | ChoiceImageGeneration
    | ChoiceCodeInterpreter
    | ChoiceApplyPatch
    | ChoiceShell
)
ToolChoice = (
    Literal["auto", "none", "required"]
    | ToolChoiceFunction
    | ToolChoiceCustom
    | ToolChoiceAllowed
    | ToolChoiceMcp
    | HostedChoice
)


def forced_hosted(choice: ToolChoice) -> str | None:
    """The hosted tool type a ``tool_choice`` forces, if any (TOOL-5)."""
    if isinstance(choice, ToolChoiceMcp):
        return "mcp"
    if isinstance(choice, _HostedChoice):
        return str(type(choice).__struct_config__.tag)
    return None


def forced_callable(choice: ToolChoice) -> str | None:
    """The name of the function or custom tool a ``tool_choice`` forces, if any."""
    if isinstance(choice, ToolChoiceFunction | ToolChoiceCustom):
        return choice.name
    return None


# --------------------------------------------------------------------------- the echo

# Keys of a function tool that the Open Responses document requires on the Response (nullable).
FUNCTION_ECHO_KEYS = ("description", "parameters", "strict")


def echoed_tools(toolset: Toolset) -> list[msgspec.Raw]:
    """The Response's ``tools`` (TOOL-1, CONF-3): each tool as the client sent it, except that a
    top-level function tool lacking ``description``, ``parameters`` or ``strict`` gets the
    missing keys as null, which both the SDK and the Open Responses document accept. Built once
    per toolset (``toolset_of``); the list is shared and never mutated."""
    return toolset.echo


class _EchoKeys(msgspec.Struct):
    """Which of ``FUNCTION_ECHO_KEYS`` a function tool has, read without building its schema."""

    description: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    parameters: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET
    strict: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET


_ECHO_KEYS = msgspec.json.Decoder(_EchoKeys)


def _complete_function(raw: msgspec.Raw) -> msgspec.Raw:
    present = _ECHO_KEYS.decode(raw)
    if all(getattr(present, key) is not msgspec.UNSET for key in FUNCTION_ECHO_KEYS):
        return raw
    data: dict[str, Any] = msgspec.json.decode(raw)
    missing = [key for key in FUNCTION_ECHO_KEYS if key not in data]
    encoded = msgspec.json.encode(data | dict.fromkeys(missing))
    return msgspec.Raw(bytes(memoryview(encoded)))  # exact: encode's buffer keeps its spare room
