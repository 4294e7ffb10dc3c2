"""One pooled HTTP/1.1 client shared by every upstream backend (SPEC UP-6, UP-9).

A streaming POST to a model server is the largest share of a turn's CPU after the model itself
(docs/benchmark.md, BENCH-11). aiohttp's client spent about 200 us of CPU per request on
request objects, header multidicts, timers and its stream reader; this client writes one
prebuilt request head and parses the answer with ``httptools`` (llhttp, the parser uvicorn
uses), about 60 us on the same stub. It is deliberately small: POST only, HTTP/1.1 keep-alive,
``http`` and ``https``, no redirects, no cookies, no proxies or ``.netrc`` (the environment must
not reroute or add credentials to traffic to a model server).

Created lazily on first use (it must live inside the running event loop, and the CLI builds
its routes before the loop starts); closed by the engine on shutdown through ``Router.aclose``.
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from typing import cast

import httptools
from yarl import URL

HIGH_WATER = 256 * 1024  # unread body bytes per connection before the socket stops being read


class HttpFault(Exception):
    """The connection failed or the answer was not HTTP (the caller maps it to UP-3)."""


class Target:
    """Where a POST goes: the pool key and the request head's fixed part, built once."""

    __slots__ = ("head", "host", "key", "port", "tls")

    def __init__(self, url: str, headers: dict[str, str]) -> None:
        parsed = URL(url)
        if parsed.scheme not in ("http", "https") or not parsed.raw_host:
            raise ValueError(f"not an http(s) URL: {parsed.with_user(None)}")
        self.tls = parsed.scheme == "https"
        self.host = parsed.raw_host
        self.port = parsed.port or (443 if self.tls else 80)
        self.key = (self.host, self.port, self.tls)
        lines = [f"POST {parsed.raw_path_qs} HTTP/1.1", f"Host: {parsed.host_port_subcomponent}"]
        lines += [header_line(name, value) for name, value in headers.items()]
        self.head = ("\r\n".join(lines) + "\r\n").encode("latin-1")


def header_line(name: str, value: str) -> str:
    """``name: value`` without its line end; a header from configuration or the environment
    must not smuggle a line break (a second header, or a second request) onto the wire."""
    if "\r" in name or "\n" in name or "\r" in value or "\n" in value or ":" in name:
        raise ValueError(f"header {name.splitlines()[0][:40]!r} contains a line break or colon")
    return f"{name}: {value}"


class PooledConnection(asyncio.Protocol):
    """One keep-alive connection and the answer being read on it: status, content type, the
    body as it arrives (back-pressured at ``HIGH_WATER``) and whether it may be reused."""

    def __init__(self, pool: HttpPool, key: tuple[str, int, bool]) -> None:
        self._pool, self.key = pool, key
        self.transport: asyncio.Transport | None = None
        self.lost = False
        self.read_timeout = 300.0  # the longest silence between two chunks (UP-1)
        self._loop = asyncio.get_running_loop()
        # One timer per connection, not one per wait: it fires at the first wait's deadline,
        # then moves itself to the current wait's (``_since``), and ends while nobody waits.
        self._timer: asyncio.TimerHandle | None = None
        self._since = 0.0  # when the current wait began
        self._reset()

    def _reset(self) -> None:
        self._parser = httptools.HttpResponseParser(self)
        self.status = 0
        self.content_type = ""
        self._name = b""
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self._complete = False
        self._keep_alive = False
        self._fault: HttpFault | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._paused = False
        self._timed_out = False

    # asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses; both have this interface
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._fault = HttpFault("unexpected upgrade")
        except httptools.HttpParserError:
            self._fault = HttpFault("malformed HTTP answer")
        if self._fault is not None and self.transport is not None:
            self.transport.close()
        self._wake()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        self._stop_timer()
        self._pool._forget(self)
        self._wake()

    # httptools callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        if len(name) == 12 and name.lower() == b"content-type":
            self.content_type = value.split(b";", 1)[0].strip().lower().decode("latin-1")

    def on_headers_complete(self) -> None:
        self.status = self._parser.get_status_code()

    def on_body(self, body: bytes) -> None:
        self._chunks.append(body)
        self._buffered += len(body)
        if self._buffered > HIGH_WATER and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()

    def on_message_complete(self) -> None:
        self._complete = True
        self._keep_alive = self._parser.should_keep_alive()  # llhttp forgets it afterwards

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def _wait(self) -> None:
        """Until data, the end, or ``read_timeout`` of silence (then ``TimeoutError``)."""
        loop = self._loop
        self._waiter = waiter = loop.create_future()
        self._since = loop.time()
        if self._timer is None:
            self._timer = loop.call_at(self._since + self.read_timeout, self._expire)
        try:
            await waiter
        finally:
            self._waiter = None
        if self._timed_out:
            raise TimeoutError

    def _stop_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expire(self) -> None:
        self._timer = None
        waiter = self._waiter
        if waiter is None or waiter.done():
            return  # nobody waits: the next wait arms a timer again
        due = self._since + self.read_timeout
        if self._loop.time() < due:
            self._timer = self._loop.call_at(due, self._expire)
            return
        self._timed_out = True
        waiter.set_result(None)

    async def start(self, head: bytes, body: bytes) -> None:
        """Send the request and wait for the answer's head."""
        assert self.transport is not None
        self.transport.write(b"%sContent-Length: %d\r\n\r\n%s" % (head, len(body), body))
        while not self.status:
            self._raise_fault()
            if self.lost:
                raise HttpFault("the connection closed before the answer")
            await self._wait()

    def _raise_fault(self) -> None:
        if self._fault is not None:
            raise self._fault

    @property
    def at_eof(self) -> bool:
        return not self._chunks and (self._complete or self.lost)

    async def readany(self) -> bytes:
        """The body bytes that arrived since the last call; b"" at the end. A connection that
        closes before a framed body's end also ends it: the caller sees a short answer."""
        while not self._chunks:
            self._raise_fault()
            if self._complete or self.lost:
                return b""
            await self._wait()
        data = self._chunks.popleft() if len(self._chunks) == 1 else b"".join(self._chunks)
        self._chunks.clear()
        self._buffered = 0
        if self._paused and self.transport is not None:
            self._paused = False
            self.transport.resume_reading()
        return data

    async def read(self, limit: int) -> bytes:
        """The body up to ``limit`` bytes (a status error's message, a compaction's answer)."""
        data = bytearray()
        while len(data) < limit and (chunk := await self.readany()):
            data += chunk
        return bytes(data[:limit])

    def release(self) -> None:
        """The caller is done: a fully read answer on a keep-alive connection goes back to the
        pool; anything else closes the connection (the upstream sees the disconnect, UP-6)."""
        reusable = (
            self._complete and not self._chunks and self._fault is None and not self.lost
            and self._keep_alive
        )  # fmt: skip
        if reusable:
            self._reset()
            self._pool._idle_put(self)
        else:
            self.close()

    def close(self) -> None:
        self._stop_timer()
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()
        self._pool._forget(self)


