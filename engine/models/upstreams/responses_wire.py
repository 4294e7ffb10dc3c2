"""Responses items <-> an upstream Responses server (pure; SPEC: UP-RESP-1..UP-RESP-5).

Request: our items are already Responses items, so they pass through as they are, except that
our own item ``id``/``status`` are stripped (the upstream never saw those ids and rejects unknown
ones when it does not store) and ``reasoning`` items are dropped unless the route says the
upstream produced them (``pass_reasoning``): reasoning from another model is opaque to it.
Opaque items (ITEM-7) and tools (TOOL-1) are forwarded exactly as the client sent them.

Response events: message text, function calls (with their ``namespace``) and custom tool calls
are relayed as deltas; other output items (reasoning, hosted tool calls) are not produced by this
engine and are skipped (counted).

Compaction items made by the upstream (its ``/responses/compact``) go back to it unchanged;
this server's own summaries go as a user message (COMPACT-5).
"""

from __future__ import annotations

import secrets
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, cast, get_args

import msgspec

from engine.conversation.compaction import unseal
from engine.conversation.context import Context
from engine.conversation.footprint import LIST_SLOT
from engine.conversation.tokens import count
from engine.models.base import ArgsDelta, CallEnd, CallStart, Delta, Finish, TextDelta
from engine.models.compaction import Compacted
from engine.models.upstreams.endpoint import UpstreamError, safe_message
from protocol.codec import parse_input
from protocol.errors import InvalidRequest
from protocol.items import (
    Compaction,
    CustomToolCall,
    CustomToolCallOutput,
    FunctionCall,
    FunctionCallOutput,
    InputItem,
    Message,
    OpaqueItem,
    Reasoning,
)
from protocol.tools import ToolChoice

# Exact types (no item type is subclassed): one set lookup, where ``isinstance`` over a tuple
# asks each Struct type it misses its metaclass (~0.1 us each).
_Plain = Message | FunctionCall | FunctionCallOutput | CustomToolCall | CustomToolCallOutput
_PLAIN = frozenset(get_args(_Plain))

# MCP items the engine itself runs: the upstream sees their calls as function calls (MCP-6).
ENGINE_MCP_ITEMS = frozenset({"mcp_list_tools", "mcp_approval_response"})

RESERVED = frozenset({"model", "input", "stream", "previous_response_id", "store", "tools"})


@dataclass(frozen=True)
class ResponsesOptions:
    model: str | None = None  # None: pass the client's model name through
    continue_by_id: bool = False  # the upstream stores responses and accepts previous_response_id
    pass_reasoning: bool = False
    params: dict[str, Any] = field(default_factory=dict)


_ENCODER = msgspec.json.Encoder()
_BUFFER = bytearray()  # reused: the kept copy is exact-sized (an encoder's own bytes are not)


def _kept(value: Any) -> msgspec.Raw:
    """``value``'s JSON in bytes of exactly its length (what MEM-10 charges)."""
    _ENCODER.encode_into(value, _BUFFER)
    return msgspec.Raw(bytes(_BUFFER))


def input_entry(item: InputItem, pass_reasoning: bool) -> msgspec.Raw | str:
    """One context item as an entry of the upstream's ``input``, encoded once (UP-RESP-1,
    UP-RESP-6), or the kind it is dropped as (a ``str``: reasoning from another model, the
    engine's own MCP bookkeeping, MCP-6; an unsendable item, ``""``)."""
    if type(item) in _PLAIN:
        return _kept(msgspec.structs.replace(cast(_Plain, item), id=None, status=None))
    if type(item) is Compaction:
        return _kept(compaction_input(item))
    if type(item) is OpaqueItem and item.type in ENGINE_MCP_ITEMS:
        return item.type
    if type(item) is OpaqueItem:
        return _kept(item.data)
    if type(item) is Reasoning:
        return _kept(item) if pass_reasoning else "reasoning"
    return ""


@dataclass(slots=True)
class _Sendable:
    """Where each context item's entry sits among the kept ones (``Wire.entries`` holds only
    what is sent): ``before[i]``, the entries of the items before item ``i``; ``dropped``, the
    items not sent, by index, with the kind counted each time a step passes them over."""

    before: list[int] = field(default_factory=lambda: [0])
    dropped: list[tuple[int, str]] = field(default_factory=list)

    def copy(self) -> _Sendable:
        return _Sendable(list(self.before), list(self.dropped))


