"""A model's own tokenizer and chat template, without ``transformers`` (SPEC: TOK-1, TOK-3).

The tokenizer is a Hugging Face ``tokenizer.json`` read with the ``tokenizers`` library; the
chat template is Jinja, rendered the way ``transformers.apply_chat_template`` renders it (an
immutable sandbox, ``trim_blocks``/``lstrip_blocks``, ``tojson``, ``raise_exception``), from
``chat_template`` in ``tokenizer_config.json`` unless the route names a template file.

``TemplateShape`` is what a probe of the template learns once at load: the generation prompt
(``<|im_start|>assistant\\n``), the text that closes an assistant turn (``<|im_end|>\\n``) and
whether the template is append-only (every rendering of a conversation is a prefix of the
rendering of any longer one, TOK-4).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream

from engine.models.tokens.fast_bpe import fast_encoder

Message = dict[str, Any]


class TokenizerError(ValueError):
    """The tokenizer or its chat template cannot be loaded (a config problem, CFG-*)."""


def _raise(message: str) -> None:
    raise jinja2.TemplateError(message)


def _tojson(value: Any, indent: int | None = None, **_: Any) -> str:
    return json.dumps(value, ensure_ascii=False, indent=indent)


def _special_text(config: dict[str, Any], key: str) -> str:
    value = config.get(key)
    if isinstance(value, dict):  # an AddedToken serialised as {"content": ...}
        value = value.get("content")
    return value if isinstance(value, str) else ""


class ChatTemplate:
    """One compiled chat template."""

    def __init__(self, source: str, bos_token: str = "", eos_token: str = "") -> None:
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        )
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateError as exc:
            raise TokenizerError(f"chat template does not compile: {exc}") from None
        self._specials = {"bos_token": bos_token, "eos_token": eos_token}

    def render(
        self, messages: list[Message], tools: list[dict[str, Any]] | None, generation: bool
    ) -> str:
        return self._template.render(
            messages=messages,
            tools=tools or None,
            add_generation_prompt=generation,
            **self._specials,
        )


@dataclass(frozen=True)
class TemplateShape:
    generation_prompt: str  # what opens the model's turn
    close: str  # what the template writes after an assistant message's content
    append_only: bool


_PROBE_TEXT = "Xq7"


def probe(template: ChatTemplate) -> TemplateShape:
    """Learn the template's shape from a synthetic conversation (TOK-4)."""
    user: Message = {"role": "user", "content": "probe"}
    asked = template.render([user], None, False)
    opened = template.render([user], None, True)
    generation = opened[len(asked) :] if opened.startswith(asked) else ""
    answered = template.render([user, {"role": "assistant", "content": _PROBE_TEXT}], None, False)
    start = answered.find(_PROBE_TEXT, len(opened) if answered.startswith(opened) else 0)
    close = answered[start + len(_PROBE_TEXT) :] if start >= 0 else ""
    return TemplateShape(generation, close, _append_only(template))


def _append_only(template: ChatTemplate) -> bool:
    """Every prefix renders to a prefix, and the generation prompt to a prefix of the answer."""
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}}
    conversation: list[Message] = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "u1"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "r"},
        {"role": "assistant", "content": "a1"},
        {"role": "user", "content": "u2"},
        {"role": "assistant", "content": "a2"},
    ]
    try:
        previous = ""
        for end in range(1, len(conversation) + 1):
            head = conversation[:end]
            text = template.render(head, None, False)
            if not text.startswith(previous):
                return False
            if head[-1]["role"] == "assistant":
                opened = template.render(head[:-1], None, True)
                if not text.startswith(opened):
                    return False
            previous = text
    except jinja2.TemplateError:
        return False
    return True


