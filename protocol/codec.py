"""Bytes <-> typed events. Decoders and encoders are built once at import (SPEC: CODEC-1..CODEC-5).

Every decoding failure becomes an ``InvalidRequest`` whose ``param`` is the JSON path of the bad
field (``input[2].call_id``), never a Python exception text.
"""

from __future__ import annotations

import secrets
import sys
from collections import OrderedDict
from typing import Any, get_args

import msgspec

from protocol.errors import InvalidRequest, ProtocolError, require_fields, validation_error
from protocol.events import (
    CLIENT_EVENT_TYPES,
    ClientEvent,
    ErrorBody,
    ErrorEvent,
    ResponseCompleted,
    ResponseCreate,
    ResponseCreated,
    ResponseDone,
    ResponseFailed,
    ResponseIncomplete,
    ResponseInProgress,
)
from protocol.items import (
    OPAQUE_ITEMS,
    InputItem,
    Message,
    OpaqueItem,
    TypedItem,
)
from protocol.response import CompactParams, CreateParams, HttpCreateParams
from protocol.tools import Toolset, parse_tools, same_tools


def _enc_hook(obj: Any) -> Any:
    """Opaque input items encode as the object the client sent (ITEM-7)."""
    if isinstance(obj, OpaqueItem):
        return obj.data
    raise NotImplementedError(f"cannot encode {type(obj).__name__}")


_ENCODER = msgspec.json.Encoder(enc_hook=_enc_hook)
SNAPSHOT_EVENTS = frozenset(
    {
        ResponseCreated,
        ResponseInProgress,
        ResponseCompleted,
        ResponseFailed,
        ResponseIncomplete,
        ResponseDone,
    }
)
_CLIENT_EVENT_DECODER = msgspec.json.Decoder(ClientEvent)
_CREATE_BODY_DECODER = msgspec.json.Decoder(HttpCreateParams)  # input items raw (COMPAT-7)
_ITEM_DECODER = msgspec.json.Decoder()
_COMPACT_BODY_DECODER = msgspec.json.Decoder(CompactParams)


def encode(obj: Any) -> bytes:
    """Encode any protocol struct (or plain JSON value) to compact JSON bytes."""
    if type(obj) in SNAPSHOT_EVENTS:
        return b"".join(snapshot_pieces(obj))
    return _ENCODER.encode(obj)


# ---------------------------------------------------------------- lifecycle snapshots (CODEC-6)
# A response's lifecycle events (created, in_progress, done, completed, ...) each carry the whole
# Response, and with it the request's ``instructions`` and ``tools``: for a coding agent ~25 KB
# that never changes between those events (nor, usually, between the turns of a rollout).
# Profiling showed re-encoding them 3x per turn as the largest event-encoding cost (~30 us
# each). Their JSON is encoded once per object and spliced into each event's skeleton. The
# skeleton carries a per-process nonce string in their place, which cannot collide with any
# other content of the event: every other string is JSON-escaped, and the nonce holds a NUL.
_NONCE = f"\x00rollout-static-{secrets.token_hex(8)}"
_NONCE_TOOLS = _NONCE + ":tools"
_NONCE_INSTR = _NONCE + ":instructions"
_NONCE_TOOLS_JSON = _ENCODER.encode(_NONCE_TOOLS)
_NONCE_INSTR_JSON = _ENCODER.encode(_NONCE_INSTR)
_STATIC_BYTES = 16 * 1024 * 1024  # encoded static parts kept (by object identity): a bound
_STATIC_LIMIT = 512  # in bytes and in entries, oldest dropped first
_static: dict[int, tuple[object, bytes]] = {}
_static_size = 0


def _static_json(value: object) -> bytes:
    """The JSON of an unchanging part, encoded once per object (the object is held, so its
    ``id`` cannot be reused while the entry lives)."""
    global _static_size
    entry = _static.get(id(value))
    if entry is not None and entry[0] is value:
        return entry[1]
    data = _ENCODER.encode(value)
    while _static and (len(_static) >= _STATIC_LIMIT or _static_size + len(data) > _STATIC_BYTES):
        _static_size -= len(_static.pop(next(iter(_static)))[1])
    if len(data) <= _STATIC_BYTES:
        _static[id(value)] = (value, data)
        _static_size += len(data)
    return data


