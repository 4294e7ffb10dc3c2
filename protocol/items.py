"""Input and output items and their content parts (SPEC: ITEM-1..ITEM-9).

The same structs serve as input (what clients send, including replayed output) and output (what
the model produced). Optional fields default to ``None`` and are omitted on the wire when unset,
so a replayed item is echoed the way the client sent it.

Items the engine reads are typed structs. Every other item type of the SDK's
``ResponseInputItem`` union (hosted-tool calls and their outputs, MCP items, tool search …) is
carried as an ``OpaqueItem``: the JSON object exactly as sent, rendered for the model and
forwarded to upstreams as it is (ITEM-7).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Final, Literal, cast

import msgspec

Role = Literal["user", "assistant", "system", "developer"]
ItemStatus = Literal["in_progress", "completed", "incomplete"]


class InputText(msgspec.Struct, tag="input_text", tag_field="type"):
    text: str


class OutputText(msgspec.Struct, tag="output_text", tag_field="type"):
    text: str
    annotations: list[Any] = msgspec.field(default_factory=list)
    logprobs: list[Any] = msgspec.field(default_factory=list)


class Refusal(msgspec.Struct, tag="refusal", tag_field="type"):
    refusal: str


class InputImage(msgspec.Struct, tag="input_image", tag_field="type", omit_defaults=True):
    detail: str = "auto"
    image_url: str | None = None
    file_id: str | None = None


class InputFile(msgspec.Struct, tag="input_file", tag_field="type", omit_defaults=True):
    file_id: str | None = None
    file_data: str | None = None
    file_url: str | None = None
    filename: str | None = None


ContentPart = InputText | OutputText | Refusal | InputImage | InputFile


class Message(msgspec.Struct, tag="message", tag_field="type", omit_defaults=True, kw_only=True):
    role: Role
    content: str | list[ContentPart]
    id: str | None = None
    status: ItemStatus | None = None
    phase: Literal["commentary", "final_answer"] | None = None
    # Training fields (TOK-60): on the last item of a sampling step, the step's whole prompt,
    # its sampled ids and their logprobs (NeMo Gym's names); sent back, they continue the
    # trajectory exactly (TOK-62).
    prompt_token_ids: list[int] | None = None
    generation_token_ids: list[int] | None = None
    generation_log_probs: list[float | None] | None = None


class FunctionCall(
    msgspec.Struct, tag="function_call", tag_field="type", omit_defaults=True, kw_only=True
):
    call_id: str
    name: str
    arguments: str
    id: str | None = None
    status: ItemStatus | None = None
    namespace: str | None = None
    # Training fields (TOK-60): on the last item of a sampling step, the step's whole prompt,
    # its sampled ids and their logprobs (NeMo Gym's names); sent back, they continue the
    # trajectory exactly (TOK-62).
    prompt_token_ids: list[int] | None = None
    generation_token_ids: list[int] | None = None
    generation_log_probs: list[float | None] | None = None


class FunctionCallOutput(
    msgspec.Struct, tag="function_call_output", tag_field="type", omit_defaults=True, kw_only=True
):
    call_id: str
    output: str | list[ContentPart]
    id: str | None = None
    status: ItemStatus | None = None


class CustomToolCall(
    msgspec.Struct, tag="custom_tool_call", tag_field="type", omit_defaults=True, kw_only=True
):
    """A call of a free-form ``custom`` tool: ``input`` is plain text, not JSON (TOOL-3)."""

    call_id: str
    name: str
    input: str
    id: str | None = None
    status: ItemStatus | None = None
    namespace: str | None = None
    # Training fields (TOK-60): on the last item of a sampling step, the step's whole prompt,
    # its sampled ids and their logprobs (NeMo Gym's names); sent back, they continue the
    # trajectory exactly (TOK-62).
    prompt_token_ids: list[int] | None = None
    generation_token_ids: list[int] | None = None
    generation_log_probs: list[float | None] | None = None


class CustomToolCallOutput(
    msgspec.Struct,
    tag="custom_tool_call_output",
    tag_field="type",
    omit_defaults=True,
    kw_only=True,
):
    call_id: str
    output: str | list[ContentPart]
    id: str | None = None
    status: ItemStatus | None = None


class Compaction(
    msgspec.Struct, tag="compaction", tag_field="type", omit_defaults=True, kw_only=True
):
    """The summary of an earlier context (ITEM-8, COMPACT-1..COMPACT-5). ``encrypted_content`` is
    opaque to clients: this server's own summaries are sealed by
    ``engine.conversation.compaction``; an
    upstream's are kept byte for byte and forwarded to it."""

    encrypted_content: str
    id: str | None = None
    created_by: str | None = None


