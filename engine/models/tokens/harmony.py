"""gpt-oss's harmony format through the ``openai-harmony`` package (SPEC: HARMONY-1..HARMONY-6).

``template = "harmony"`` needs no tokenizer file: harmony renders the conversation with its own
encoding (o200k_base plus harmony's special tokens) and parses what the model samples, token by
token, with its ``StreamableParser``.

* ``harmony_encoding`` loads the encoding once per process, offline: openai-harmony reads
  ``o200k_base.tiktoken`` from the directory named by ``TIKTOKEN_ENCODINGS_BASE``; when that is
  not set, the copy bpe-openai bundles (gzipped) is unpacked once into a cache directory and
  the variable is set to it. Nothing is downloaded (HARMONY-1).
* ``HarmonyRenderer`` renders the first prompt with ``render_conversation_for_completion``
  (system message, developer message with the instructions and function tools, the items) and
  every later one as the previous prompt + the sampled ids + ``render`` of each new item + the
  generation prompt ``<|start|>assistant`` (HARMONY-2). harmony itself drops earlier
  ``analysis`` messages when it renders a whole conversation: that is ``history = "rerender"``;
  ``exact`` keeps what was sampled. ``render`` of a message is its frame (the header through
  ``<|message|>``, then the end id) around the ordinary o200k ids of its text; the text is
  encoded by bpe-openai's o200k_base, several times faster than harmony's own BPE, and the
  frame rendered by harmony with no text and kept per header (HARMONY-7).
* ``HarmonyReader`` maps the sampled messages to items (HARMONY-3): ``analysis`` -> reasoning,
  ``commentary`` with ``to=functions.NAME`` -> a function call (its arguments checked as a JSON
  object when the message ends), ``final`` and ``commentary`` without a recipient -> message
  text. Anything harmony's parser rejects, or a call that is not a JSON object, stays text and
  is counted (HARMONY-4).
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import secrets
import tempfile
import warnings
from collections import Counter
from functools import cache
from pathlib import Path
from typing import Any

from openai_harmony import (
    Author,
    Conversation,
    DeveloperContent,
    HarmonyEncoding,
    HarmonyEncodingName,
    HarmonyError,
    Role,
    StreamableParser,
    SystemContent,
    TextContent,
    ToolDescription,
    load_harmony_encoding,
)
from openai_harmony import Message as HarmonyMessage

from engine.conversation.compaction import summary_text
from engine.conversation.tokens import CHUNK_CHARS
from engine.conversation.trajectory import Trajectory
from engine.models.base import ArgsDelta, CallEnd, CallStart, Delta, ReasoningDelta, TextDelta
from engine.models.tokens.harmony_parse import (
    ORDINARY,
    HarmonyParseError,
    HarmonyParser,
    TokenBytes,
)
from engine.models.tokens.reasoning import AnswerReader, ReasoningParser
from engine.models.tokens.render import Renderer, SampledAnswer
from engine.models.tokens.tokenizer import ModelTokenizer
from engine.models.tokens.tool_parsers import ToolSchemas
from protocol.items import (
    Compaction,
    CustomToolCall,
    FunctionCall,
    InputItem,
    Message,
    Reasoning,
    ToolOutput,
    reasoning_text,
    text_of,
)

ENCODINGS_ENV = "TIKTOKEN_ENCODINGS_BASE"
_VOCAB = "o200k_base.tiktoken"
_FUNCTIONS = "functions."
_CALL_CONTENT_TYPE = "<|constrain|>json"  # what gpt-oss samples for a JSON call


class HarmonySetupError(ValueError):
    """The o200k_base vocabulary cannot be found or unpacked (a config problem)."""


def _bundled_vocabulary() -> Path:
    """bpe-openai's bundled copy (a dependency, TOK-12), found without importing the package
    (its import builds cl100k)."""
    spec = importlib.util.find_spec("bpe_openai")
    if spec is None or spec.origin is None:
        raise HarmonySetupError(f"{_VOCAB}: bpe-openai is not installed; set {ENCODINGS_ENV}")
    return Path(spec.origin).parent / "data" / f"{_VOCAB}.gz"


def _vocabulary_dir() -> Path:
    """A directory holding ``o200k_base.tiktoken``: the one the environment names, else the
    bundled copy unpacked once (atomically, so concurrent processes never read half a file)."""
    named = os.environ.get(ENCODINGS_ENV)
    if named:
        return Path(named)
    target = Path(tempfile.gettempdir()) / f"rollout-tiktoken-{os.getuid()}"
    file = target / _VOCAB
    if not file.is_file():
        try:
            data = gzip.decompress(_bundled_vocabulary().read_bytes())
            target.mkdir(mode=0o700, exist_ok=True)
            partial = target / f"{_VOCAB}.{os.getpid()}.part"
            partial.write_bytes(data)
            partial.replace(file)
        except OSError as exc:
            raise HarmonySetupError(f"cannot unpack {_VOCAB}: {exc.strerror}") from None
    os.environ[ENCODINGS_ENV] = str(target)
    return target


@cache
def harmony_encoding() -> HarmonyEncoding:
    """gpt-oss's encoding, loaded once per process, offline (HARMONY-1)."""
    _vocabulary_dir()
    try:
        return load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
    except HarmonyError as exc:
        raise HarmonySetupError(f"cannot load the harmony encoding: {exc}") from None