SPLICE_MIN_BYTES = 6 * 1024  # smaller parts: encoding the whole event is cheaper (timeit)


def snapshot_pieces(event: Any, splice_min: int = SPLICE_MIN_BYTES) -> tuple[bytes, ...]:
    """A lifecycle snapshot's bytes as pieces that join to ``encode(event)``: one piece, or
    dynamic and unchanging pieces in turn when it carries instructions or tools of
    ``splice_min`` bytes or more together (odd positions: their JSON, the very bytes object
    every snapshot of that part reuses). A socket writes the pieces as they are, and its
    compressor compresses each unchanging part once (WS-19). Below the bound one whole piece:
    a Raw tool list and one string encode faster than the splice (1.0 against 2.5 us for a
    small tool and instructions; 5.7 against 2.5 us for a Codex request's 24 KB)."""
    response = event.response
    tools, instructions = response.tools, response.instructions
    if not tools and not instructions:
        return (_ENCODER.encode(event),)
    tools_json = _static_json(tools) if tools else b""
    if len(tools_json) + (len(instructions) if instructions else 0) < splice_min:
        return (_ENCODER.encode(event),)  # the parts are Raw bytes and one string: cheap whole
    skeleton = msgspec.structs.replace(
        response,
        tools=_NONCE_TOOLS if tools else tools,
        instructions=_NONCE_INSTR if instructions else instructions,
    )
    data = _ENCODER.encode(msgspec.structs.replace(event, response=skeleton))
    # ``instructions`` comes before ``tools`` in the Response's fields, so in its JSON too
    pieces: list[bytes] = []
    start = 0
    if instructions:
        at = data.index(_NONCE_INSTR_JSON)
        pieces += (data[:at], _static_json(instructions))
        start = at + len(_NONCE_INSTR_JSON)
    if tools:
        at = data.index(_NONCE_TOOLS_JSON, start)
        pieces += (data[start:at], tools_json)
        start = at + len(_NONCE_TOOLS_JSON)
    pieces.append(data[start:])
    return tuple(pieces)


_NOT_JSON = InvalidRequest("invalid_json", "The message is not valid JSON.", None)
_TOO_DEEP = InvalidRequest(
    "too_deeply_nested", "The message nests objects or arrays too deeply.", None
)


def _plain_json(frame: bytes | str) -> Any:
    """Untyped decode, used only once typed decoding failed: is this JSON at all? (CODEC-2)
    The typed decoder stops at the first value of the wrong shape, before it would notice
    that the rest is not JSON."""
    try:
        return msgspec.json.decode(frame)
    except msgspec.DecodeError:
        raise _NOT_JSON from None
    except RecursionError:
        raise _TOO_DEEP from None


def _unknown_type(raw: Any) -> InvalidRequest | None:
    """If the frame is an object whose ``type`` we do not serve, say so precisely."""
    if not isinstance(raw, dict):
        return InvalidRequest("invalid_event", "Each message must be a JSON object.", None)
    kind = raw.get("type")
    if kind is None:
        return InvalidRequest(
            "missing_required_parameter", "Missing required parameter: 'type'.", "type"
        )
    if kind not in CLIENT_EVENT_TYPES:
        supported = ", ".join(CLIENT_EVENT_TYPES)
        shown = kind if isinstance(kind, str) and len(kind) <= 64 else "<invalid>"
        return InvalidRequest(
            "unknown_event_type",
            f"Unknown event type '{shown}'. Supported types: {supported}.",
            "type",
        )
    return None


_INSTR_KEY = b'"instructions":'
_TOOLS_KEY = b'"tools":'
_NONCE_TOOLS_LIST = b"[" + _NONCE_TOOLS_JSON + b"]"


