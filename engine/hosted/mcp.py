"""One rollout's MCP sessions (SPEC: MCP-5, MCP-7, MCP-8, MCP-12..MCP-14).

The client is the official ``mcp`` SDK: Streamable HTTP, or the older SSE transport for a
``server_url`` whose path ends in ``/sse``. Each server (by label and URL) gets one session the
first time the rollout needs it, reused for every later list and call, and closed when the
rollout ends (``aclose``).

The SDK runs on anyio, whose task groups and cancel scopes must be entered and left by one task
and may cancel the task that hosts them. So each session lives in its own task, owned here, and
the rollout talks to it through a bounded queue of requests, each with a future: a server that
dies, hangs or misbehaves fails the futures of its requests, never the rollout's task.

The session connects only to the addresses the host policy checked (``check_url``'s ``Pin``,
``engine/hosted/pin.py``): the name is never resolved again (MCP-11).

``headers`` and ``authorization`` are read only to build the session's HTTP client: never
logged, stored or echoed (MCP-3). Every failure is an ``McpFault``, whose ``error`` is the
``mcp_call`` item's ``error`` object (the openai SDK's ``McpToolCallError`` union)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from engine.hosted.policy import McpLimits, Pin, Refused, check_url
from protocol.items import McpListedTool
from protocol.tools import McpServerTool

if TYPE_CHECKING:  # the SDK is imported when a rollout first needs a session (~2 s of imports)
    from mcp.client.session import ClientSession

log = logging.getLogger("rollout.hosted")

# JSON-RPC codes of the faults the engine itself reports (MCP-8).
UNREACHABLE, TIMED_OUT, TOO_LARGE, REFUSED = -32000, -32001, -32002, -32003
QUEUED_REQUESTS = 8  # per session: a rollout calls one tool at a time


class McpFault(Exception):
    """A list or call that did not give a result; ``error`` is what the item carries."""

    def __init__(self, error: dict[str, Any]) -> None:
        super().__init__(str(error.get("message", error.get("type"))))
        self.error = error

    @classmethod
    def protocol(cls, code: int, message: str) -> McpFault:
        return cls({"type": "mcp_protocol_error", "code": code, "message": message})

    @property
    def message(self) -> str:
        message = self.error.get("message")
        return str(message) if message is not None else "The tool reported an error."


Job = Callable[["ClientSession"], Awaitable[Any]]


class _Request:
    __slots__ = ("future", "job")

    def __init__(self, job: Job) -> None:
        self.job = job
        self.future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()


class _Session:
    """One server's session in its own task (see the module docstring)."""

    def __init__(self, server: McpServerTool, limits: McpLimits) -> None:
        self.label = server.server_label
        self._limits = limits
        self._queue: asyncio.Queue[_Request | None] = asyncio.Queue(QUEUED_REQUESTS)
        self._task = asyncio.create_task(self._run(server), name=f"mcp {self.label}")
        self._fault: McpFault | None = None

    async def request(self, job: Job) -> Any:
        if self._fault is not None:
            raise self._fault
        request = _Request(job)
        await self._queue.put(request)
        # The session bounds each job's time; this wait is only a backstop.
        async with asyncio.timeout(self._limits.call_timeout_s * 2 + 5):
            return await request.future

    async def _run(self, server: McpServerTool) -> None:
        import anyio

        limits = self._limits
        try:
            pin = await check_url(server.server_url or "", limits.hosts)
            async with _connect(server, limits, pin) as session:
                with anyio.fail_after(limits.call_timeout_s):
                    await session.initialize()
                while (request := await self._queue.get()) is not None:
                    await self._serve(session, request)
        except asyncio.CancelledError:
            self._fault = McpFault.protocol(UNREACHABLE, "The MCP session was closed.")
            raise
        except Refused as exc:
            self._fault = McpFault.protocol(REFUSED, str(exc))
        except TimeoutError:
            self._fault = McpFault.protocol(TIMED_OUT, "The MCP server did not answer in time.")
        except BaseException as exc:  # the SDK raises exception groups from its task groups
            self._fault = _connection_fault(exc)
            log.info("mcp %s: session ended: %s", self.label, type(exc).__name__)
        finally:
            fault = self._fault or McpFault.protocol(UNREACHABLE, "The MCP session was closed.")
            self._fault = fault
            while not self._queue.empty():
                left = self._queue.get_nowait()
                if left is not None and not left.future.done():
                    left.future.set_exception(fault)

    async def _serve(self, session: ClientSession, request: _Request) -> None:
        import anyio
        from mcp.shared.exceptions import MCPError

        try:
            with anyio.fail_after(self._limits.call_timeout_s):
                result = await request.job(session)
        except TimeoutError:
            fault = McpFault.protocol(TIMED_OUT, "The MCP server did not answer in time.")
            _settle(request, fault)
        except McpFault as exc:
            _settle(request, exc)
        except Exception as exc:  # a JSON-RPC error from the server, a broken stream …
            _settle(request, _call_fault(exc))
            if not isinstance(exc, MCPError):
                raise  # the transport is gone: end the session
        else:
            if not request.future.done():
                request.future.set_result(result)

    async def aclose(self) -> None:
        if not self._task.done():
            with contextlib.suppress(asyncio.QueueFull):
                self._queue.put_nowait(None)
            try:
                async with asyncio.timeout(2):
                    await asyncio.shield(self._task)
            except (TimeoutError, Exception):
                self._task.cancel()
        with contextlib.suppress(BaseException):
            await self._task


def _settle(request: _Request, fault: McpFault) -> None:
    if not request.future.done():
        request.future.set_exception(fault)


