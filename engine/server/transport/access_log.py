"""The access log, with no secret in it (SPEC: AUTH-12).

aiohttp's default line holds the request's whole target and its Referer, query strings
included: a key a client put in a URL (``?key=``, ``?api_key=``) would sit in every log that
collects these lines. This one logs the path only, and a Referer without its query; the
Authorization header and cookies were never logged and are not now.
"""

from __future__ import annotations

import logging

from aiohttp.abc import AbstractAccessLogger
from aiohttp.web_request import BaseRequest
from aiohttp.web_response import StreamResponse


def without_query(url: str) -> str:
    """``url`` up to its query string or fragment, whichever comes first."""
    for mark in ("?", "#"):
        url = url.split(mark, 1)[0]
    return url


class RedactingAccessLogger(AbstractAccessLogger):
    """``remote "METHOD /path HTTP/x.y" status bytes "referer" "user-agent" seconds``."""

    @property
    def enabled(self) -> bool:
        """aiohttp asks once per connection: below INFO (``--log-level WARNING``) no request's
        line is built, as aiohttp's own logger does (the abstract one answers True)."""
        return self.logger.isEnabledFor(logging.INFO)

    def log(self, request: BaseRequest, response: StreamResponse, time: float) -> None:
        version = request.version
        line = f"{request.method} {request.path} HTTP/{version.major}.{version.minor}"
        referer = without_query(request.headers.get("Referer", "-"))
        agent = request.headers.get("User-Agent", "-")
        self.logger.info(
            '%s "%s" %s %s "%s" "%s" %.6f',
            request.remote or "-",
            line,
            response.status,
            response.body_length,
            referer,
            agent,
            time,
        )
