"""Rules: malformed frames (CODEC-*, ERR-4) and steering a response that is not there."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import (
    rule,
)

from protocol.events import CLIENT_EVENT_TYPES
from tests.fuzz.ws_machine.connections import ConnectionRules
from tests.fuzz.ws_machine.model import (
    BAD_STREAM_IDS,
    WRONG_FIELDS,
    Immediate,
    _not_json,
    json_values,
    pick,
    safe_text,
    user_texts,
)


class BadFrameRules(ConnectionRules):  # an invalid UTF-8 frame closes the connection
    """Rules: malformed frames (CODEC-*, ERR-4) and steering a response that is not there."""

    # ================================================================== rules: bad frames
    @rule(
        data=st.data(),
        kind=st.sampled_from(
            ["invalid_json", "invalid_utf8", "binary", "not_object", "missing_type",
             "unknown_type", "wrong_field", "bad_stream_id", "steer", "huge_type",
             "huge_json", "huge_stream_id", "huge_field", "deep_nesting", "deep_field"]
        ),
    )  # fmt: skip
    def malformed_frame(self, data: st.DataObject, kind: str) -> None:
        """CODEC-2/3, WS-3, WS-4, EV-1: request-scoped errors; the socket stays usable (but
        for invalid UTF-8, which fails it with 1007, WS-17)."""
        self.tally["rule malformed_frame"] += 1
        assert self.conn is not None
        conn = self.conn
        expect = Immediate("error", status=400)
        text: str | None = None
        if kind == "invalid_json":
            text = data.draw(
                st.one_of(
                    st.text(min_size=1, max_size=40),
                    st.sampled_from(["0:", "[1,", '{"a":1}x', '{"type":"nope"', "1 2"]),
                ).filter(_not_json)
            )
            expect.codes, expect.param = {"invalid_json"}, None
        elif kind == "invalid_utf8":
            self._fail_with_1007()
            return
        elif kind == "binary":
            blob = data.draw(st.binary(max_size=64))
            self.immediate.append(
                Immediate("error", {"binary_frame_not_supported"}, None, status=400)
            )
            self.env.run(conn.send_binary(blob))
            self._settle()
            return
        elif kind == "not_object":
            value = data.draw(
                st.one_of(st.integers(), st.lists(json_values), st.text(max_size=9), st.none())
            )
            text = json.dumps(value)
            expect.codes, expect.param = {"invalid_event"}, None
        elif kind == "missing_type":
            obj = data.draw(st.dictionaries(st.text(max_size=6), json_values, max_size=4))
            obj.pop("type", None)
            if data.draw(st.booleans()):
                obj["type"] = None
            text = json.dumps(obj)
            expect.codes, expect.param = {"missing_required_parameter"}, "type"
        elif kind == "unknown_type":
            value = data.draw(
                st.one_of(safe_text, st.integers(), st.lists(st.integers(), max_size=2)).filter(
                    lambda v: v not in CLIENT_EVENT_TYPES and v != ""
                )
            )
            text = json.dumps({"type": value, "input": "x"})
            expect.codes, expect.param = {"unknown_event_type"}, "type"
            if not isinstance(value, str) or len(value) > 64:
                expect.not_echoed = json.dumps(value)[:40] if not isinstance(value, str) else value
        elif kind == "wrong_field":
            name, value, code, param = data.draw(st.sampled_from(WRONG_FIELDS))
            text = json.dumps({"type": "response.create", "input": "x", name: value})
            expect.codes, expect.param = {code}, param
        elif kind in ("bad_stream_id", "huge_stream_id"):
            value = (
                data.draw(st.sampled_from(BAD_STREAM_IDS))
                if kind == "bad_stream_id"
                else ("s" * 1_000_000)
            )
            text = json.dumps({"type": "response.create", "input": "x", "stream_id": value})
            expect.codes, expect.param = {"invalid_stream_id"}, "stream_id"
            expect.not_echoed = value if len(value) > 3 else None
        elif kind == "steer":
            self._steer(data)
            return
        elif kind == "huge_type":
            text = json.dumps({"type": "t" * 1_000_000})
            expect.codes, expect.param, expect.not_echoed = {"unknown_event_type"}, "type", "tttt"
        elif kind == "huge_json":
            text = '{"type": "response.create", "input": "' + "j" * 1_000_000
            expect.codes, expect.param = {"invalid_json"}, None
        elif kind == "huge_field":
            text = json.dumps({"type": "response.create", "input": 1, "x": "h" * 1_000_000})
            expect.codes, expect.param = {"invalid_type"}, "input"
        else:  # deep nesting: 10,000 nested arrays, as the frame or inside a field
            depth = 10_000
            nested = "[" * depth + "]" * depth
            if kind == "deep_nesting":
                text = nested
            else:
                text = '{"type":"response.create","input":' + nested + "}"
            expect.codes, expect.param = {"too_deeply_nested"}, None
        self.immediate.append(expect)
        assert text is not None
        self.env.run(conn.send_text(text))
        self._settle()

    def _fail_with_1007(self) -> None:
        """WS-17: a text frame that is not UTF-8 fails the connection with 1007 (RFC 6455
        §8.1), not an error event; what the socket owned is released as on any close (WS-12),
        stored responses stay continuable, and a new connection carries on."""
        assert self.conn is not None
        self._retire_appends()
        self.env.run(self.conn.send_raw_text(b'{"type":"response.create","input":"\xff\xfe"}'))
        assert self.env.run(self.conn.close_code()) == 1007, "WS-17"
        self.conn = None
        self._check_released()
        self._check_store()
        self._connect(self.header_append, self.multi_agent)

    def _steer(self, data: st.DataObject) -> None:
        """``response.steer`` of a response that is not live is answered with
        ``response.steer.failed`` (STEER-7); without its required fields it is a decoding
        error."""
        if data.draw(st.booleans()):
            self.immediate.append(
                Immediate("error", {"missing_required_parameter"}, "previous_response_id")
            )
            self._send({"type": "response.steer", "input": "x"})
        else:
            steer_input: Any = data.draw(user_texts)
            if data.draw(st.booleans()):  # CONF-1: echoed only in a shape the SDK accepts
                steer_input = data.draw(st.lists(json_values, max_size=3))
            self.immediate.append(Immediate("response.steer.failed"))
            # Not a live response: those are steered for real (rules: steering, STEER-1).
            live = {m.latest.rid for m in self.lanes.values() if m.latest} | set(self.appends)
            prev = pick(data, ["resp_x", *(rid for rid in self.known_ids if rid not in live)])
            self._send(
                {"type": "response.steer", "previous_response_id": prev, "input": steer_input}
            )
        self._settle()