class HttpPool:
    """Keep-alive connections per (host, port, tls), at most ``max_connections`` open."""

    def __init__(self, max_connections: int = 256) -> None:
        self.max_connections = max_connections
        self._idle: dict[tuple[str, int, bool], list[PooledConnection]] = {}
        self._open: set[PooledConnection] = set()
        self._slots: asyncio.Semaphore | None = None
        self._tls: ssl.SSLContext | None = None
        self.connections_made = 0

    async def acquire(self, target: Target, connect_timeout: float) -> PooledConnection:
        """A connection to ``target`` ready for one request; waits for a slot when
        ``max_connections`` requests are in flight."""
        if self._slots is None:
            self._slots = asyncio.Semaphore(self.max_connections)
        await self._slots.acquire()
        try:
            idle = self._idle.get(target.key)
            while idle:
                conn = idle.pop()
                if not conn.lost and conn.transport is not None and not conn.transport.is_closing():
                    return conn
            return await self._connect(target, connect_timeout)
        except BaseException:
            self._slots.release()
            raise

    def done(self, conn: PooledConnection) -> None:
        """Give back the slot taken by ``acquire`` (the connection itself is released or
        closed by its ``release``)."""
        if self._slots is not None:
            self._slots.release()

    async def _connect(self, target: Target, connect_s: float) -> PooledConnection:
        if len(self._open) >= self.max_connections:
            self._close_one_idle()
        loop = asyncio.get_running_loop()
        tls: ssl.SSLContext | None = None
        if target.tls:
            if self._tls is None:
                self._tls = ssl.create_default_context()
            tls = self._tls
        try:
            async with asyncio.timeout(connect_s):
                _, conn = await loop.create_connection(
                    lambda: PooledConnection(self, target.key), target.host, target.port, ssl=tls,
                    server_hostname=target.host if tls else None,
                )  # fmt: skip
        except OSError as exc:
            raise HttpFault(type(exc).__name__) from exc
        self._open.add(conn)
        self.connections_made += 1
        return conn

    def _idle_put(self, conn: PooledConnection) -> None:
        self._idle.setdefault(conn.key, []).append(conn)

    def _close_one_idle(self) -> None:
        for conns in self._idle.values():
            if conns:
                conns.pop(0).close()
                return

    def _forget(self, conn: PooledConnection) -> None:
        self._open.discard(conn)
        idle = self._idle.get(conn.key)
        if idle and conn in idle:
            idle.remove(conn)

    async def close(self) -> None:
        for conn in list(self._open):
            conn.close()
        self._idle.clear()
        self._open.clear()
        await asyncio.sleep(0)  # let the transports run their close callbacks