# --------------------------------------------------------------------------- rendering

# Texts bpe-openai's o200k_base must encode as harmony does before it is used (HARMONY-7).
_PROBES = (
    "hello <|end|> world <|start|>assistant<|message|>",
    "Zürich 東京 🙂 it's   spaced\tout\n\n  x = f(1, 2)",
    "fn dispatch(&mut self, job: usize) -> Result<Job, Error> {\r\n    0\n}",
    " \n\n\n   \t ",
)
_FRAMES = 256  # message headers whose frame is kept (a few per tool name)


@cache
def _o200k(encoding: HarmonyEncoding) -> Any | None:
    """bpe-openai's o200k_base (harmony's ordinary vocabulary) when it gives harmony's ids on
    the probes, else None: then harmony encodes the text itself (HARMONY-7)."""
    try:
        with warnings.catch_warnings():  # its data loader uses a deprecated importlib API
            warnings.simplefilter("ignore", DeprecationWarning)
            import bpe_openai

            fast = bpe_openai.get_encoding("o200k_base")
    except (ImportError, ValueError, OSError):
        return None
    for text in _PROBES:
        if fast.encode_ordinary(text) != encoding.encode(text, disallowed_special=()):
            return None
    return fast


def _call_names(items: list[InputItem], start: int) -> dict[str, str]:
    """call_id -> function name for the tool outputs in ``items[start:]``, read backwards from
    there until every one is found (a tool message is authored by ``functions.NAME``)."""
    wanted = {item.call_id for item in items[start:] if isinstance(item, ToolOutput)}
    names: dict[str, str] = {}
    for item in reversed(items):
        if not wanted:
            break
        if isinstance(item, FunctionCall | CustomToolCall) and item.call_id in wanted:
            names[item.call_id] = item.name
            wanted.discard(item.call_id)
    return names


def harmony_messages(
    items: list[InputItem], names: dict[str, str], dropped: Counter[str]
) -> list[HarmonyMessage]:
    """Items -> harmony messages (HARMONY-2)."""
    out: list[HarmonyMessage] = []
    for item in items:
        if isinstance(item, Message):
            text = text_of(item.content)
            if item.role == "user":
                out.append(HarmonyMessage.from_role_and_content(Role.USER, text))
            elif item.role == "assistant":
                out.append(_assistant(text, "final"))
            else:
                out.append(HarmonyMessage.from_role_and_content(Role.DEVELOPER, text))
        elif isinstance(item, Reasoning):
            out.append(_assistant(reasoning_text(item), "analysis"))
        elif isinstance(item, FunctionCall | CustomToolCall):
            body = item.arguments if isinstance(item, FunctionCall) else item.input
            call = _assistant(body, "commentary").with_recipient(_FUNCTIONS + item.name)
            out.append(call.with_content_type(_CALL_CONTENT_TYPE))
        elif isinstance(item, ToolOutput):
            author = Author.new(Role.TOOL, _FUNCTIONS + names.get(item.call_id, "unknown"))
            result = HarmonyMessage.from_author_and_content(author, text_of(item.output))
            out.append(result.with_recipient("assistant").with_channel("commentary"))
        elif isinstance(item, Compaction):
            summary = f"Summary of the earlier conversation:\n{summary_text(item)}"
            out.append(HarmonyMessage.from_role_and_content(Role.USER, summary))
        else:  # opaque items: harmony has no place for them
            dropped[f"dropped.{getattr(item, 'type', 'item')}"] += 1
    return out


def _assistant(text: str, channel: str) -> HarmonyMessage:
    return HarmonyMessage.from_role_and_content(Role.ASSISTANT, text).with_channel(channel)


