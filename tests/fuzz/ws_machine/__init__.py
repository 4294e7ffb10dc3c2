"""A hypothesis state machine driving a real server over WebSocket on loopback.

``WsProtocolMachine`` interleaves, on one connection at a time (with reconnects): stateless
creates (text, tool calls, several lanes), continuations of the current, a stale, another lane's,
an evicted, a stored or an unknown ``previous_response_id`` with right and wrong tool outputs,
warmups, append-mode rollouts with right / partial / wrong / duplicate / late appends and
injects, bursts of creates queued on lanes (also behind a suspended append rollout, up to the
queue limit), malformed frames (invalid JSON and UTF-8, binary, non-objects, missing or unknown
``type``, wrong field types, ~1 MB strings, deep nesting), steering, disconnects in the middle
of a stream and reconnects.

It keeps a model of what the server must do: each lane's cached latest response (CACHE-1..3:
only the lane's latest is served from the cache; a failed continuation evicts it), the store
(STORE-1/2: ``store: true`` responses stay continuable after eviction and reconnects), the live
append-mode rollouts and their pending calls (APPEND-*), the lane queues (WS-5/WS-6). Every frame
goes through ``StreamChecker`` (ORD-*, ERR-*, WS-7), every request's outcome is predicted and
compared, and after each connection the server's task count must return to its baseline (WS-12).

The machine is split by rule group: ``model.py`` (what it knows), ``base.py`` (connection,
I/O, prediction, create helpers), ``events.py`` (the frames), one module per rule group, and
``machine.py``, which composes them and holds the teardown.
"""