# What remembering a toolset costs beyond the key and the toolset's own measure
# (``Toolset.nbytes``): its ordered-dict slot and node, the (toolset, size) pair and what
# decoding leaves with the toolset; measured with tracemalloc (CACHE-7, MEM-10).
RECENT_ENTRY_OVERHEAD = 560


class Repeats:
    """What a connection's latest ``response.create`` sent that a coding agent sends again on
    every turn: its checked tools and its instructions (CACHE-5), and where their bytes stood
    in its frame (CACHE-6). One per connection, so bounded by one frame; nothing here changes a
    byte on the wire."""

    __slots__ = ("_instr_json", "_tools", "_tools_json", "instructions", "toolset")

    def __init__(self) -> None:
        self.toolset: Toolset | None = None
        self.instructions: str | None = None
        self._tools: list[msgspec.Raw] = []
        self._instr_json = b""  # the instructions' JSON as the frame carried it, or b""
        self._tools_json = b""  # the tools array as the frame carried it (compact), or b""

    def reuse(self, params: CreateParams, frame: bytes | str) -> None:
        """Give ``params`` the previous create's toolset when its tools are the same bytes, and
        the previous instructions object when equal (so the snapshot encoder's per-object cache
        hits, CODEC-6). Tools that differ in any byte are checked in full (TOOL-1)."""
        known = self.toolset
        if known is not None and same_tools(known, params.tools):
            params.__dict__["toolset"] = known  # the cached_property's slot
        else:
            self.toolset = params.toolset  # raises as on a fresh connection
        if params.instructions is not None and params.instructions == self.instructions:
            params.instructions = self.instructions
        else:
            self.instructions = params.instructions
        if isinstance(frame, bytes):
            self._learn(params, frame)

    def _learn(self, params: CreateParams, frame: bytes) -> None:
        """Where this frame carries its instructions and tools, for the next create (CACHE-6)."""
        instructions = params.instructions
        # the toolset's own copies: the decoded tools are views that pin the frame (LIM-21)
        self._tools = list(self.toolset.raw) if self.toolset is not None else []
        self._instr_json = self._tools_json = b""
        if instructions:
            data = _static_json(instructions)
            if _find_instructions(frame, data) >= 0:
                self._instr_json = data
        if params.tools:
            data = b"[" + b",".join(bytes(t) for t in params.tools) + b"]"
            if _find_tools(frame, data, 0) >= 0:
                self._tools_json = data

    def known_create(self, frame: bytes) -> ResponseCreate | None:
        """CACHE-6: a create whose frame carries the previous create's instructions and tools,
        byte for byte, decoded without them: their bytes are replaced by placeholders (the
        per-process nonce of CODEC-6), and the previous objects take the placeholders' place
        once both are found as the create's own ``instructions`` and ``tools``. None: decode the
        whole frame."""
        instr, tools = self._instr_json, self._tools_json
        at = _find_instructions(frame, instr) if instr else -1
        if at < 0:
            return None
        pos = at + len(instr)
        pieces = [frame[:at], _NONCE_INSTR_JSON]
        if tools:
            at = _find_tools(frame, tools, pos)
            if at < 0:
                return None
            pieces += (frame[pos:at], _NONCE_TOOLS_LIST)
            pos = at + len(tools)
        pieces.append(frame[pos:])
        try:
            event = _CLIENT_EVENT_DECODER.decode(b"".join(pieces))
        except (msgspec.DecodeError, RecursionError):  # ValidationError is a DecodeError
            return None
        if not isinstance(event, ResponseCreate) or event.instructions != _NONCE_INSTR:
            return None
        if tools:
            if len(event.tools) != 1 or bytes(event.tools[0]) != _NONCE_TOOLS_JSON:
                return None
            event.tools = self._tools
            event.__dict__["toolset"] = self.toolset
        elif event.tools:  # tools the previous create did not send: checked in full
            return None
        event.instructions = self.instructions
        return event


