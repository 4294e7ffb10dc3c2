"""The Conversations API's rule group: a hypothesis state machine over a real server (SPEC §19).

``ConversationMachine`` interleaves the conversation routes (create with items and metadata,
retrieve, update, delete; items add, list with every ``order`` / ``limit`` / ``after``, retrieve,
delete) with ``responses.create`` on a conversation (JSON or SSE, ``store`` true or false, an id
or ``{"id": …}``, with a ``previous_response_id`` that makes it a 400), on live, deleted and
unknown ids. The model is the list of item texts per conversation: after every step each
listing, page and item must be exactly what the model says (CONV-1..CONV-6, CONV-9), every
error is the §12 envelope with its code, and nothing is left locked or running.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)
from openai.types.conversations import Conversation, ConversationItemList

from engine.core import EngineConfig
from engine.store.embedded.sqlite import SqliteStore
from tests.fuzz._support import LiveEnv, check_error_body, examples, report, timeout_for

UNKNOWN = "conv_" + "0" * 32
texts = st.text(alphabet="abcdefgh ", min_size=1, max_size=12)


class ConversationMachine(RuleBasedStateMachine):
    env: LiveEnv
    runs = 0
    tally: Counter[str]

    def __init__(self) -> None:
        super().__init__()
        type(self).runs += 1
        self.convs: dict[str, list[tuple[str, str]]] = {}  # id -> [(item id, text)]
        self.metadata: dict[str, dict[str, str]] = {}
        self.gone: list[str] = []

    # ------------------------------------------------------------------ I/O
    def _request(self, method: str, path: str, body: Any = None) -> tuple[int, Any, str]:
        async def go() -> tuple[int, Any, str]:
            url = f"http://127.0.0.1:{self.env.live.port}{path}"
            data = json.dumps(body) if body is not None else None
            headers = {"Content-Type": "application/json"} if data is not None else {}
            async with self.env.client.request(method, url, data=data, headers=headers) as resp:
                text = await resp.text()
                parsed = json.loads(text) if resp.content_type == "application/json" else None
                return resp.status, parsed, text

        return self.env.run(go(), timeout=60)

    def _error(self, answer: tuple[int, Any, str], status: int, code: str) -> None:
        assert answer[0] == status, answer[2][:300]
        assert set(answer[1]) == {"error"}, answer[1]
        assert check_error_body(answer[1]["error"], status)["code"] == code, answer[1]
        self.tally[f"error {code}"] += 1

    def _pick(self, data: st.DataObject) -> str:
        """Mostly a live conversation; else a deleted or never-made one."""
        live = list(self.convs)
        if live and data.draw(st.integers(0, 3), label="live") > 0:
            return data.draw(st.sampled_from(live), label="conv")
        return data.draw(st.sampled_from([*self.gone, UNKNOWN]), label="conv")

    def _absent(self, conv: str) -> bool:
        return conv not in self.convs

    # ------------------------------------------------------------------ conversations
    @initialize(first=st.lists(texts, max_size=3), second=st.lists(texts, max_size=3))
    def start(self, first: list[str], second: list[str]) -> None:
        """Two conversations to work on whichever rules a run enables."""
        self.create(first, {})
        self.create(second, {"k": "v"})

    @rule(items=st.lists(texts, max_size=3), meta=st.dictionaries(texts, texts, max_size=2))
    def create(self, items: list[str], meta: dict[str, str]) -> None:
        """CONV-1: a new conversation with its items and metadata."""
        self.tally["rule create"] += 1
        body = {"items": [{"role": "user", "content": t} for t in items], "metadata": meta}
        status, answer, text = self._request("POST", "/v1/conversations", body)
        assert status == 200, text
        Conversation.model_validate(answer)
        assert answer["metadata"] == meta
        conv = answer["id"]
        self.convs[conv] = [(item["id"], t) for item, t in zip(self._all(conv), items, strict=True)]
        self.metadata[conv] = meta

    @rule(data=st.data(), meta=st.dictionaries(texts, texts, max_size=2))
    def update(self, data: st.DataObject, meta: dict[str, str]) -> None:
        self.tally["rule update"] += 1
        conv = self._pick(data)
        answer = self._request("POST", f"/v1/conversations/{conv}", {"metadata": meta})
        if self._absent(conv):
            self._error(answer, 404, "conversation_not_found")
            return
        assert answer[0] == 200 and answer[1]["metadata"] == meta, answer[2]
        self.metadata[conv] = meta

    @rule(data=st.data())
    def delete(self, data: st.DataObject) -> None:
        """CONV-4: gone for every route."""
        self.tally["rule delete"] += 1
        conv = self._pick(data)
        answer = self._request("DELETE", f"/v1/conversations/{conv}")
        if self._absent(conv):
            self._error(answer, 404, "conversation_not_found")
            return
        assert answer[1] == {"id": conv, "object": "conversation.deleted", "deleted": True}
        del self.convs[conv]
        self.gone.append(conv)

    # ------------------------------------------------------------------ items
    @rule(data=st.data(), items=st.lists(texts, min_size=1, max_size=3), flood=st.booleans())
    def add_items(self, data: st.DataObject, items: list[str], flood: bool) -> None:
        """CONV-3, CONV-9: one to twenty at a time."""
        self.tally["rule add_items"] += 1
        conv = self._pick(data)
        sent = items * 21 if flood else items
        body = {"items": [{"role": "user", "content": t} for t in sent]}
        answer = self._request("POST", f"/v1/conversations/{conv}/items", body)
        if flood:
            self._error(answer, 400, "too_many_items")
        elif self._absent(conv):
            self._error(answer, 404, "conversation_not_found")
        else:
            assert answer[0] == 200, answer[2]
            ConversationItemList.model_validate(answer[1])
            added = answer[1]["data"]
            assert [_text(item) for item in added] == items
            self.convs[conv] += [(item["id"], t) for item, t in zip(added, items, strict=True)]

    @rule(
        data=st.data(),
        order=st.sampled_from([None, "asc", "desc", "asc", "desc", "up"]),
        limit=st.sampled_from([None, "1", "100", "n", "n", "n-1", "n+1", "0", "101", "x"]),
        after=st.sampled_from([None, None, None, "first", "last", "unknown"]),
    )
    def list_items(
        self, data: st.DataObject, order: str | None, limit: str | None, after: str | None
    ) -> None:
        """CONV-3: a page is the model's items in that order, after that id, that many."""
        self.tally["rule list"] += 1
        conv = self._pick(data)
        query: dict[str, str] = {}
        if order is not None:
            query["order"] = order
        model = list(self.convs.get(conv, []))
        if limit is not None and limit.startswith("n"):  # around the page's edge
            limit = str(min(100, max(1, len(model) + {"n": 0, "n-1": -1, "n+1": 1}[limit])))
        if limit is not None:
            query["limit"] = limit
        if order != "asc":
            model.reverse()
        ids = [ident for ident, _ in model]
        if after == "first" and ids:
            query["after"] = ids[0]
        elif after == "last" and ids:
            query["after"] = ids[-1]
        elif after is not None:
            query["after"] = "item_x"
        answer = self._request("GET", f"/v1/conversations/{conv}/items?{urlencode(query)}")
        if order == "up":
            self._error(answer, 400, "invalid_value")
            return
        if limit in ("0", "101", "x"):
            self._error(answer, 400, "invalid_value")
            return
        if self._absent(conv):
            self._error(answer, 404, "conversation_not_found")
            return
        assert answer[0] == 200, answer[2]
        ConversationItemList.model_validate(answer[1])
        if "after" in query:
            ids = [ident for ident, _ in model]
            model = model[ids.index(query["after"]) + 1 :] if query["after"] in ids else []
        size = int(limit or 20)
        page = answer[1]
        assert [(item["id"], _text(item)) for item in page["data"]] == model[:size]
        assert page["has_more"] == (len(model) > size)
        self.tally["list at a page's edge" if len(model) == size else "list checked"] += 1

    @rule(data=st.data(), which=st.sampled_from(["first", "last", "unknown"]))
    def item_get_or_delete(self, data: st.DataObject, which: str) -> None:
        """CONV-3: one item by id; its delete answers the conversation."""
        self.tally["rule item"] += 1
        conv = self._pick(data)
        model = self.convs.get(conv, [])
        item = {"first": model[:1], "last": model[-1:]}.get(which) or [("item_x", "")]
        ident = item[0][0]
        delete = data.draw(st.booleans(), label="delete")
        path = f"/v1/conversations/{conv}/items/{ident}"
        answer = self._request("DELETE" if delete else "GET", path)
        if self._absent(conv):
            self._error(answer, 404, "conversation_not_found")
        elif ident == "item_x":
            self._error(answer, 404, "item_not_found")
        elif delete:
            assert answer[0] == 200 and answer[1]["object"] == "conversation", answer[2]
            self.convs[conv] = [entry for entry in model if entry[0] != ident]
        else:
            assert answer[0] == 200 and answer[1]["id"] == ident, answer[2]

    # ------------------------------------------------------------------ responses
    @rule(
        data=st.data(),
        text=texts,
        streaming=st.booleans(),
        store=st.booleans(),
        as_object=st.booleans(),
        with_previous=st.integers(0, 6),
    )
    def respond(
        self,
        data: st.DataObject,
        text: str,
        streaming: bool,
        store: bool,
        as_object: bool,
        with_previous: int,
    ) -> None:
        """CONV-5: the input and the output are appended when the response ends."""
        self.tally["rule respond"] += 1
        conv = self._pick(data)
        body: dict[str, Any] = {"model": "sim", "input": text, "store": store}
        body["conversation"] = {"id": conv} if as_object else conv
        if streaming:
            body["stream"] = True
        if with_previous == 0:
            body["previous_response_id"] = "resp_" + "1" * 32
        answer = self._request("POST", "/v1/responses", body)
        if with_previous == 0:
            self._error(answer, 400, "invalid_value")
            return
        if self._absent(conv):
            self._error(answer, 404, "conversation_not_found")
            return
        assert answer[0] == 200, answer[2][:300]
        final = _final(answer[2]) if streaming else answer[1]
        assert final["conversation"] == {"id": conv}
        assert final["status"] == "completed"
        listed = [(item["id"], _text(item)) for item in self._all(conv)]
        before = self.convs[conv]
        assert listed[: len(before)] == before
        new = listed[len(before) :]
        assert [t for _, t in new] == [text, *(_text(item) for item in final["output"])]
        assert [i for i, _ in new[1:]] == [item["id"] for item in final["output"]]
        self.convs[conv] = listed
        self.tally[f"respond store={store} stream={streaming}"] += 1

    def _all(self, conv: str) -> list[dict[str, Any]]:
        """Every item, oldest first, page by page (CONV-3)."""
        items: list[dict[str, Any]] = []
        query = {"order": "asc", "limit": "100"}
        while True:
            path = f"/v1/conversations/{conv}/items?{urlencode(query)}"
            status, answer, text = self._request("GET", path)
            assert status == 200, text
            items += answer["data"]
            if not answer["has_more"]:
                return items
            query["after"] = answer["last_id"]

    @invariant()
    def listings_match_the_model(self) -> None:
        for conv, model in self.convs.items():
            assert [(item["id"], _text(item)) for item in self._all(conv)] == model

    def teardown(self) -> None:
        for conv in self.convs:  # nothing left locked: a write goes through at once
            status, _, text = self._request("POST", f"/v1/conversations/{conv}", {"metadata": {}})
            assert status == 200, text


def _text(item: dict[str, Any]) -> str:
    content = item.get("content", "")
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content)


def _final(text: str) -> dict[str, Any]:
    for block in text.strip().split("\n\n"):
        event = json.loads(block.split("\n")[1][len("data: ") :])
        if event["type"] == "response.completed":
            final: dict[str, Any] = event["response"]
            return final
    raise AssertionError("no response.completed")


@pytest.fixture
def conv_env(tmp_path: Path) -> Any:
    env = LiveEnv(EngineConfig(tokens_per_second=0), store=SqliteStore(tmp_path / "fuzz.db"))
    try:
        yield env
    finally:
        env.close()


@pytest.mark.timeout(timeout_for(120))
def test_conversation_state_machine(conv_env: LiveEnv) -> None:
    machine = type("ConvMachine", (ConversationMachine,), {"env": conv_env, "tally": Counter()})
    run_state_machine_as_test(
        machine,
        settings=settings(max_examples=examples(ci=0.3, deep=0.05), stateful_step_count=20),
    )
    report("ConversationMachine", machine.runs, machine.tally)