class HarmonyRenderer(Renderer[list[ToolDescription]]):
    """Items -> harmony prompt ids, rendered once and appended (HARMONY-2, TOK-4)."""

    reasoning = "harmony"  # harmony's channels carry the reasoning (HARMONY-3)
    needs_tokenizer = False  # its own encoding (HARMONY-1)

    def __init__(self, encoding: HarmonyEncoding, rerender: bool = False) -> None:
        super().__init__(rerender)
        self.encoding = encoding
        empty = Conversation.from_messages([])
        self.generation_prompt = encoding.render_conversation_for_completion(empty, Role.ASSISTANT)
        self.stop_ids = frozenset(encoding.stop_tokens_for_assistant_actions())
        self._fast = _o200k(encoding)
        self._ends, self._message_id = _markers(encoding)
        self._frames: dict[tuple[Any, ...], list[int]] = {}
        self._tails: dict[str, list[int]] = {}  # the closes owed (HARMONY-2): a few short texts
        self._vocab: int | None = None

    @classmethod
    def build(cls, tokenizer: ModelTokenizer | None, rerender: bool) -> HarmonyRenderer:
        return cls(harmony_encoding(), rerender)

    @property
    def vocab_size(self) -> int:
        """The ids harmony decodes (o200k_harmony's, reserved specials included), found once
        by bisection: the encoding does not say."""
        if self._vocab is None:
            low, high = 1, 1 << 22
            while low < high:
                middle = (low + high) // 2
                try:
                    self.encoding.decode([middle])
                except (HarmonyError, OverflowError):
                    high = middle
                else:
                    low = middle + 1
            self._vocab = low
        return self._vocab

    def encode(self, text: str) -> list[int]:
        return self.encoding.encode(text, allowed_special="all")

    def describe(self, defs: list[dict[str, Any]]) -> list[ToolDescription]:
        return [
            ToolDescription.new(
                d["function"]["name"],
                d["function"].get("description", ""),
                d["function"].get("parameters"),
            )
            for d in defs
        ]

    def header_text(self, instructions: str | None, defs: list[dict[str, Any]]) -> str:
        return f"harmony\x00{instructions or ''}\x00{json.dumps(defs)}"

    def whole(
        self, items: list[InputItem], instructions: str | None, header: list[ToolDescription]
    ) -> list[int]:
        head = [HarmonyMessage.from_role_and_content(Role.SYSTEM, SystemContent.new())]
        if instructions or header:
            developer = DeveloperContent.new()
            if instructions:
                developer = developer.with_instructions(instructions)
            if header:
                developer = developer.with_function_tools(header)
            head.append(HarmonyMessage.from_role_and_content(Role.DEVELOPER, developer))
        messages = head + harmony_messages(items, _call_names(items, 0), self.stats)
        conversation = Conversation.from_messages(messages)
        return self.encoding.render_conversation_for_completion(conversation, Role.ASSISTANT)

    def appended(self, items: list[InputItem], trajectory: Trajectory) -> list[int]:
        messages = harmony_messages(
            items[trajectory.covered :], _call_names(items, trajectory.covered), self.stats
        )
        ids = self._tail(trajectory.tail)
        for message in messages:
            ids += self.render(message)
        ids += self.generation_prompt
        return ids

    def _tail(self, text: str) -> list[int]:
        """The ids of the close the last answer owes, encoded once per text (a harmony
        ``encode`` call costs about 25 us however short its text)."""
        ids = self._tails.get(text)
        if ids is None:
            ids = self.encode(text)
            if len(text) <= 32 and len(self._tails) < 16:
                self._tails[text] = ids
        return list(ids)

    def render(self, message: HarmonyMessage) -> list[int]:
        """``encoding.render(message)``, exactly: the message's frame (its header rendered by
        harmony, kept per header) around the o200k ids of its one text (HARMONY-7)."""
        content = message.content
        text = content[0].text if len(content) == 1 and type(content[0]) is TextContent else None
        fast = self._fast
        if fast is None or not text or len(text) > CHUNK_CHARS or not _utf8(text):
            return self.encoding.render(message)
        author = message.author
        key = (author.role, author.name, message.channel, message.recipient, message.content_type)
        frame = self._frames.get(key)
        if frame is None:
            frame = self.encoding.render(message.model_copy(update={"content": []}))
            if len(frame) < 2 or frame[-2] != self._message_id or frame[-1] not in self._ends:
                return self.encoding.render(message)  # not the shape measured: harmony's own
            if len(self._frames) >= _FRAMES:
                self._frames.clear()
            self._frames[key] = frame
        ids: list[int] = frame[:-1]
        ids += fast.encode_ordinary(text)
        ids.append(frame[-1])
        return ids

    def close(self, answer: SampledAnswer) -> str:
        """A generation cut off before its stop token owes the message's close: ``<|call|>``
        after a call, ``<|end|>`` otherwise. harmony's own re-render of an answer differs by
        design, so nothing is kept to check it (HARMONY-2)."""
        if not answer.ids or answer.ids[-1] not in self.stop_ids:
            return "<|call|>" if answer.ended_in_call else "<|end|>"
        return ""


