"""MEM-10, MEM-11, COMPAT-7, COMPAT-9: what the hydration cache charges a resend's entry (its
published context, its places in the resend index and the create's remembered raw input,
``Sent``) is what the entry really holds, as tracemalloc sees it.

Each chain is a client's stateless loop, driven through the create path's own steps: the body
decoded as HTTP decodes it (``decode_create_body``: input items raw), the items an earlier
create sent byte for byte taken from its ``Sent`` (``HydrationCache.held``), the rest decoded
(``check_supported``), the input remembered (``resend.sent``), the context the input begins
with found (``HydrationCache.resent``), forked and pre-inference run over the new items only,
the model's output committed, and the response published with its owner, digest and ``Sent``.
Every turn sends the whole history back as the client received it (ids, status, annotations:
the SDK's shapes, so the output items a ``Sent`` decoded are not the context's own objects).

200 chains run while tracemalloc traces; once a turn is published, the chain's previous entry
is discarded, so each chain's last entry is left holding everything it references, shared or
not, and nothing else is. What is still allocated once the temporaries are collected is what
holding those entries costs; the cache's count is what it charged them."""

from __future__ import annotations

import gc
import json
import tracemalloc
from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest

from engine.conversation.context import Context
from engine.conversation.pipeline import FULL, INCREMENTAL, OUTPUT, Pipeline, StageStats
from engine.conversation.requests import check_supported
from engine.conversation.resend import sent
from engine.models.sim.simulator import SimulatedModel
from engine.retained.hydration import HydrationCache
from protocol.codec import decode_create_body
from protocol.items import InputItem
from tests.conformance.samples import AGENT_HEADERS

SUPPORTS = frozenset({"text", "image"})
CHAINS = 200
# MEM-10's 5% below (the budget must bound memory); above, 8%: measured (2026-12-06) 0.975
# (agent, one turn) to 1.061 (chat, six turns). The excess is ``deep_size`` counting the
# ``Literal`` strings msgspec shares (a message's role and status, ~116 bytes of each SDK-shaped
# message) in the context's and the input's items alike. Before the index places were charged
# what they hold (200 bytes for ~500) and ``Sent`` its spare room: 0.831 (agent, one turn).
LOW, HIGH = 0.95, 1.08

Turn = Callable[[int, int], list[dict[str, Any]]]  # (chain, turn) -> the model's output


def _call(n: int, turn: int) -> list[dict[str, Any]]:
    """A coding agent's step: one tool call, as the response carries it."""
    return [{"type": "function_call", "id": f"fc_{n}_{turn}", "call_id": f"call_{n}_{turn}",
             "name": "read_file", "arguments": f'{{"path": "src/mod{n}/file{turn}.py"}}',
             "status": "completed"}]  # fmt: skip


def _answer(n: int, turn: int) -> list[dict[str, Any]]:
    """A chat turn: an assistant message, as the response carries it (one output_text part)."""
    text = f"answer {n} {turn}: " + "lorem ipsum dolor sit amet " * 12
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    return [{"type": "message", "id": f"msg_{n}_{turn}", "role": "assistant",
             "status": "completed", "content": [part]}]  # fmt: skip


def _next(n: int, turn: int, output: list[dict[str, Any]]) -> dict[str, Any]:
    """The client's next item: the tool's answer to a call, else its next message."""
    last = output[-1]
    if last["type"] == "function_call":
        code = f"def f{turn}(x):\n    return x + {n} * {turn}\n" * 6
        return {"type": "function_call_output", "call_id": last["call_id"], "output": code}
    return {"role": "user", "content": f"next {n} {turn}: " + "more words " * 20}


def _chain(
    n: int, turns: int, output_of: Turn, header: tuple[str, list[Any]]
) -> list[tuple[bytes, list[dict[str, Any]]]]:
    """Each create's body and the output it gets, the whole history sent every turn."""
    history: list[dict[str, Any]] = [{"role": "user", "content": f"task {n}: fix test {n}"}]
    instructions, tools = header
    out = []
    for turn in range(turns):
        body = {"model": "sim", "instructions": instructions, "input": history}
        if tools:  # the same every turn: the context keeps its first create's (PIPE-4)
            body["tools"] = tools
        output = output_of(n, turn)
        out.append((json.dumps(body).encode(), output))
        history = [*history, *output, _next(n, turn, output)]
    return out


