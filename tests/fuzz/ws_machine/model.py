"""What the WebSocket machine knows: its constants, strategies, the model of the server's state
(cached responses, lanes, live append rollouts) and the simulator's policy it predicts from."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, TypeVar

import msgspec
from hypothesis import strategies as st

from tests.fuzz._support import (
    _INTERNAL,
)

T = TypeVar("T")
MAX_QUEUED = 3  # a small lane queue so that the fuzzer reaches websocket_queue_full (WS-6)
LANES: list[str | None] = [None, "a", "b.2-x"]
APPEND_BETA = {"OpenAI-Beta": "rollout-append=v1"}
MULTI_AGENT_BETA = "responses_multi_agent=v1"  # standard-mode injects (INJECT-1)
# Steering rules (STEER-*) run on a lane of their own, and a paced simulator lets a steer land
# while a response streams (the other routes run at full speed: tokens_per_second=0).
STEER_LANE = "steer.x"
SLOW_MODEL = "sim-paced"
SLOW_TPS = 500.0

TOOL_DEFS: dict[str, dict[str, Any]] = {
    "get_weather": {
        "type": "function",
        "name": "get_weather",
        "description": "Weather for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
    "lookup": {
        "type": "function",
        "name": "lookup",
        "parameters": {
            "type": "object",
            "properties": {"query": {"type": "string"}, "limit": {"type": "integer"}},
        },
    },
    "noop": {"type": "function", "name": "noop"},
}
TOOL_NAMES = list(TOOL_DEFS)
VOCAB = ["what", "is", "the", "Paris", "Tokyo", "please", "check", "and", "then", "say", "hi"]

# ----------------------------------------------------------------------------- strategies

cjk = st.text(st.characters(min_codepoint=0x3040, max_codepoint=0x9FFF), max_size=6)
emoji = st.text(st.characters(min_codepoint=0x1F300, max_codepoint=0x1F64F), max_size=3)
user_texts = st.builds(
    lambda words, extra: " ".join(words) + extra,
    st.lists(st.sampled_from(VOCAB + TOOL_NAMES), min_size=1, max_size=6),
    st.one_of(st.just(""), cjk, emoji),
)
tool_sets = st.lists(st.sampled_from(TOOL_NAMES), unique=True, max_size=3)
output_texts = st.one_of(
    st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=40),
    st.sampled_from(["sunny", "42", "", "ok\nline two", "ünïcødé ✓ 雨"]),
)
tool_choices = st.sampled_from(["auto", "auto", "required", "none", "function"])
# in append mode a forced choice never finishes the rollout (a call after every resume)
append_tool_choices = st.sampled_from(["auto"] * 5 + ["required", "function", "none"])
message_forms = st.sampled_from(["string", "easy", "typed", "parts"])
stores = st.booleans()
small_budgets = st.sampled_from([None] * 8 + [1, 4])
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=6,
)
steer_texts = st.lists(st.sampled_from(VOCAB), min_size=1, max_size=5).map(" ".join)
safe_text = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=70).filter(
    lambda s: not _INTERNAL.search(s)
)

# (field, bad value, expected code, expected param): CODEC-3 over response.create
WRONG_FIELDS: list[tuple[str, Any, str, str | None]] = [
    ("model", 1, "invalid_type", "model"),
    ("input", 5, "invalid_type", "input"),
    ("input", {"a": 1}, "invalid_type", "input"),
    ("store", "yes", "invalid_type", "store"),
    ("temperature", "hot", "invalid_type", "temperature"),
    ("tools", "x", "invalid_type", "tools"),
    ("tools", [{"type": "no_such_tool"}], "invalid_value", "tools[0].type"),
    ("tools", [{"type": "function"}], "missing_required_parameter", "tools[0].name"),
    ("tool_choice", "sometimes", "invalid_value", "tool_choice"),
    ("tool_choice", {"type": "function"}, "missing_required_parameter", "tool_choice.name"),
    ("rollout_mode", "turbo", "invalid_value", "rollout_mode"),
    ("stream_id", 5, "invalid_type", "stream_id"),
    ("generate", "no", "invalid_type", "generate"),
    ("max_output_tokens", "10", "invalid_type", "max_output_tokens"),
    ("previous_response_id", 7, "invalid_type", "previous_response_id"),
    ("parallel_tool_calls", None, "invalid_type", "parallel_tool_calls"),
    ("reasoning", {"effort": 5}, "invalid_type", "reasoning.effort"),
]
# (input items, code, param) rejected while the create is admitted or prepared (CODEC-4, VAL-*)
BAD_INPUTS: list[tuple[list[Any], str, str]] = [
    ([{"type": "bogus"}], "invalid_value", "input[{i}].type"),
    ([{"role": "user"}], "missing_required_parameter", "input[{i}].content"),
    ([{"type": "message", "role": "robot", "content": "x"}], "invalid_value", "input[{i}].role"),
    ([{"type": "function_call_output", "output": "x"}], "missing_required_parameter",
     "input[{i}].call_id"),
    ([{"type": "message", "role": "user", "content": [{"type": "bogus_part"}]}],
     "invalid_value", "input[{i}].content[0].type"),
]  # fmt: skip
ADMISSION_CODES = {"invalid_value", "missing_required_parameter", "invalid_type"}
BAD_STREAM_IDS = ["", "bad lane!", "lane/1", "ü-lane", "x" * 257]

# ----------------------------------------------------------------------------- the model


@dataclass
class Cached:
    """A lane's cached latest response (CACHE-1) or a stored record: its unanswered calls."""

    rid: str
    pending: list[str]
    body: dict[str, Any] | None = None  # the create that produced it (a lane's latest)
    status: str = ""  # its terminal status (a lane's latest)


