"""harmony's ``StreamableParser`` (openai-harmony 0.0.8, strict, starting in an assistant
header), read in Python over a table of token bytes (SPEC HARMONY-3).

The Rust parser costs 2-9 us an id from Python: per id it re-encodes ``<|message|>`` to find
its id and re-tokenizes every content delta it decodes, and each parser is built with a copy
of the encoding (~0.1 ms). This one keeps the same three states (expect ``<|start|>``, a
header, a message's content), decodes content with the same UTF-8 rules (a delta as soon as
the bytes so far decode; an invalid sequence is U+FFFD), parses a header with the same string
rules, and fails where harmony fails (``HarmonyParseError``). ``tests/upstream/formats/
test_harmony_parse.py`` holds it to harmony's own parser id by id, on arbitrary ids.

Token bytes: ordinary ids from bpe-openai's o200k_base (harmony's ordinary vocabulary, the
same table HARMONY-7 encodes with), special ids from harmony's encoding, looked up once each.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from openai_harmony import HarmonyEncoding, HarmonyError

_CHANNEL = "<|channel|>"
_CONSTRAIN = "<|constrain|>"
_ROLES = ("user", "assistant", "system", "developer", "tool")
# Rust's char::is_whitespace (Unicode White_Space): ``str.isspace`` also takes \x1c-\x1f.
_WHITE = "\t\n\x0b\x0c\r \x85\xa0\u1680\u2000\u2001\u2002\u2003\u2004\u2005\u2006\u2007\u2008"
_WHITE += "\u2009\u200a\u2028\u2029\u202f\u205f\u3000"
_CHANNEL_END = re.compile(f"[{_WHITE}<]")
_ASCII_PARTS = re.compile(r"[^ \t\n\x0c\r]+")  # Rust's split_ascii_whitespace
_REPLACEMENT = "\ufffd"
ORDINARY = 199_998  # o200k_base's ordinary ids: 0 .. 199,997


class HarmonyParseError(ValueError):
    """What harmony's parser would raise as ``HarmonyError``: the ids are not harmony."""


class TokenBytes:
    """id -> bytes, as harmony's tokenizer decodes it; ``None`` for an id it cannot decode."""

    def __init__(self, encoding: HarmonyEncoding, ordinary: Any) -> None:
        self._encoding = encoding
        self._table: list[bytes] = ordinary._rank_to_bytes  # bpe-openai's own list, shared
        # o200k_base's ordinary ranks end here (bpe-openai keeps specials after them, as b"")
        self._first_special = ORDINARY
        self._special: dict[int, bytes | None] = {}

    def __call__(self, token: int) -> bytes | None:
        if 0 <= token < self._first_special:
            return self._table[token]
        if token in self._special:
            return self._special[token]
        try:
            found: bytes | None = self._encoding.decode_utf8([token]).encode()
        except (HarmonyError, OverflowError):  # OverflowError: an id outside u32
            found = None
        if len(self._special) < 4096:  # harmony has 1,091 special ids; a bound for the rest
            self._special[token] = found
        return found


def _header(text: str, role: str | None) -> tuple[str | None, str | None]:
    """harmony's ``parse_header_from_string`` with recipient and content type: (channel,
    recipient); the content type is parsed only to reject what harmony rejects."""
    channel: str | None = None
    at = text.find(_CHANNEL)
    if at >= 0:
        after = text[at + len(_CHANNEL) :]
        end = _CHANNEL_END.search(after)
        cut = end.start() if end else len(after)
        if not cut:
            raise HarmonyParseError("channel marker present but no channel value found")
        channel = after[:cut]
        text = text[:at] + after[cut:]
    text = text.strip(_WHITE)
    if _CONSTRAIN in text:
        text = text.replace(_CONSTRAIN, " " + _CONSTRAIN).strip(_WHITE)
    parts = _ASCII_PARTS.findall(text)
    if role is None:
        if not parts:
            raise HarmonyParseError("message header did not contain a role")
        if parts[0] in _ROLES:
            role = parts[0]
        elif len(parts) > 1 or parts[0].startswith("to="):
            parts.pop(0)
            role = "tool"
        else:
            raise HarmonyParseError("unknown role")
    if parts and parts[0] == role:
        parts.pop(0)
    recipient: str | None = None
    if parts:
        count = len(parts)
        last = parts.pop()
        if last.startswith("to="):
            recipient = last[3:]
        elif count == 1:
            recipient = last
        elif parts:  # ``last`` was the content type; the one before it is the recipient
            raw = parts.pop()
            recipient = raw[3:] if raw.startswith("to=") else raw
    if parts:
        raise HarmonyParseError("unexpected tokens remaining in message header")
    return channel, recipient


class HarmonyParser:
    """The parser's states and the three things the reader asks of it: ``current_channel``,
    ``current_recipient`` (None outside a message's content) and ``last_content_delta``."""

    def __init__(
        self,
        token_bytes: Callable[[int], bytes | None],
        start: int,
        message: int,
        stops: frozenset[int],
    ) -> None:
        self._bytes = token_bytes
        self._start, self._message, self._stops = start, message, stops
        self._state = 1  # 0 expect <|start|>, 1 header, 2 content
        self._role: str | None = "assistant"  # the prompt ends in ``<|start|>assistant``
        self._header: list[int] = []
        self._pending = bytearray()  # content bytes not yet a whole UTF-8 sequence
        self._stuck = False  # an id harmony cannot decode: no delta until the message ends
        self.current_channel: str | None = None
        self.current_recipient: str | None = None
        self.last_content_delta: str | None = None

    def process(self, token: int) -> None:
        if self._state == 2:
            if token in self._stops:
                self._state = 0
                self.current_channel = self.current_recipient = self.last_content_delta = None
                self._pending.clear()
                self._stuck = False
            else:
                self._content(token)
        elif self._state == 1:
            if token == self._message:
                self._open()
            else:
                self._header.append(token)
        elif token == self._start:
            self._state = 1
        else:
            raise HarmonyParseError(f"unexpected token {token} while expecting start")

    def _open(self) -> None:
        header, self._header = self._header, []
        self._state = 0  # harmony leaves this state if the header does not parse
        parts = [self._bytes(token) for token in header]
        if None in parts:
            raise HarmonyParseError("could not decode header")
        try:
            text = b"".join(parts).decode()  # type: ignore[arg-type]
        except UnicodeDecodeError:
            raise HarmonyParseError("could not decode header") from None
        self.current_channel, self.current_recipient = _header(text, self._role)
        self._role = None
        self._state = 2

    def _content(self, token: int) -> None:
        data = None if self._stuck else self._bytes(token)
        if data is None:
            self._stuck = True
            self.last_content_delta = None
            return
        pending = self._pending
        if not pending:
            try:
                self.last_content_delta = data.decode()
                return
            except UnicodeDecodeError:
                pass
        pending += data
        try:
            self.last_content_delta = pending.decode()
            pending.clear()
            return
        except UnicodeDecodeError as exc:
            valid, bad = exc.start, exc.end - exc.start
            incomplete = exc.end == len(pending) and exc.reason == "unexpected end of data"
        delta = pending[:valid].decode()
        del pending[:valid]
        if not incomplete:
            delta += _REPLACEMENT
            del pending[:bad]
        self.last_content_delta = delta or None