def _output(items: list[dict[str, Any]]) -> list[InputItem]:
    """The model's output items, as the rollout commits them (typed structs)."""
    body = json.dumps({"model": "sim", "input": items}).encode()
    parsed, _ = check_supported(decode_create_body(body), "http", 10_000, 8_000_000)
    return parsed


class _Client:
    """The create path's steps for one owner's stateless turns, publishing to ``cache``."""

    def __init__(self, cache: HydrationCache, backend: SimulatedModel, owner: str) -> None:
        self.cache, self.backend, self.owner = cache, backend, owner
        self.last: str | None = None

    def create(self, response_id: str, body: bytes, output: list[InputItem]) -> None:
        cache, owner = self.cache, self.owner
        params = decode_create_body(body)
        raws = params.input
        assert isinstance(raws, list)
        held = cache.held(owner, raws)
        items, texts = check_supported(params, "http", 10_000, 8_000_000, held)
        remembered = sent(raws, items, texts, held)
        found = cache.resent(owner, items, self.backend)
        pipeline = Pipeline(StageStats())
        if found is None:
            ctx, path, skip = Context(), FULL, 0
        else:
            ctx, path, skip = found[0].ctx.fork(), INCREMENTAL, found[1]
        pipeline.render_header(ctx, params.instructions, params.toolset)
        pipeline.apply(ctx, items[skip:], path=path, supports=SUPPORTS, texts=texts[skip:])
        pipeline.apply(ctx, output, path=OUTPUT, supports=frozenset({"text"}))
        cache.publish(response_id, ctx, self.backend, owner, stored=False, resendable=True,
                      sent=remembered)  # fmt: skip
        if self.last is not None:  # its entry is left holding all it references
            cache.discard(self.last)
        self.last = response_id


def _run(
    chains: list[list[tuple[bytes, list[dict[str, Any]]]]], first: int, counters: Counter[str]
) -> HydrationCache:
    cache = HydrationCache(1 << 40, counters)
    backend = SimulatedModel(0)
    for n, chain in enumerate(chains):
        client = _Client(cache, backend, f"owner-{first + n}")
        for turn, (body, output) in enumerate(chain):
            client.create(f"resp_{first + n}_{turn}", body, _output(output))
    return cache


# (instructions, tools) each shape's creates send: a coding agent's prompt and tools (MEM-10)
HEADERS: dict[str, tuple[str, list[Any]]] = {
    "agent": ("Be brief.", []),
    "chat": ("Be brief.", []),
    "coding_agent": AGENT_HEADERS["agent_kit"],
}


def _prepared(turns: int, shape: str, first: int) -> list[list[tuple[bytes, list[Any]]]]:
    output_of = _answer if shape == "chat" else _call
    return [_chain(n, turns, output_of, HEADERS[shape]) for n in range(first, first + CHAINS)]


@pytest.mark.parametrize("turns", [1, 2, 6])
@pytest.mark.parametrize("shape", sorted(HEADERS))
def test_a_resends_entry_is_charged_what_it_holds(shape: str, turns: int) -> None:
    """MEM-10, MEM-11, COMPAT-7: the count of 200 entries, each a chain's last with its
    ``Sent`` (the first create's; the second's, half taken from the first's; the sixth's), over
    the bytes tracemalloc sees them hold, is within [0.95, 1.08]. A coding agent's context
    keeps its first create's prompt and tools (the later creates' are dropped): before they
    were charged, 0.361 (one turn) to 0.574 (six)."""
    _run(_prepared(turns, shape, CHAINS), CHAINS, Counter())  # warm: codecs, interned names
    chains = _prepared(turns, shape, 0)  # the wire bytes and outputs exist before
    lasts = [chain[-1][0] for chain in chains]
    counters: Counter[str] = Counter()
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        cache = _run(chains, 0, counters)
        del chains
        gc.collect()
        allocated = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert len(cache) == CHAINS and counters["resend.hit"] == CHAINS * (turns - 1)
    for n, body in enumerate(lasts):  # each entry left holds its create's input (COMPAT-7)
        raws = decode_create_body(body).input
        assert isinstance(raws, list)
        held = cache.held(f"owner-{n}", raws)
        assert held is not None and held.length == len(raws)
    ratio = cache.nbytes / allocated
    assert LOW <= ratio <= HIGH, f"charged {cache.nbytes} for {allocated} held ({ratio:.3f})"