class HarmonyFormat(ReasoningParser):
    """``reasoning_parser = "harmony"``: the channels carry reasoning, text and calls, read id
    by id by ``HarmonyReader`` (HARMONY-3); no tool parser is involved."""

    template = "harmony"

    def __init__(self, renderer: Renderer[Any], tool_parser: str, stats: Counter[str]) -> None:
        super().__init__(renderer, tool_parser, stats)
        assert isinstance(renderer, HarmonyRenderer)
        self.encoding = renderer.encoding
        self.call_parser = "harmony"

    def reader(self, schemas: ToolSchemas) -> AnswerReader:
        return HarmonyReader(self.encoding, self.stats)

    @classmethod
    def sample(cls, reasoning: str, answer: str, call: str, arguments: str) -> str:
        return (
            f"<|channel|>analysis<|message|>{reasoning}<|end|>"
            f"<|start|>assistant<|channel|>commentary<|message|>{answer}<|end|>"
            f"<|start|>assistant<|channel|>commentary to=functions.{call} <|constrain|>json"
            f"<|message|>{arguments}<|call|>"
        )


def _utf8(text: str) -> bool:
    """A lone surrogate has no UTF-8: harmony's own path refuses it as before."""
    if text.isascii():
        return True
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


# --------------------------------------------------------------------------- parsing


@cache
def _markers(encoding: HarmonyEncoding) -> tuple[frozenset[int], int]:
    """The ids that end a message, and ``<|message|>``'s (encoded once, not per generation)."""
    ends = frozenset(encoding.encode("<|end|><|call|><|return|>", allowed_special="all"))
    (message,) = encoding.encode("<|message|>", allowed_special="all")
    return ends, message


@cache
def _token_bytes(encoding: HarmonyEncoding) -> TokenBytes | None:
    fast = _o200k(encoding)
    if fast is None or len(getattr(fast, "_rank_to_bytes", ())) < ORDINARY:
        return None
    return TokenBytes(encoding, fast)


@cache
def _parser_ids(encoding: HarmonyEncoding) -> tuple[int, int, frozenset[int]]:
    """``<|start|>``, ``<|message|>`` and the stop ids, as harmony's parser finds them."""
    (start,) = encoding.encode("<|start|>", allowed_special="all")
    (message,) = encoding.encode("<|message|>", allowed_special="all")
    return start, message, frozenset(encoding.stop_tokens())


def harmony_parser(encoding: HarmonyEncoding) -> HarmonyParser | StreamableParser:
    """harmony's parser, read in Python over bpe-openai's o200k token bytes; harmony's own
    ``StreamableParser`` when bpe-openai does not give harmony's ids (HARMONY-3)."""
    table = _token_bytes(encoding)
    if table is None:
        return StreamableParser(encoding, Role.ASSISTANT)
    return HarmonyParser(table, *_parser_ids(encoding))


def _decode_lenient(encoding: HarmonyEncoding, ids: list[int]) -> str:
    """harmony's ``decode`` of rejected ids, where an id it cannot decode (outside its
    vocabulary, or any integer an upstream sent) is U+FFFD rather than an exception."""
    try:
        return encoding.decode(ids)
    except (HarmonyError, OverflowError):
        pass
    text: list[str] = []
    run: list[int] = []
    for token in ids:
        try:
            encoding.decode([token])
        except (HarmonyError, OverflowError):
            text += [encoding.decode(run), "\ufffd"]
            run = []
        else:
            run.append(token)
    text.append(encoding.decode(run))
    return "".join(text)


