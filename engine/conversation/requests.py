"""Request checks before any pre-inference (SPEC: LEN-3, VAL-*, HTTP-5, BG-1, APPEND-1): what
this server does not do is refused clearly, and the input is parsed and sized once. Used by
every request that carries an input: a create on either transport, ``/compact`` and
``/input_tokens``. The item-level checks are ``validation.py``'s, inside the pipeline.
"""

from __future__ import annotations

import math
from typing import Any

from engine.conversation.pipeline import ItemTexts
from engine.conversation.resend import Held
from protocol.codec import parse_input
from protocol.errors import InvalidRequest
from protocol.items import InputItem, item_texts
from protocol.response import CreateParams


def check_supported(
    params: CreateParams, transport: str, max_items: int, max_chars: int, held: Held | None = None
) -> tuple[list[InputItem], ItemTexts]:
    """Reject what this server does not do, clearly (LEN-3), and parse the input. Returns the
    items and their readable texts (computed once: the size limit here, the safety scan later).
    ``held``: the input's first raw items are, byte for byte, an accepted create's (COMPAT-7):
    their items, texts and sizes are that create's, and only the rest are decoded."""
    if params.background and transport == "ws":
        raise InvalidRequest(
            "unsupported_parameter", "background is not supported over WebSocket.", "background"
        )
    if params.background and not params.store:
        raise InvalidRequest("invalid_value", "Background responses require store=true.", "store")
    conversation_id(params)  # its shape, and never with previous_response_id (CONV-5)
    if params.previous_response_id is not None and not params.previous_response_id:
        raise InvalidRequest(
            "invalid_value", "previous_response_id must be non-empty.", "previous_response_id"
        )
    if transport != "ws" and params.rollout_mode == "append":
        raise InvalidRequest(
            "unsupported_parameter",
            "The append rollout mode is only available over WebSocket.",
            "rollout_mode",
        )
    check_metadata(params.metadata)
    check_sampling(params)
    known, chars = (held.length, held.sent.chars[held.length]) if held is not None else (0, 0)
    items = parse_input(params.input[known:] if known else params.input, start=known)
    texts = [item_texts(item) for item in items]
    if held is not None:
        items, texts = held.sent.items[:known] + items, held.sent.texts[:known] + texts
    if len(items) > max_items:
        raise InvalidRequest(
            "too_many_items", f"At most {max_items} input items are accepted per request.", "input"
        )
    if chars + sum(len(text) for readable in texts[known:] for text in readable) > max_chars:
        raise InvalidRequest(
            "input_too_large",
            f"The input text of one request may hold at most {max_chars:,} characters.",
            "input",
        )
    return items, texts


MAX_METADATA_KEYS, MAX_METADATA_KEY, MAX_METADATA_VALUE = 16, 64, 512


# The ranges OpenAI's API reference documents for the sampling parameters (VAL-10, VAL-11):
# (name, lowest, highest, integer). ``max_output_tokens`` has no documented maximum; its floor
# here is 1, not api.openai.com's 16 (VAL-12).
SAMPLING_RANGES: tuple[tuple[str, float, float, bool], ...] = (
    ("temperature", 0.0, 2.0, False),
    ("top_p", 0.0, 1.0, False),
    ("top_logprobs", 0, 20, True),
    ("max_output_tokens", 1, math.inf, True),
)


def check_sampling(params: CreateParams) -> None:
    """VAL-10: a sampling parameter outside its documented range is a 400 naming it, with
    api.openai.com's codes and message shape; ``1e308`` and ``-1`` never reach a model."""
    for name, lowest, highest, integer in SAMPLING_RANGES:
        value = getattr(params, name)
        if value is None or lowest <= value <= highest:  # NaN fails both comparisons
            continue
        kind = "integer" if integer else "decimal"
        if value > highest:
            code, rule, bound = f"{kind}_above_max_value", "above maximum", f"<= {highest:g}"
        else:
            code, rule, bound = f"{kind}_below_min_value", "below minimum", f">= {lowest:g}"
        raise InvalidRequest(
            code,
            f"Invalid '{name}': {kind} {rule} value. Expected a value {bound}, "
            f"but got {_shown(value)} instead.",
            name,
        )


def _shown(value: float) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e16:
        return str(int(value))
    return repr(value)


def conversation_id(params: CreateParams) -> str | None:
    """The conversation a create names: an id or ``{"id": …}`` (CONV-5). Not together with
    ``previous_response_id``, nor in append mode (CONV-5)."""
    raw = params.conversation
    if raw is None:
        return None
    ident = raw.get("id") if isinstance(raw, dict) else raw
    if not isinstance(ident, str) or not ident:
        raise InvalidRequest(
            "invalid_type", 'conversation must be a conversation id or {"id": …}.', "conversation"
        )
    if params.previous_response_id is not None:
        raise InvalidRequest(
            "invalid_value",
            "conversation and previous_response_id cannot be used together.",
            "conversation",
        )
    if params.rollout_mode == "append":
        raise InvalidRequest(
            "unsupported_parameter",
            "A conversation cannot be used in the append rollout mode.",
            "conversation",
        )
    return ident


def check_metadata(metadata: dict[str, Any] | None) -> None:
    """OpenAI's metadata rules: at most 16 string pairs, keys <= 64 and values <= 512 chars."""
    if not metadata:
        return
    if len(metadata) > MAX_METADATA_KEYS:
        raise InvalidRequest(
            "invalid_value", f"metadata holds at most {MAX_METADATA_KEYS} pairs.", "metadata"
        )
    for key, value in metadata.items():
        where = f"metadata.{key[:MAX_METADATA_KEY]}"
        if not isinstance(value, str):
            raise InvalidRequest("invalid_type", "Metadata values must be strings.", where)
        if len(key) > MAX_METADATA_KEY or len(value) > MAX_METADATA_VALUE:
            raise InvalidRequest(
                "invalid_value",
                f"Metadata keys hold at most {MAX_METADATA_KEY} characters and values "
                f"{MAX_METADATA_VALUE}.",
                where,
            )