class ModelTokenizer:
    """Encode rendered text to the model's ids; decode sampled ids incrementally."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        template: ChatTemplate,
        eos: str = "",
        fast: Callable[[str], list[int]] | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.template = template
        self.shape = probe(template)
        self.fast = fast  # the same ids from tiktoken's BPE (TOK-11), when identical
        # The ids that end the model's turn: the EOS token and the special tokens of the
        # template's close (``<|im_end|>``, ``<|eot_id|>``).
        self._specials = {
            i: t.content for i, t in tokenizer.get_added_tokens_decoder().items() if t.special
        }
        specials = set(self._specials)
        closing = tokenizer.encode(self.shape.close, add_special_tokens=False).ids
        eos_id = tokenizer.token_to_id(eos) if eos else None
        ends = {i for i in closing if i in specials} | ({eos_id} if eos_id is not None else set())
        self.end_ids = frozenset(ends)

    def encode(self, text: str) -> list[int]:
        """Special-token text in the rendered template becomes the special token, as the
        upstream's own chat path does (TOK-3)."""
        if self.fast is not None:
            return self.fast(text)
        ids: list[int] = self.tokenizer.encode(text, add_special_tokens=False).ids
        return ids

    def decode(self, ids: list[int], skip_special: bool = False) -> str:
        text: str = self.tokenizer.decode(ids, skip_special_tokens=skip_special)
        return text

    def hidden_ids(self, markers: Iterable[str] = ()) -> frozenset[int]:
        """The special tokens a text delta never shows: all of them but the ``markers`` a
        parser reads (TOK-30). Computed once per route, not per generation."""
        keep = set(markers)
        return frozenset(i for i, text in self._specials.items() if text not in keep)

    def decoder(self, hidden: frozenset[int] | None = None) -> IncrementalDecoder:
        return IncrementalDecoder(self.tokenizer, self.hidden_ids() if hidden is None else hidden)


class IncrementalDecoder:
    """Sampled ids -> text deltas. A token that ends inside a UTF-8 character yields nothing
    until the character completes (TOK-5). Special tokens are decoded as their text, so a
    parser's markers reach it however the tokenizer marks them, except the ``hidden`` ones
    (end of turn, control tokens), which yield nothing and never reach the stream (TOK-30)."""

    def __init__(self, tokenizer: Tokenizer, hidden: frozenset[int]) -> None:
        self._tokenizer = tokenizer
        self._hidden = hidden
        self._stream = DecodeStream(skip_special_tokens=False)

    def step(self, token_id: int) -> str:
        if token_id in self._hidden:
            return ""
        piece: str | None = self._stream.step(self._tokenizer, token_id)
        return piece or ""


def load_tokenizer(
    path: str, chat_template: str | None = None, fast_bpe: bool = True
) -> ModelTokenizer:
    """``path``: a ``tokenizer.json``, or a directory with ``tokenizer.json`` and
    ``tokenizer_config.json``; ``chat_template``: a Jinja file overriding the config's."""
    root = Path(path)
    file = root / "tokenizer.json" if root.is_dir() else root
    config_file = file.with_name("tokenizer_config.json")
    try:
        tokenizer = Tokenizer.from_file(str(file))
    except Exception as exc:  # the library raises a bare Exception for unreadable files
        raise TokenizerError(f"{file}: cannot load the tokenizer: {exc}") from None
    config: dict[str, Any] = {}
    if config_file.is_file():
        try:
            config = json.loads(config_file.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise TokenizerError(f"{config_file}: cannot read: {exc}") from None
    source = _template_source(config, chat_template, config_file)
    bos, eos = _special_text(config, "bos_token"), _special_text(config, "eos_token")
    template = ChatTemplate(source, bos, eos)
    fast = fast_encoder(file, _probe_texts(template)) if fast_bpe else None
    return ModelTokenizer(tokenizer, template, eos, fast)


def _probe_texts(template: ChatTemplate) -> list[str]:
    """Texts both encoders must agree on before the fast one is used (TOK-11)."""
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": {"a": 1}}}
    conversation: list[Message] = [
        {"role": "system", "content": "You are a coding agent.\n\n## Rules\n- be brief"},
        {"role": "user", "content": "Zürich 東京 🙂 it's   spaced\tout\n\n  code: x = f(1, 2)"},
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "line 1\r\n  line 2 ﬁ é e\u0301"},
    ]
    texts = [template.render(conversation, None, True)]
    texts += ["", " ", "\n\n\n", "don't  stop'll 12345 3.14 __init__() -> None:", "ÀÉÎõü ß"]
    return texts


def _template_source(config: dict[str, Any], override: str | None, config_file: Path) -> str:
    if override is not None:
        try:
            return Path(override).read_text(encoding="utf-8")
        except OSError as exc:
            raise TokenizerError(f"{override}: cannot read the chat template: {exc}") from None
    source = config.get("chat_template")
    if isinstance(source, list):  # named templates: the default one
        named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
        source = named.get("default")
    if not isinstance(source, str):
        raise TokenizerError(f"{config_file}: no chat_template (name one with chat_template)")
    return source