INDEX_SLOT = LIST_SLOT + 32  # an entry of ``before``: the slot and the int it holds (MEM-10)


def input_items(
    ctx: Context, start: int, pass_reasoning: bool, dropped: Counter[str]
) -> list[msgspec.Raw]:
    """``ctx.items[start:]`` as the upstream's ``input`` (UP-RESP-1). Each item is encoded
    once, when a step first sends it, and kept on the context (``Context.wire``, charged like
    the items, MEM-10): a step re-encodes none of the history it resends, nor walks it in
    Python (UP-RESP-6)."""
    wire = ctx.wire_for(("responses", pass_reasoning))
    index = wire.state
    if index is None:
        index = wire.state = _Sendable()
    for n in range(wire.covered, len(ctx.items)):
        entry = input_entry(ctx.items[n], pass_reasoning)
        if isinstance(entry, str):
            if entry:
                index.dropped.append((n, entry))
                wire.nbytes += LIST_SLOT + 64  # the pair and its int
        else:
            wire.add(entry)
        index.before.append(len(wire.entries))
        wire.nbytes += INDEX_SLOT
    wire.covered = len(ctx.items)
    for n, kind in index.dropped:
        if n >= start:
            dropped[kind] += 1
    return wire.entries[index.before[start] :]  # a copy: later steps extend the kept list


SUMMARY_HEADER = "Summary of the earlier conversation:\n"


def compaction_input(item: Compaction) -> dict[str, Any]:
    """COMPACT-5: an upstream's own compaction goes back to it unchanged (without our ``id``, as
    every item, UP-RESP-1); ours (which it cannot read) goes as a user message with the
    summary."""
    summary = unseal(item.encrypted_content)
    if summary is None:
        return {"type": "compaction", "encrypted_content": item.encrypted_content}
    return {"type": "message", "role": "user", "content": SUMMARY_HEADER + summary}


def tool_choice_for(choice: ToolChoice) -> Any:
    return msgspec.to_builtins(choice)


# --------------------------------------------------------------------------- stream events


class Item(msgspec.Struct):
    type: str = ""
    call_id: str | None = None
    name: str | None = None
    arguments: str | None = None
    input: str | None = None  # custom tool calls
    namespace: str | None = None


class InDetails(msgspec.Struct):
    cached_tokens: int | None = None


class WireUsage(msgspec.Struct):
    """An upstream's ``usage`` as its wire carries it (not ``protocol.response.Usage``)."""

    input_tokens: int | None = None
    output_tokens: int | None = None
    input_tokens_details: InDetails | None = None


class Incomplete(msgspec.Struct):
    reason: str | None = None


class Snapshot(msgspec.Struct):
    id: str | None = None
    usage: WireUsage | None = None
    incomplete_details: Incomplete | None = None
    error: Any = None


class Event(msgspec.Struct):
    type: str = ""
    delta: Any = None
    item: Item | None = None
    response: Snapshot | None = None
    status: int | None = None  # WebSocket-style error envelopes carry one
    error: Any = None
    message: str | None = None


