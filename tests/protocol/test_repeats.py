"""CACHE-6: a create that resends its connection's previous instructions and tools byte for byte
is decoded without them, and decodes to exactly what the whole frame decodes to, whatever
else the frame holds (the same bytes in another field, a nested ``tools`` key, changed tools,
other separators or key order); errors are those of a fresh decode."""

from __future__ import annotations

import json
from typing import Any

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.codec import Repeats, decode_client_event
from protocol.errors import ProtocolError
from protocol.response import CreateParams

INSTRUCTIONS = 'You are a coding agent. Édit files "carefully".\n' * 20
TOOLS: list[dict[str, Any]] = [
    {"type": "function", "name": "read_file", "parameters": {"type": "object"}, "strict": False},
    {"type": "custom", "name": "apply_patch", "description": "Patch files."},
]
OTHER_TOOLS: list[dict[str, Any]] = [TOOLS[0]]
BAD_TOOLS: list[dict[str, Any]] = [{"type": "function", "parameters": {}}]  # no name


def frame(fields: list[tuple[str, Any]], compact: bool = True) -> bytes:
    """A create frame with these fields in this order (as Codex's serde writes them)."""
    body = dict([("type", "response.create"), *fields])
    separators = (",", ":") if compact else (", ", ": ")
    return json.dumps(body, separators=separators, ensure_ascii=False).encode()


def codex(i: int, **change: Any) -> list[tuple[str, Any]]:
    """Codex's field order: model, instructions, previous_response_id, input, tools, ..."""
    output = {"type": "function_call_output", "call_id": f"call_{i}", "output": "x" * i}
    fields = {
        "model": "m",
        "instructions": INSTRUCTIONS,
        "previous_response_id": f"resp_{i:04d}",
        "input": [output],
        "tools": TOOLS,
        "tool_choice": "auto",
        "store": False,
    }
    fields.update(change)
    return [(k, v) for k, v in fields.items() if v is not None]


def outcome(data: bytes, repeats: Repeats | None) -> Any:
    try:
        event = decode_client_event(data, repeats)
    except ProtocolError as err:
        return ("error", err.code, err.param, str(err))
    return msgspec.structs.asdict(event) if isinstance(event, CreateParams) else event


# Frames the previous create's bytes may meet again: the same, changed, moved or mimicked.
VARIANTS: list[list[tuple[str, Any]]] = [
    codex(7),
    codex(8, input=[{"type": "message", "role": "developer", "content": INSTRUCTIONS}]),
    codex(9, tools=OTHER_TOOLS),
    codex(10, tools=None),
    codex(11, tools=BAD_TOOLS),
    codex(12, instructions="Other."),
    codex(13, instructions=None),
    codex(14, input=[{"type": "additional_tools", "tools": TOOLS}], tools=OTHER_TOOLS),
    codex(15, input=[{"type": "additional_tools", "tools": TOOLS}], tools=None),
    codex(16, max_output_tokens="many"),
    [("model", "m"), ("conversation", INSTRUCTIONS), ("input", "hi"), ("tools", TOOLS)],
    [("model", "m"), ("metadata", {"instructions": INSTRUCTIONS}), ("tools", TOOLS)],
    [("model", "m"), ("tools", TOOLS), ("instructions", INSTRUCTIONS), ("input", "hi")],
]


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(range(len(VARIANTS))), st.booleans()), min_size=1, max_size=6
    )
)
def test_a_resent_create_decodes_as_the_whole_frame(steps: list[tuple[int, bool]]) -> None:
    """CACHE-6: after a Codex-shaped create, any sequence of creates decodes on the connection's
    memory exactly as each frame decodes alone (fields, tools, instructions, errors)."""
    repeats = Repeats()
    assert outcome(frame(codex(1)), repeats) == outcome(frame(codex(1)), None)
    for index, compact in steps:
        data = frame(VARIANTS[index], compact)
        assert outcome(data, repeats) == outcome(data, None), VARIANTS[index]


def test_a_resent_create_skips_the_decode_and_reuses_the_objects() -> None:
    """CACHE-6: Codex's resent create is decoded without its instructions and tools; the
    remembered string, raw tools and checked toolset take their place (CACHE-5)."""
    repeats = Repeats()
    first = decode_client_event(frame(codex(1)), repeats)
    assert isinstance(first, CreateParams)
    second = frame(codex(2))
    known = repeats.known_create(second)
    assert known is not None
    assert known.instructions is first.instructions and known.toolset is first.toolset
    assert [bytes(t) for t in known.tools] == [bytes(t) for t in first.tools]
    assert outcome(second, repeats) == outcome(second, None)
    assert repeats.known_create(frame(codex(3, tools=OTHER_TOOLS))) is None
    # on the connection: the remembered tools list itself, where a decode builds a new one
    again = [decode_client_event(frame(codex(i)), repeats) for i in (4, 5)]
    assert isinstance(again[0], CreateParams) and isinstance(again[1], CreateParams)
    assert again[0].tools is again[1].tools and again[0].instructions is first.instructions


def test_the_same_bytes_in_another_field_are_not_taken_for_them() -> None:
    """CACHE-6: the instructions' bytes after a first ``"instructions":`` that is not the
    create's own (a metadata key before it) decode as that value, with no instructions."""
    repeats = Repeats()
    decode_client_event(frame([("model", "m"), ("instructions", INSTRUCTIONS)]), repeats)
    mimic = frame([("model", "m"), ("metadata", {"instructions": INSTRUCTIONS}), ("input", "hi")])
    event = decode_client_event(mimic, repeats)
    assert isinstance(event, CreateParams)
    assert event.instructions is None and event.metadata == {"instructions": INSTRUCTIONS}