class RecentTools:
    """The checked toolsets of a process's recent HTTP creates, by their tools' bytes (CACHE-7).

    A client that keeps its own history (the openai SDK's loops, Codex over HTTP, NeMo Gym)
    sends the same ``tools`` on every create; a create whose tools are, joined by commas, the
    very bytes of a remembered create's (each tool one JSON value, so the split is unique)
    reuses that create's checked typed view and its echo; any other tools are checked in full
    (``parse_tools``), so errors are a fresh decode's. Bounded: ``max_items`` toolsets and
    about ``max_bytes``, least recently used first out. A toolset with an ``mcp`` tool is never
    kept: its headers and authorization stay with its request (MCP-3)."""

    __slots__ = ("_held", "max_bytes", "max_items", "nbytes")

    def __init__(self, max_items: int = 64, max_bytes: int = 1 << 20) -> None:
        self._held: OrderedDict[bytes, tuple[Toolset, int]] = OrderedDict()
        self.max_items = max_items
        self.max_bytes = max_bytes
        self.nbytes = 0

    def toolset(self, tools: list[msgspec.Raw]) -> Toolset:
        """The checked toolset of ``tools``; raises as ``parse_tools`` does (TOOL-1)."""
        if not tools:
            return parse_tools(tools)
        key = b",".join(tools)
        held = self._held.get(key)
        if held is not None:
            self._held.move_to_end(key)
            return held[0]
        toolset = parse_tools(tools)  # raises as on a fresh request
        size = sys.getsizeof(key) + toolset.nbytes + RECENT_ENTRY_OVERHEAD  # MEM-10
        if toolset.mcp or size > self.max_bytes:
            return toolset
        self._held[key] = (toolset, size)
        self.nbytes += size
        while len(self._held) > self.max_items or self.nbytes > self.max_bytes:
            _, (_, gone) = self._held.popitem(last=False)
            self.nbytes -= gone
        return toolset

    def __len__(self) -> int:
        return len(self._held)


def _find_instructions(frame: bytes, instructions: bytes) -> int:
    """The offset of these very bytes after the frame's first ``"instructions":``; -1 if not."""
    at = frame.find(_INSTR_KEY) + len(_INSTR_KEY)
    return at if at >= len(_INSTR_KEY) and frame.startswith(instructions, at) else -1


def _find_tools(frame: bytes, tools: bytes, start: int) -> int:
    """The offset of ``"tools":`` followed by these very bytes, from ``start``; -1 if none."""
    at = frame.find(_TOOLS_KEY, start)
    while at >= 0 and not frame.startswith(tools, at + len(_TOOLS_KEY)):
        at = frame.find(_TOOLS_KEY, at + len(_TOOLS_KEY))
    return at + len(_TOOLS_KEY) if at >= 0 else -1


def decode_client_event(frame: bytes | str, repeats: Repeats | None = None) -> ClientEvent:
    """Decode one WebSocket text frame into a typed client event; ``repeats`` is the
    connection's memory of its latest create (CACHE-5, CACHE-6)."""
    if repeats is not None and isinstance(frame, bytes):
        known = repeats.known_create(frame)
        if known is not None:
            return known
    try:
        event = _CLIENT_EVENT_DECODER.decode(frame)
    except msgspec.ValidationError as exc:
        raise _unknown_type(_plain_json(frame)) or validation_error(exc) from None
    except msgspec.DecodeError:
        raise _NOT_JSON from None
    except RecursionError:  # msgspec's own depth guard (CODEC-2)
        raise _TOO_DEEP from None
    if isinstance(event, CreateParams):
        if repeats is not None:
            repeats.reuse(event, frame)
        else:
            _ = event.toolset  # tools are checked when the request is decoded (TOOL-1)
    return event


def decode_create_body(body: bytes, recent: RecentTools | None = None) -> CreateParams:
    """Decode an HTTP ``POST /v1/responses`` (or ``/input_tokens``) body; ``recent``: the
    process's remembered toolsets, reused for the same tools' bytes (CACHE-7)."""
    params: CreateParams = _decode_body(_CREATE_BODY_DECODER, body)
    if recent is not None:  # the cached_property's slot
        params.__dict__["toolset"] = recent.toolset(params.tools)
    else:
        _ = params.toolset  # a bad tool is an error of the request's decoding (TOOL-1)
    return params