def _call_fault(exc: BaseException) -> McpFault:
    from mcp.shared.exceptions import MCPError

    if isinstance(exc, MCPError):
        error = getattr(exc, "error", None)
        code = getattr(error, "code", UNREACHABLE)
        message = getattr(error, "message", "The MCP server answered with an error.")
        return McpFault.protocol(int(code), str(message))
    return _connection_fault(exc)


def _connection_fault(exc: BaseException) -> McpFault:
    """What a broken connection tells the model: the HTTP status when there was one."""
    import httpx2

    for leaf in _leaves(exc):
        if isinstance(leaf, httpx2.HTTPStatusError):
            status = leaf.response.status_code
            return McpFault({"type": "http_error", "code": status, "message": f"HTTP {status}"})
    return McpFault.protocol(UNREACHABLE, "The MCP server could not be reached.")


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


def _headers(server: McpServerTool) -> dict[str, str]:
    headers = dict(server.headers or {})
    if server.authorization:
        headers["Authorization"] = f"Bearer {server.authorization}"
    return headers


@asynccontextmanager
async def _connect(
    server: McpServerTool, limits: McpLimits, pin: Pin
) -> AsyncIterator[ClientSession]:
    """A session over a client pinned to the checked addresses (MCP-11)."""
    import functools

    import httpx2
    from mcp.client.session import ClientSession
    from mcp.client.sse import sse_client
    from mcp.client.streamable_http import streamable_http_client

    from engine.hosted.pin import pinned_client

    url = server.server_url or ""
    timeout = httpx2.Timeout(limits.call_timeout_s)
    if url.rstrip("/").endswith("/sse"):
        transport = sse_client(
            url,
            headers=_headers(server),
            timeout=limits.call_timeout_s,
            sse_read_timeout=limits.call_timeout_s,
            httpx_client_factory=functools.partial(pinned_client, url, pin),
        )
        async with transport as (read, write), ClientSession(read, write) as session:
            yield session
        return
    client = pinned_client(url, pin, headers=_headers(server), timeout=timeout)
    streams = streamable_http_client(
        # the bound in real bytes on what the transport buffers: one event holds the output
        # twice at most (content and structured content) and its JSON-RPC envelope (MCP-13)
        url,
        http_client=client,
        max_sse_event_size=2 * limits.max_output_bytes + 65536,
    )
    async with client, streams as (read, write), ClientSession(read, write) as session:
        yield session


class McpSessions:
    """The MCP sessions of one rollout (MCP-12): opened on first use, reused, closed once."""

    def __init__(self, limits: McpLimits) -> None:
        self.limits = limits
        self._sessions: dict[tuple[str, str], _Session] = {}

    def _session(self, server: McpServerTool) -> _Session:
        key = (server.server_label, server.server_url or "")
        session = self._sessions.get(key)
        if session is None:
            session = self._sessions[key] = _Session(server, self.limits)
        return session

    async def list_tools(self, server: McpServerTool) -> list[McpListedTool]:
        """The server's tools (every page), as the ``mcp_list_tools`` item lists them."""

        from mcp_types import PaginatedRequestParams

        async def job(session: ClientSession) -> list[McpListedTool]:
            listed: list[McpListedTool] = []
            cursor: str | None = None
            while True:
                params = PaginatedRequestParams(cursor=cursor) if cursor else None
                page = await session.list_tools(params=params)
                listed.extend(_listed(tool) for tool in page.tools)
                cursor = page.next_cursor
                if not cursor:
                    return listed

        result: list[McpListedTool] = await self._session(server).request(job)
        return result

    async def call(self, server: McpServerTool, name: str, arguments: str) -> str:
        """The tool's output text; ``McpFault`` when it fails (MCP-8), including an output
        larger than ``max_output_bytes`` (MCP-13)."""
        try:
            parsed = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            raise McpFault.protocol(-32602, "The arguments are not valid JSON.") from None
        if not isinstance(parsed, dict):
            raise McpFault.protocol(-32602, "The arguments must be a JSON object.")
        limit = self.limits.max_output_bytes

        async def job(session: ClientSession) -> str:
            result = await session.call_tool(name, parsed)
            text = _output_text(result.content, result.structured_content)
            if len(text.encode()) > limit:
                raise McpFault.protocol(TOO_LARGE, f"The tool's output exceeds {limit} bytes.")
            if result.is_error:
                content = [
                    part.model_dump(mode="json", exclude_none=True) for part in result.content
                ]
                raise McpFault({"type": "mcp_tool_execution_error", "content": content})
            return text

        output: str = await self._session(server).request(job)
        return output

    async def aclose(self) -> None:
        sessions, self._sessions = list(self._sessions.values()), {}
        for session in sessions:
            await session.aclose()


def _listed(tool: Any) -> McpListedTool:
    annotations = (
        tool.annotations.model_dump(mode="json", exclude_none=True) if tool.annotations else None
    )
    return McpListedTool(
        name=tool.name,
        input_schema=tool.input_schema,
        description=tool.description,
        annotations=annotations,
    )


def _output_text(content: list[Any], structured: Any) -> str:
    """Text parts joined; any other part as its JSON; the structured result when there is no
    content at all."""
    pieces: list[str] = []
    for part in content:
        text = getattr(part, "text", None)
        if getattr(part, "type", None) == "text" and isinstance(text, str):
            pieces.append(text)
        else:
            pieces.append(json.dumps(part.model_dump(mode="json", exclude_none=True)))
    if not pieces and structured is not None:
        return json.dumps(structured)
    return "\n".join(pieces)
