"""Steering an upstream generation (STEER-3, STEER-4): the upstream request streaming the cut
response is closed, and the successor samples again with the steering input in its messages."""

from __future__ import annotations

from typing import Any

import aiohttp

from tests.support.server import LiveServer
from tests.support.ws import read_until
from tests.upstream.peer import ChatPeer, Reply

Event = dict[str, Any]


async def test_steering_stops_the_upstream_and_restarts_with_the_new_input(
    chat_server: LiveServer, chat_peer: ChatPeer
) -> None:
    # A slow stream: many chunks, a pause between each (the steer lands after the first one).
    chat_peer.queue(Reply(text="word " * 40, delay=0.2), Reply(text="Briefly: done."))
    async with aiohttp.ClientSession() as http, http.ws_connect(chat_server.ws_url) as ws:
        await ws.send_json({"type": "response.create", "model": "model-a", "input": "Tell all"})
        created = (await read_until(ws, "response.created"))[-1]
        await read_until(ws, "response.output_text.delta")
        rid = created["response"]["id"]
        await ws.send_json(
            {"type": "response.steer", "previous_response_id": rid, "input": "Stop."}
        )
        await read_until(ws, "response.steer.accepted")
        cut = (await read_until(ws, "response.incomplete"))[-1]
        assert cut["response"]["incomplete_details"] == {"reason": "steered"}
        successor = (await read_until(ws, "response.completed"))[-1]
    await chat_peer.gone.wait()  # the first upstream request was closed by the engine
    assert chat_peer.disconnects == 1
    assert successor["response"]["previous_response_id"] == rid
    assert successor["response"]["output"][0]["content"][0]["text"] == "Briefly: done."
    messages = chat_peer.last["messages"]
    assert messages[0] == {"role": "user", "content": "Tell all"}
    assert messages[-1] == {"role": "user", "content": "Stop."}