def decode_compact_body(body: bytes) -> CompactParams:
    """Decode an HTTP ``POST /v1/responses/compact`` body (COMPACT-1)."""
    params: CompactParams = _decode_body(_COMPACT_BODY_DECODER, body)
    return params


def _decode_body(decoder: msgspec.json.Decoder[Any], body: bytes) -> Any:
    try:
        return decoder.decode(body)
    except msgspec.ValidationError as exc:
        _plain_json(body)
        raise validation_error(exc) from None
    except msgspec.DecodeError:
        raise _NOT_JSON from None
    except RecursionError:
        raise _TOO_DEEP from None


# An item whose ``type`` names one of TypedItem's classes converts straight to that class:
# msgspec caches a Struct class's type info, but rebuilds a union's on every ``convert`` (~8 us
# an item against ~0.2). The class checks the same fields (and the tag) with the same messages;
# any other ``type`` goes through the union, which words the error (CODEC-1).
_ITEM_CLASSES: dict[Any, Any] = {cls.__struct_config__.tag: cls for cls in get_args(TypedItem)}


def parse_input(raw: str | list[Any], param: str = "input", start: int = 0) -> list[InputItem]:
    """Normalize ``input`` (a string or a list of items) to typed items (ITEM-1, ITEM-2).

    A string is one user message. Items without ``type`` but with ``role`` are messages (the
    Agents SDK sends them that way). An item may still be raw JSON (``msgspec.Raw``, an HTTP
    body's, COMPAT-7): it is decoded here. ``start``: the index of ``raw[0]`` in the request's
    own ``input``, which errors name.
    """
    if isinstance(raw, str):
        return [Message(role="user", content=raw)]
    items: list[InputItem] = []
    for index, entry in enumerate(raw, start):
        where = f"{param}[{index}]"
        if entry.__class__ is msgspec.Raw:
            try:
                entry = _ITEM_DECODER.decode(entry)
            except RecursionError:
                raise _TOO_DEEP from None
        if isinstance(entry, dict) and "type" not in entry and "role" in entry:
            entry = {**entry, "type": "message"}
        kind = entry.get("type") if isinstance(entry, dict) else None
        if isinstance(kind, str) and kind in OPAQUE_ITEMS:  # a non-string type is a bad item
            items.append(_opaque(entry, where))
            continue
        try:
            target = _ITEM_CLASSES.get(kind, TypedItem) if isinstance(kind, str) else TypedItem
            items.append(msgspec.convert(entry, target))
        except msgspec.ValidationError as exc:
            raise validation_error(exc, where) from None
        except RecursionError:
            raise _TOO_DEEP from None
    return items


def _opaque(entry: dict[str, Any], where: str) -> OpaqueItem:
    """An item carried as sent (ITEM-7), once the fields the SDK requires are known present."""
    require_fields(entry, OPAQUE_ITEMS[entry["type"]], where)
    ident = entry.get("id")
    if ident is not None and not isinstance(ident, str):
        raise InvalidRequest(
            "invalid_type", f"Invalid type for '{where}.id': expected str.", f"{where}.id"
        )
    return OpaqueItem(entry)


def error_event(
    err: ProtocolError, *, stream_id: str | None = None, sequence_number: int | None = None
) -> ErrorEvent:
    body = ErrorBody(type=err.error_type, code=err.code, message=err.message, param=err.param)
    return ErrorEvent(
        status=err.status,
        error=body,
        stream_id=stream_id,
        sequence_number=sequence_number,
        headers=err.headers or None,
    )


def http_error_body(err: ProtocolError) -> bytes:
    """The HTTP error body: ``{"error": {...}}`` (ERR-2)."""
    body = ErrorBody(type=err.error_type, code=err.code, message=err.message, param=err.param)
    return _ENCODER.encode({"error": body})