@dataclass
class Outcome:
    """What a create must do once its lane runs it."""

    error: tuple[str, str | None] | None = None
    evict: bool = False
    warm: bool = False
    append: bool = False
    calls: list[str] | None = None  # tool names of the first step; None: a text answer
    text_prefix: str | None = None
    budget: bool = False  # max_output_tokens set: may end incomplete
    forced_tool: str | None = None  # append: each resume calls this tool again


@dataclass
class Create:
    lane: str | None
    body: dict[str, Any]
    fault: tuple[str, str] | None = None  # expected admission/preparation error (code, param)
    fault_stage: str = ""  # "admit" | "prepare"
    rid: str | None = None
    outcome: Outcome | None = None


ErrorShape = tuple[str, str | None, str | None]  # (code, param, stream_id) of an error event


@dataclass
class Immediate:
    """An answer that comes straight from the frame handler (not through a lane queue)."""

    kind: str  # "error" | "response.inject.created" | "response.inject.failed" | steer
    codes: set[str] = field(default_factory=set)
    param: str | bool | None = False  # False: not checked
    stream_id: str | None = None
    response_id: str | None = None
    status: int | None = None
    not_echoed: str | None = None
    # An error that may take one of several exact shapes (``codes``, ``param`` and
    # ``stream_id`` are then unused). Only an error of one of these shapes is this answer.
    shapes: frozenset[ErrorShape] | None = None

    def is_answered_by(self, code: str, param: str | None, stream_id: str | None) -> bool:
        """Whether an ``error`` event is this answer. Without ``shapes``, ``param`` is asserted
        after the match (a wrong param is then reported as such)."""
        if self.kind != "error":
            return False
        if self.shapes is not None:
            return (code, param, stream_id) in self.shapes
        return code in self.codes and self.stream_id == stream_id


@dataclass
class AppendLive:
    rid: str
    lane: str | None
    tools: list[str]
    forced_tool: str | None
    store: bool
    pending: list[str]
    names: dict[str, str] = field(default_factory=dict)
    answered: set[str] = field(default_factory=set)


