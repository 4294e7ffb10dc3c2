"""One pooled aiohttp client session shared by every upstream backend.

Created lazily on first use (it must be created inside the running event loop, and the CLI
builds its routes before the loop starts); closed by the engine on shutdown through
``Router.aclose``.
"""

from __future__ import annotations

import aiohttp


class HttpPool:
    def __init__(self, max_connections: int = 256, max_per_host: int = 0) -> None:
        self.max_connections = max_connections
        self.max_per_host = max_per_host
        self._session: aiohttp.ClientSession | None = None

    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(
                limit=self.max_connections, limit_per_host=self.max_per_host
            )
            # trust_env=False: a proxy or .netrc from the environment must not silently
            # reroute (or add credentials to) traffic to a loopback model server. No cookie jar:
            # a cookie one tenant's request received must not ride on another's (and no jar is
            # filtered per request).
            self._session = aiohttp.ClientSession(
                connector=connector, trust_env=False, raise_for_status=False,
                cookie_jar=aiohttp.DummyCookieJar(),
            )  # fmt: skip
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