class HarmonyReader:
    """Sampled ids -> reasoning, text and calls, one id at a time (HARMONY-3, HARMONY-4)."""

    def __init__(self, encoding: HarmonyEncoding, stats: Counter[str]) -> None:
        self._encoding = encoding
        self._parser = harmony_parser(encoding)
        self._stats = stats
        self.calls = 0
        self.malformed = 0  # calls that stayed text (PARSE-3)
        self.reasoning_tokens = 0
        self.ended_in_call = False
        self._in_content = False  # between a message's ``<|message|>`` and its end
        self._kind: str | None = None  # the current message: reasoning | text | call
        self._name = ""
        self._args: list[str] = []
        self._header: list[int] = []  # ids of the current message before its content
        self._broken: list[int] | None = None  # ids after harmony's parser gave up
        self._ends, self._message_token = _markers(encoding)

    def feed(self, ids: list[int]) -> list[Delta]:
        out: list[Delta] = []
        parser = self._parser
        for token in ids:
            if self._broken is not None:
                self._broken.append(token)
                continue
            channel = parser.current_channel
            closing = self._in_content and token in self._ends
            recipient = parser.current_recipient if closing else None
            try:
                parser.process(token)
            except (HarmonyError, HarmonyParseError, OverflowError):  # Overflow: not a u32
                out.extend(self._give_up(token))
                continue
            if channel == "analysis" or parser.current_channel == "analysis":
                self.reasoning_tokens += 1
            delta = parser.last_content_delta
            if delta:
                out.extend(self._content(delta))
            elif self._kind is None:
                self._header.append(token)
            if closing:  # the message is complete (known here, not from the parser's list)
                self._in_content = False
                out.extend(self._message_end(recipient))
            elif token == self._message_token:
                self._in_content = True
        return out

    def _content(self, delta: str) -> list[Delta]:
        if self._kind is None:
            self._kind = self._classify()
        if self._kind == "reasoning":
            return [ReasoningDelta(delta)]
        if self._kind == "call":
            self._args.append(delta)
            return []
        return [TextDelta(delta)]

    def _classify(self) -> str:
        parser = self._parser
        recipient, channel = parser.current_recipient, parser.current_channel
        self.ended_in_call = False
        if recipient is not None:
            name = recipient.removeprefix(_FUNCTIONS)
            if recipient.startswith(_FUNCTIONS) and name:
                self._name = name
                return "call"
            self._stats["harmony.unknown_recipient"] += 1
            return "text"
        if channel == "analysis":
            return "reasoning"
        if channel not in ("final", "commentary", None):
            self._stats["harmony.unknown_channel"] += 1
        return "text"

    def _message_end(self, recipient: str | None) -> list[Delta]:
        kind, self._kind = self._kind, None
        self._header = []
        if kind is None:  # no content: only a call without arguments is still something
            recipient = recipient or ""
            if recipient.startswith(_FUNCTIONS) and len(recipient) > len(_FUNCTIONS):
                kind, self._name = "call", recipient[len(_FUNCTIONS) :]
        if kind != "call":
            return []
        body, self._args = "".join(self._args), []
        return self._call(body or "{}")

    def _call(self, body: str) -> list[Delta]:
        try:
            value: Any = json.loads(body)
        except ValueError:
            value = None
        if not isinstance(value, dict):  # not a call the client could run: it stays text
            self._stats["harmony.malformed_call"] += 1
            self.malformed += 1
            return [TextDelta(body)]
        self.calls += 1
        self.ended_in_call = True
        call_id = "call_" + secrets.token_hex(12)
        return [CallStart(call_id, self._name), ArgsDelta(body), CallEnd()]

    def _give_up(self, token: int) -> list[Delta]:
        """harmony's parser rejected ``token``: the message so far and the rest are text."""
        self._stats["harmony.malformed"] += 1
        self._broken = [*self._header, token]
        self._header = []
        kind, self._kind = self._kind, None
        if kind == "call":
            body, self._args = "".join(self._args), []
            return [TextDelta(body)] if body else []
        return []

    def finish(self) -> list[Delta]:
        out: list[Delta] = []
        if self._broken is None and self._in_content:
            # Cut off inside a message (no stop id): it ends with what it has.
            self._in_content = False
            out.extend(self._message_end(self._parser.current_recipient))
        elif self._broken is None and self._header:
            header, self._header = self._header, []
            if any(token in self._ends for token in header):
                # The model ended a "message" that never had a ``<|message|>``: plain text.
                self._stats["harmony.malformed"] += 1
                self._broken = header
            else:  # cut off while writing a header: nothing was said yet
                self._stats["harmony.unfinished_header"] += 1
        if self._broken:
            text = _decode_lenient(self._encoding, self._broken)
            self._broken = []
            if text:
                out.append(TextDelta(text))
        return out
