"""HTTP client: ``POST /v1/responses`` with ``stream: true`` (SSE), one request per model turn.

Default: each continuation names ``previous_response_id`` (works for ``store: true`` responses,
the server default) and sends only the new tool outputs; the server hydrates the conversation
from its store. ``stateless=True`` is the baseline every agent framework uses today: no server
state at all, the full history is resent (and re-processed) on every turn.
"""

from __future__ import annotations

from types import TracebackType
from typing import Any, Self

import aiohttp
import msgspec

from clients.exceptions import ApiError, ConnectionFailed, ProtocolViolation
from clients.loop import (
    Hooks,
    RolloutResult,
    ToolCallRecord,
    TurnEnd,
    TurnReader,
    create_body,
    drive,
    output_items,
)
from clients.toolbox import ToolRegistry
from clients.wire import decode_event, encode, http_url, to_builtins
from protocol.events import ErrorBody
from protocol.sse import SseDecoder


class _ErrorEnvelope(msgspec.Struct):
    error: ErrorBody


_ERROR_DECODER = msgspec.json.Decoder(_ErrorEnvelope)


class HttpClient:
    """Runs rollouts over HTTP/SSE, with server-side state or (``stateless=True``) without."""

    def __init__(
        self,
        base_url: str,
        *,
        stateless: bool = False,
        hooks: Hooks | None = None,
        headers: dict[str, str] | None = None,
        session: aiohttp.ClientSession | None = None,
        timeout: float | None = None,
    ) -> None:
        self.url = http_url(base_url)
        self.stateless = stateless
        self.hooks = hooks or Hooks()
        self.headers = {"Content-Type": "application/json", **(headers or {})}
        self.timeout = aiohttp.ClientTimeout(total=timeout)
        self._session = session
        self._owns_session = session is None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        if self._owns_session and self._session is not None:
            await self._session.close()
            self._session = None

    async def run(
        self,
        model: str,
        input: str | list[Any],
        tools: ToolRegistry,
        instructions: str | None = None,
        **extra: Any,
    ) -> RolloutResult:
        """Run one rollout to completion. ``extra`` fields are added to every request body."""
        reader = TurnReader(self.hooks, append=False)
        history: list[Any] = _as_items(input)

        async def begin() -> TurnEnd:
            return await self._post(create_body(model, input, tools, instructions, extra), reader)

        async def answer(end: TurnEnd, records: list[ToolCallRecord]) -> TurnEnd:
            new_items = output_items(records)
            if self.stateless:
                history.extend(to_builtins(item) for item in end.items)
                history.extend(new_items)
                body = create_body(model, list(history), tools, instructions, extra)
            else:
                body = create_body(model, new_items, tools, instructions, extra)
                body["previous_response_id"] = end.response.id
            return await self._post(body, reader)

        return await drive(begin, answer, tools, reader)

    async def _post(self, body: dict[str, Any], reader: TurnReader) -> TurnEnd:
        """One streamed request: read SSE events until the response's terminal event."""
        if self._session is None:
            self._session = aiohttp.ClientSession()
        data = encode({**body, "stream": True})
        try:
            async with self._session.post(
                self.url, data=data, headers=self.headers, timeout=self.timeout
            ) as resp:
                await _raise_for_error(resp)
                decoder = SseDecoder()
                async for chunk in resp.content.iter_any():
                    for sse in decoder.feed(chunk):
                        event = decode_event(sse.data)
                        end = reader.feed(event) if event is not None else None
                        if end is not None:
                            await resp.read()  # to the stream's end: the connection is reused
                            return end
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise ConnectionFailed(f"cannot reach {self.url}: {exc}") from exc
        raise ProtocolViolation("the event stream ended before a terminal event")


async def _raise_for_error(resp: aiohttp.ClientResponse) -> None:
    if resp.status < 400:
        if resp.content_type != "text/event-stream":
            raise ProtocolViolation(f"expected an event stream, got {resp.content_type}")
        return
    raw = await resp.read()
    try:
        body = _ERROR_DECODER.decode(raw).error
    except (msgspec.DecodeError, msgspec.ValidationError):
        text = raw[:200].decode(errors="replace")
        raise ApiError(resp.status, None, text or resp.reason or "", None, "http_error") from None
    raise ApiError.from_body(resp.status, body)


def _as_items(input: str | list[Any]) -> list[Any]:
    if isinstance(input, str):
        return [{"type": "message", "role": "user", "content": input}]
    return list(input)