class EventMapper:
    """Relays one upstream response's events as deltas; records its id, usage and end."""

    def __init__(self, secrets_: tuple[str | None, ...] = ()) -> None:
        self.secrets = secrets_
        self.call_open = False
        self.args_seen = False
        self.text_open = False
        self.items = 0  # output items as the rollout will absorb them (text runs + calls)
        self.calls = 0
        self.emitted: list[str] = []
        self.final: Finish | None = None
        self.response_id: str | None = None
        self.skipped: Counter[str] = Counter()

    def feed(self, event: Event) -> list[Delta]:
        handler = _HANDLERS.get(event.type)
        return handler(self, event) if handler is not None else []

    def _added(self, event: Event) -> list[Delta]:
        item = event.item or Item()
        if item.type not in _CALL_TYPES:
            if item.type not in ("message", ""):
                self.skipped[item.type] += 1
            return []
        self.call_open, self.args_seen, self.text_open = True, False, False
        self.items += 1
        self.calls += 1
        call_id = item.call_id or "call_" + secrets.token_hex(12)
        custom = item.type == "custom_tool_call"
        return [CallStart(call_id, item.name or "", item.namespace, custom)]

    def _text(self, event: Event) -> list[Delta]:
        if not isinstance(event.delta, str) or not event.delta or self.call_open:
            return []
        if not self.text_open:
            self.text_open = True
            self.items += 1
        self.emitted.append(event.delta)
        return [TextDelta(event.delta)]

    def _args(self, event: Event) -> list[Delta]:
        if not self.call_open or not isinstance(event.delta, str) or not event.delta:
            return []
        self.args_seen = True
        self.emitted.append(event.delta)
        return [ArgsDelta(event.delta)]

    def _done(self, event: Event) -> list[Delta]:
        item = event.item or Item()
        if item.type not in _CALL_TYPES or not self.call_open:
            return []
        out: list[Delta] = []
        final = item.input if item.type == "custom_tool_call" else item.arguments
        if not self.args_seen and final:  # servers that only send the final arguments
            self.emitted.append(final)
            out.append(ArgsDelta(final))
        self.call_open = False
        out.append(CallEnd())
        return out

    def _terminal(self, event: Event) -> list[Delta]:
        snap = event.response or Snapshot()
        self.response_id = snap.id
        if event.type == "response.failed":
            detail = safe_message(msgspec.json.encode(snap.error), self.secrets)
            raise UpstreamError(f"The model server failed the response: {detail}")
        reason = "tool_calls" if self.calls else "stop"
        incomplete = snap.incomplete_details
        if incomplete is not None and incomplete.reason == "max_output_tokens":
            reason = "length"
        self.final = self._finish(reason, snap.usage)
        return []

    def _finish(self, reason: Any, usage: WireUsage | None) -> Finish:
        if usage is None or usage.output_tokens is None:
            return Finish(reason, count("".join(self.emitted)), usage_estimated=True)
        details = usage.input_tokens_details
        return Finish(
            reason,
            usage.output_tokens,
            input_tokens=usage.input_tokens,
            cached_tokens=details.cached_tokens if details is not None else None,
        )

    def _error(self, event: Event) -> list[Delta]:
        body = event.error if event.error is not None else {"message": event.message}
        detail = safe_message(msgspec.json.encode(body), self.secrets)
        status = event.status if event.status is not None and event.status >= 400 else None
        if status is not None and status < 500:
            text = f"The model server rejected the request (HTTP {status}): {detail}"
            raise UpstreamError(text, status)
        raise UpstreamError(f"The model server reported an error: {detail}")


_CALL_TYPES = ("function_call", "custom_tool_call")

_HANDLERS = {
    "response.output_item.added": EventMapper._added,
    "response.output_text.delta": EventMapper._text,
    "response.refusal.delta": EventMapper._text,
    "response.function_call_arguments.delta": EventMapper._args,
    "response.custom_tool_call_input.delta": EventMapper._args,
    "response.output_item.done": EventMapper._done,
    "response.completed": EventMapper._terminal,
    "response.incomplete": EventMapper._terminal,
    "response.failed": EventMapper._terminal,
    "error": EventMapper._error,
}


# --------------------------------------------------------------------------- compaction


class CompactedBody(msgspec.Struct):
    """The upstream's ``/responses/compact`` answer (the fields we use)."""

    output: list[Any]
    usage: WireUsage | None = None


def compacted_from(body: CompactedBody, ctx: Context) -> Compacted:
    """Its window becomes ours: the items decode as input items, one of them the compaction."""
    try:
        items = parse_input(body.output, "output")
    except InvalidRequest as exc:
        raise UpstreamError("The model server sent a malformed compaction.") from exc
    item = next((i for i in items if isinstance(i, Compaction)), None)
    if item is None:
        raise UpstreamError("The model server's compaction has no compaction item.")
    usage = body.usage or WireUsage()
    input_tokens = ctx.prompt_tokens if usage.input_tokens is None else usage.input_tokens
    output_tokens = usage.output_tokens or 0
    return Compacted(items, item, input_tokens, output_tokens)