@dataclass
class LaneModel:
    latest: Cached | None = None
    queue: deque[Create] = field(default_factory=deque)
    busy: str | None = None  # a suspended append-mode response occupying the lane
    history: list[str] = field(default_factory=list)

    def waiting(self) -> int:
        return sum(1 for c in self.queue if c.rid is None)


def last_kind(items: list[dict[str, Any]]) -> str:
    """What the simulator looks at (SIM-3): "user", "output" or "other" (assistant, reasoning)."""
    last = items[-1]
    kind = last.get("type", "message")
    if kind == "function_call_output":
        return "output"
    if kind == "message" and last.get("role") in ("user", "developer", "system"):
        return "user"
    return "other"


def _resolve_references(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """ITEM-4 within one request: an item_reference stands for the item with that id."""
    by_id = {i["id"]: i for i in items if i.get("id") and i.get("type") != "item_reference"}
    return [by_id.get(i["id"], i) if i.get("type") == "item_reference" else i for i in items]


def expected_calls(
    text: str, tools: list[str], choice: Any, parallel: bool, last: str
) -> list[str] | None:
    """The simulator's policy (SIM-3) for the first sampling step; ``last`` is the kind of
    the context's last item (see ``last_kind``)."""
    usable = [] if choice == "none" else list(tools)
    forced = choice == "required" or isinstance(choice, dict)
    if isinstance(choice, dict):
        usable = [t for t in usable if t == choice["name"]] or usable
    if not usable:
        return None
    if last == "output":
        return usable[:1] if forced else None
    if last != "user":
        return None
    named = [t for t in usable if t.lower() in text.lower()] or usable[:1]
    return named if parallel else named[:1]


def forced_tool(tools: list[str], choice: Any) -> str | None:
    """In append mode a forced tool_choice calls the tool again after every resume."""
    if choice == "required" and tools:
        return tools[0]
    if isinstance(choice, dict) and tools:
        return choice["name"] if choice["name"] in tools else tools[0]
    return None


def message(text: str, form: str) -> Any:
    if form == "easy":
        return {"role": "user", "content": text}
    if form == "typed":
        return {"type": "message", "role": "user", "content": text}
    return {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}


def tool_output(call_id: str, text: str, as_parts: bool = False) -> dict[str, Any]:
    output: Any = [{"type": "input_text", "text": text}] if as_parts else text
    return {"type": "function_call_output", "call_id": call_id, "output": output}


def _unanswered(context: list[Any]) -> list[str]:
    """Function calls in a stored context that have no output."""
    answered = {i.call_id for i in context if type(i).__name__ == "FunctionCallOutput"}
    return [
        i.call_id
        for i in context
        if type(i).__name__ == "FunctionCall" and i.call_id not in answered
    ]


def pick(data: st.DataObject, options: list[T]) -> T:
    """One of ``options``, drawn the same way whatever their number (so a replay that finds a
    different number, e.g. after a race, does not make hypothesis' data generation flaky)."""
    return options[data.draw(st.integers(0, 1 << 16), label="pick") % len(options)]


def _outputs(data: st.DataObject, call_ids: list[str], shuffle: bool = False) -> list[Any]:
    """Tool outputs for ``call_ids`` (at most 3), from draws of a fixed shape."""
    texts = data.draw(st.lists(output_texts, min_size=3, max_size=3), label="outputs")
    parts = data.draw(st.lists(st.booleans(), min_size=3, max_size=3), label="as parts")
    order = data.draw(st.permutations(range(3))) if shuffle else range(3)
    return [tool_output(call_ids[i], texts[i], parts[i]) for i in order if i < len(call_ids)]


def _text_of(item: dict[str, Any]) -> str:
    content = item.get("content", "")
    if isinstance(content, str):
        return content
    return "\n".join(part.get("text", "") for part in content)


def _not_json(text: str) -> bool:
    try:
        msgspec.json.decode(text.encode())
    except msgspec.DecodeError:
        return True
    return False


def _recorded() -> list[bytes]:
    from tests.support.oracle import RECORDED

    return RECORDED