class ItemReference(msgspec.Struct, tag="item_reference", tag_field="type"):
    id: str


class SummaryText(msgspec.Struct, tag="summary_text", tag_field="type"):
    text: str


class ReasoningText(msgspec.Struct, tag="reasoning_text", tag_field="type"):
    text: str


class Reasoning(
    msgspec.Struct, tag="reasoning", tag_field="type", omit_defaults=True, kw_only=True
):
    """Replayed reasoning passes through untouched (ITEM-5); a ``tokens`` route with a
    reasoning parser produces it, its text as one ``reasoning_text`` part (REASON-1).
    ``summary`` is None when the client left it out, so an echo stays as sent; an output item
    always carries it (the SDK requires it)."""

    id: str
    summary: list[SummaryText] | None = None
    content: list[ReasoningText] | None = None
    encrypted_content: str | None = None
    status: ItemStatus | None = None
    # Training fields (TOK-60): on the last item of a sampling step, the step's whole prompt,
    # its sampled ids and their logprobs (NeMo Gym's names); sent back, they continue the
    # trajectory exactly (TOK-62).
    prompt_token_ids: list[int] | None = None
    generation_token_ids: list[int] | None = None
    generation_log_probs: list[float | None] | None = None


class OpaqueItem:
    """An input item whose insides the engine does not need: kept as the decoded JSON object and
    encoded back exactly (``protocol.codec``'s encoder hook). ``id`` is read for references."""

    __slots__ = ("data", "id", "type")

    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data
        self.type = str(data["type"])
        ident = data.get("id")
        self.id = ident if isinstance(ident, str) else None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, OpaqueItem) and other.data == self.data

    def __hash__(self) -> int:
        return hash((self.type, self.id))

    def __repr__(self) -> str:
        return f"OpaqueItem({self.data!r})"


# Carried as ``OpaqueItem`` (ITEM-7): the rest of the SDK's ``ResponseInputItem`` union, with the
# fields its models require (checked, so that what is echoed stays valid for the SDK).
OPAQUE_ITEMS: dict[str, tuple[str, ...]] = {
    "file_search_call": ("id", "queries", "status"),
    "computer_call": ("id", "call_id", "pending_safety_checks", "status"),
    "computer_call_output": ("call_id", "output"),
    "web_search_call": ("id", "action", "status"),
    "tool_search_call": ("arguments",),
    "tool_search_output": ("tools",),
    "additional_tools": ("role", "tools"),
    "configuration_update": (),
    "image_generation_call": ("id", "status"),
    "code_interpreter_call": ("id", "container_id", "status"),
    "local_shell_call": ("id", "action", "call_id", "status"),
    "local_shell_call_output": ("id", "output"),
    "shell_call": ("action", "call_id"),
    "shell_call_output": ("call_id", "output"),
    "apply_patch_call": ("call_id", "operation", "status"),
    "apply_patch_call_output": ("call_id", "status"),
    "mcp_list_tools": ("id", "server_label", "tools"),
    "mcp_approval_request": ("id", "arguments", "name", "server_label"),
    "mcp_approval_response": ("approval_request_id", "approve"),
    "mcp_call": ("id", "arguments", "name", "server_label"),
    "compaction_trigger": (),
    "program": ("id", "call_id", "code", "fingerprint"),
    "program_output": ("id", "call_id", "result", "status"),
}

# --------------------------------------------------------------------------- remote MCP (MCP-*)
# The engine's own MCP output items (MCP-4, MCP-6, MCP-9). As input (a client replaying them)
# they stay ``OpaqueItem``s like every MCP item; as output they are typed, so a stored Response
# decodes them.


class McpListedTool(msgspec.Struct, omit_defaults=True, kw_only=True):
    name: str
    input_schema: Any
    description: str | None = None
    annotations: Any = None


class McpListTools(
    msgspec.Struct, tag="mcp_list_tools", tag_field="type", omit_defaults=True, kw_only=True
):
    id: str
    server_label: str
    tools: list[McpListedTool]
    error: str | None = None


