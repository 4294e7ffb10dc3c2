"""Request bodies: read once per route, decoded under their ``Content-Encoding`` (HTTP-10).

One reader for every route that takes a body. A compressed body (``zstd``, ``gzip``,
``deflate``, ``br``) is decoded as its bytes arrive, and the decoded size is bounded by the
body limit (LIM-9) while it grows: a small body that would decode past the limit is refused
with 413 ``request_too_large`` once the limit is passed, never decoded whole. aiohttp's own
decoding is off (``AppRunner(app, auto_decompress=False)``, ``RUNNER_OPTIONS``): it would name
its missing codecs on the wire, and this reader is the one that applies the limit."""

from __future__ import annotations

import logging
import zlib
from collections.abc import Callable
from typing import Final, Protocol

import brotli
from aiohttp import web

from engine.server.transport.keys import ENGINE, MAX_FRAME
from protocol.errors import HttpStatusError, InvalidRequest, ServerError

try:
    from compression.zstd import (  # type: ignore[import-not-found,unused-ignore]
        DecompressionParameter,
        ZstdDecompressor,
        ZstdError,
    )
except ImportError:  # Python < 3.14
    from backports.zstd import DecompressionParameter, ZstdDecompressor, ZstdError

log = logging.getLogger("rollout.server")

# What every runner serving the app passes: the body is this module's to decode.
RUNNER_OPTIONS: Final = {"auto_decompress": False}
ACCEPTED: Final = "zstd, gzip, deflate, br"
_CORRUPT = (zlib.error, ZstdError, brotli.error, EOFError, ValueError)


class _Decoder(Protocol):
    def decompress(self, data: bytes, max_length: int) -> bytes: ...

    @property
    def eof(self) -> bool: ...

    @property
    def unused_data(self) -> bytes: ...


class _Zlib:
    """gzip, and deflate as RFC 9110 means it (zlib, RFC 1950) or as some clients send it (raw
    RFC 1951), told apart by the first byte as browsers do."""

    def __init__(self, wbits: int) -> None:
        self._wbits = wbits
        self._inflate: zlib._Decompress | None = None

    def decompress(self, data: bytes, max_length: int) -> bytes:
        if self._inflate is None:
            wbits = self._wbits
            if wbits == zlib.MAX_WBITS and data and data[0] & 0x0F != 8:
                wbits = -zlib.MAX_WBITS  # raw deflate: no zlib header
            self._inflate = zlib.decompressobj(wbits)
        return self._inflate.decompress(data, max_length)

    @property
    def eof(self) -> bool:
        return self._inflate is not None and self._inflate.eof

    @property
    def unused_data(self) -> bytes:
        return b"" if self._inflate is None else self._inflate.unused_data


class _Brotli:
    def __init__(self) -> None:
        self._process = brotli.Decompressor()

    def decompress(self, data: bytes, max_length: int) -> bytes:
        return bytes(self._process.process(data, output_buffer_limit=max_length))

    @property
    def eof(self) -> bool:
        return bool(self._process.is_finished())

    @property
    def unused_data(self) -> bytes:
        return b""  # brotli refuses bytes past its stream's end itself


def _zstd() -> _Decoder:
    """zstd with RFC 8878's window for the content coding (8 MiB): a frame header asking for
    more is refused, never allocated."""
    return ZstdDecompressor(options={DecompressionParameter.window_log_max: 23})  # type: ignore[no-any-return,unused-ignore]


_CODINGS: Final[dict[str, Callable[[], _Decoder]]] = {
    "zstd": _zstd,
    "gzip": lambda: _Zlib(16 + zlib.MAX_WBITS),
    "x-gzip": lambda: _Zlib(16 + zlib.MAX_WBITS),  # RFC 9110 §8.4.1.3
    "deflate": lambda: _Zlib(zlib.MAX_WBITS),
    "br": _Brotli,
}
# Codings whose streams may be concatenated (gzip members, zstd frames).
_MEMBERS: Final = frozenset({"zstd", "gzip", "x-gzip"})


def _too_large() -> HttpStatusError:
    return HttpStatusError(413, "request_too_large", "The request body is too large.")


class _Body:
    """One coding's decoded bytes, bounded by ``limit`` as they grow."""

    def __init__(self, coding: str, limit: int) -> None:
        self.coding, self.limit = coding, limit
        self.decoder = _CODINGS[coding]()
        self.out = bytearray()
        self.fed = False

    def feed(self, data: bytes) -> None:
        self.fed = True
        while True:
            if self.decoder.eof:  # a next member, or bytes after the stream's end
                if self.coding not in _MEMBERS:
                    raise self.corrupt()
                self.decoder = _CODINGS[self.coding]()
            # Never more than one byte past the limit: that byte is the proof of a bomb.
            room = self.limit - len(self.out) + 1
            self.out += self.decoder.decompress(data, room)
            if len(self.out) > self.limit:
                raise _too_large()
            if not self.decoder.eof:
                return
            data = self.decoder.unused_data
            if not data:
                return

    def corrupt(self) -> InvalidRequest:
        return InvalidRequest(
            "invalid_body",
            f"The request body is not valid {self.coding} data (Content-Encoding).",
            None,
        )


def _coding(request: web.Request) -> str | None:
    """The body's one content coding, or None for none (``identity``); 415 for any other."""
    if "Content-Encoding" not in request.headers:
        return None  # the common case, asked once
    named = [
        c.strip().lower()
        for header in request.headers.getall("Content-Encoding", [])
        for c in header.split(",")
    ]
    codings = [c for c in named if c and c != "identity"]
    if not codings:
        return None
    if len(codings) == 1 and codings[0] in _CODINGS:
        return codings[0]
    refused = HttpStatusError(
        415,
        "unsupported_content_encoding",
        f"Content-Encoding must be one of {ACCEPTED} (one coding).",
    )
    refused.headers = {"Accept-Encoding": ACCEPTED}  # RFC 9110 §15.5.16
    raise refused


async def read_body(request: web.Request) -> bytes:
    """The request's body, decoded, at most the body limit (LIM-9) before and after decoding."""
    coding = _coding(request)
    if coding is None:
        return await request.read()  # aiohttp's limit: 413 over client_max_size
    if request.content.total_compressed_bytes is not None:  # aiohttp decoded it already
        log.error("request bodies need a runner made with %s (HTTP-10)", RUNNER_OPTIONS)
        raise ServerError()
    request.app[ENGINE].counters[f"http.content_encoding.{coding}"] += 1
    limit = request.app[MAX_FRAME]
    body, raw = _Body(coding, limit), 0
    try:
        async for chunk in request.content.iter_any():
            raw += len(chunk)
            if raw > limit:
                raise _too_large()
            body.feed(chunk)
    except _CORRUPT:
        raise body.corrupt() from None
    if body.fed and not body.decoder.eof:
        raise body.corrupt()  # cut short
    return bytes(body.out)
