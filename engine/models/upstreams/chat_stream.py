"""Chat-completions stream chunks -> backend deltas (pure; SPEC: UP-CHAT-5..UP-CHAT-8).

Tool-call chunks are keyed by ``index``. Servers (OpenAI, vLLM, llama.cpp, SGLang) send one
call's chunks before the next call's, so a chunk for a new index (or for the same index with a
different ``id``) closes the open call. A continuation chunk for a call that was already closed
would mean interleaved calls, which the delta interface cannot express after the fact: that is
reported as an upstream error rather than silently corrupting arguments.

Whitespace-only text is held back until real text follows: local models often emit ``"\\n\\n"``
before a tool call, which would otherwise become an empty-looking message item.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field

import msgspec

from engine.conversation.tokens import count
from engine.models.base import (
    ArgsDelta,
    CallEnd,
    CallStart,
    Delta,
    Finish,
    FinishReason,
    TextDelta,
)
from engine.models.upstreams.endpoint import UpstreamError


class FunctionDelta(msgspec.Struct):
    name: str | None = None
    arguments: str | None = None


class ToolCallDelta(msgspec.Struct):
    index: int = 0
    id: str | None = None
    function: FunctionDelta | None = None


class ChunkDelta(msgspec.Struct):
    content: str | None = None
    tool_calls: list[ToolCallDelta] | None = None
    reasoning_content: str | None = None


class Choice(msgspec.Struct):
    index: int = 0
    delta: ChunkDelta = msgspec.field(default_factory=ChunkDelta)
    finish_reason: str | None = None


class PromptDetails(msgspec.Struct):
    cached_tokens: int | None = None


class ChatUsage(msgspec.Struct):
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    prompt_tokens_details: PromptDetails | None = None


class Chunk(msgspec.Struct):
    choices: list[Choice] = msgspec.field(default_factory=list)
    usage: ChatUsage | None = None
    error: object | None = None


@dataclass
class _Call:
    index: int
    id: str | None
    name: str = ""
    pending_args: list[str] = field(default_factory=list)
    started: bool = False


class ChunkMapper:
    """Feeds decoded chunks, returns deltas; ``finish()`` returns the closing ones."""

    def __init__(self) -> None:
        self.current: _Call | None = None
        self.closed: set[int] = set()
        self.calls = 0
        self.held = ""  # whitespace-only text not yet emitted
        self.emitted: list[str] = []  # everything produced, for the tokenizer fallback
        self.finish_reason: str | None = None
        self.usage: ChatUsage | None = None
        self.reasoning_chunks = 0

    def feed(self, chunk: Chunk) -> list[Delta]:
        if chunk.usage is not None:
            self.usage = chunk.usage
        out: list[Delta] = []
        for choice in chunk.choices:
            if choice.index != 0:
                continue  # we never ask for n > 1
            delta = choice.delta
            if delta.reasoning_content:
                self.reasoning_chunks += 1  # no reasoning items are produced (SPEC UP-CHAT-7)
            if delta.content:
                out.extend(self._text(delta.content))
            for call in delta.tool_calls or ():
                out.extend(self._call(call))
            if choice.finish_reason is not None:
                self.finish_reason = choice.finish_reason
        return out

    def _text(self, text: str) -> list[Delta]:
        text = self.held + text
        if not text.strip():
            self.held = text  # may be noise between calls: does not close the open call
            return []
        self.held = ""
        out = self._close_call()
        self.emitted.append(text)
        out.append(TextDelta(text))
        return out

    def _call(self, chunk: ToolCallDelta) -> list[Delta]:
        out: list[Delta] = []
        cur = self.current
        new_id = chunk.id is not None and cur is not None and cur.id not in (None, chunk.id)
        if cur is not None and (chunk.index != cur.index or new_id):
            out.extend(self._close_call())
            cur = None
        if cur is None:
            if chunk.index in self.closed and chunk.id is None:
                raise UpstreamError("The model server interleaved tool-call chunks.")
            cur = self.current = _Call(chunk.index, chunk.id)
            self.held = ""  # whitespace before a call is noise, not a message
        fn = chunk.function or FunctionDelta()
        if not cur.started and fn.name:
            cur.name = fn.name
        if fn.arguments:
            cur.pending_args.append(fn.arguments)
            self.emitted.append(fn.arguments)
        if not cur.started and cur.name:
            cur.started = True
            self.calls += 1
            out.append(CallStart(cur.id or _call_id(), cur.name))
        if cur.started and cur.pending_args:
            out.append(ArgsDelta("".join(cur.pending_args)))
            cur.pending_args.clear()
        return out

    def _close_call(self) -> list[Delta]:
        cur, self.current = self.current, None
        if cur is None:
            return []
        self.closed.add(cur.index)
        if not cur.started:
            raise UpstreamError("The model server sent a tool call without a name.")
        return [CallEnd()]

    def finish(self) -> list[Delta]:
        out = self._close_call()
        if self.held and not self.calls:
            self.emitted.append(self.held)
            out.append(TextDelta(self.held))
        out.append(self._finish())
        return out

    def _finish(self) -> Finish:
        reason: FinishReason = (
            "length" if self.finish_reason == "length" else "tool_calls" if self.calls else "stop"
        )
        usage = self.usage
        if usage is None or usage.completion_tokens is None:
            # No usage from the upstream: count what it produced with our tokenizer, and say so.
            return Finish(reason, count("".join(self.emitted)), usage_estimated=True)
        details = usage.prompt_tokens_details
        return Finish(
            reason,
            usage.completion_tokens,
            input_tokens=usage.prompt_tokens,
            cached_tokens=details.cached_tokens if details is not None else None,
        )


def _call_id() -> str:
    """Some servers omit ids; the rollout needs one to pair the call with its output."""
    return "call_" + secrets.token_hex(12)