class McpCall(msgspec.Struct, tag="mcp_call", tag_field="type", omit_defaults=True, kw_only=True):
    id: str
    server_label: str
    name: str
    arguments: str
    output: str | None = None
    error: dict[str, Any] | None = None
    approval_request_id: str | None = None
    status: Literal["in_progress", "completed", "incomplete", "calling", "failed"] | None = None


class McpApprovalRequest(
    msgspec.Struct, tag="mcp_approval_request", tag_field="type", omit_defaults=True, kw_only=True
):
    id: str
    server_label: str
    name: str
    arguments: str


McpItem = McpListTools | McpCall | McpApprovalRequest

TypedItem = (
    Message
    | FunctionCall
    | FunctionCallOutput
    | CustomToolCall
    | CustomToolCallOutput
    | Compaction
    | ItemReference
    | Reasoning
)
InputItem = TypedItem | OpaqueItem
ToolCall = FunctionCall | CustomToolCall
ToolOutput = FunctionCallOutput | CustomToolCallOutput
OutputItem = Message | FunctionCall | CustomToolCall | Compaction | Reasoning | McpItem
# The items a sampling step's training fields ride on (TOK-60): what the model itself writes.
TrainableItem = Message | FunctionCall | CustomToolCall | Reasoning
TRAINING_FIELDS = ("prompt_token_ids", "generation_token_ids", "generation_log_probs")
# The same as a set of exact types: a set lookup of ``type(item)`` costs a twentieth of an
# ``isinstance`` against the union that misses (each miss asks the struct's metaclass), and
# every input item of every turn is asked (no subclass of these structs exists).
TRAINABLE_TYPES: Final = frozenset({Message, FunctionCall, CustomToolCall, Reasoning})


def carries_tokens(item: InputItem) -> bool:
    """The item carries any training field (TOK-62)."""
    if type(item) not in TRAINABLE_TYPES:
        return False
    trainable = cast(TrainableItem, item)
    return (
        trainable.prompt_token_ids is not None
        or trainable.generation_token_ids is not None
        or trainable.generation_log_probs is not None
    )


def without_tokens(item: InputItem) -> InputItem:
    """The item without its training fields (what the context keeps and the store lists)."""
    if not carries_tokens(item):
        return item
    assert isinstance(item, TrainableItem)
    return msgspec.structs.replace(
        item, prompt_token_ids=None, generation_token_ids=None, generation_log_probs=None
    )


def part_text(part: ContentPart) -> str | None:
    """The readable text of one content part; None for images and files."""
    if isinstance(part, InputText | OutputText):
        return part.text
    if isinstance(part, Refusal):
        return part.refusal
    return None


def text_of(
    content: str | list[ContentPart],
    placeholder: Callable[[ContentPart], str | None] | None = None,
) -> str:
    """All readable text of a message or tool-output content, joined in order.

    A part without text (an image, a file) is skipped, or stands as ``placeholder(part)`` when
    one is given (the chat template marks where an image or a file was)."""
    if isinstance(content, str):
        return content
    out: list[str] = []
    for part in content:
        text = part_text(part)
        if text is None and placeholder is not None:
            text = placeholder(part)
        if text is not None:
            out.append(text)
    return "\n".join(out)


def item_texts(item: InputItem) -> list[str]:
    """Every text the model will read from one item (used by the safety scan)."""
    if isinstance(item, Message):
        return [text_of(item.content)]
    if isinstance(item, FunctionCall):
        return [item.arguments]
    if isinstance(item, CustomToolCall):
        return [item.input]
    if isinstance(item, FunctionCallOutput | CustomToolCallOutput):
        return [text_of(item.output)]
    if isinstance(item, Reasoning):
        return [reasoning_text(item)]
    if isinstance(item, OpaqueItem):
        return [opaque_text(item)]
    return []


def reasoning_text(item: Reasoning) -> str:
    """What a model reads of a reasoning item: its reasoning text, else its summary (REASON-4)."""
    if item.content:
        return "\n".join(part.text for part in item.content)
    return "\n".join(part.text for part in item.summary or ())


def opaque_text(item: OpaqueItem) -> str:
    """What the model reads of an opaque item: its JSON without ``type`` and ``id`` (ITEM-7)."""
    body = {k: v for k, v in item.data.items() if k not in ("type", "id")}
    return msgspec.json.encode(body).decode()
