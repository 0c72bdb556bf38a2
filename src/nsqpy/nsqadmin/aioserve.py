"""nsqadmin's HTTP server on aiohttp (its pages, cookies and compression need it; nsqd and
nsqlookupd answer on :mod:`nsqpy.httpserver`): the catch-all route, the deferred ``100
Continue`` and the bridge from :class:`nsqpy.httpapi.Router`'s responses to aiohttp's."""

from __future__ import annotations

import socket
import ssl
from collections.abc import Awaitable, Callable

from aiohttp import web

from ..daemon import LISTEN_BACKLOG
from ..httpserver import Response, sniff

__all__ = ["continue_100", "expect_handler", "read_max", "serve", "to_aiohttp"]


def to_aiohttp(resp: Response | web.StreamResponse) -> web.StreamResponse:
    """An :class:`nsqpy.httpserver.Response` as aiohttp's (a text body without a type gets
    the one Go would sniff)."""
    if isinstance(resp, web.StreamResponse):
        return resp
    headers = dict(resp.headers)
    if resp.body and not any(k.lower() == "content-type" for k in headers):
        headers["Content-Type"] = sniff(resp.body)
    return web.Response(status=resp.status, body=resp.body, headers=headers)


async def expect_handler(request: web.Request) -> None:
    """Accept ``Expect: 100-continue`` but send the ``100 Continue`` only when the handler
    reads the body (as Go's server does), so an early 413 saves the upload."""
    expect = request.headers.get("Expect", "")
    if request.version >= (1, 1) and expect.lower() != "100-continue":
        raise web.HTTPExpectationFailed(text=f"Unknown Expect: {expect}")


_CONTINUED = web.RequestKey("nsq.continued", bool)


async def continue_100(request: web.Request) -> None:
    """Send the deferred ``100 Continue`` (once) before reading a body."""
    if (
        request.version >= (1, 1)
        and _CONTINUED not in request
        and request.headers.get("Expect", "").lower() == "100-continue"
    ):
        request[_CONTINUED] = True
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        request.writer.output_size = 0


async def read_max(request: web.Request, limit: int) -> bytes:
    """Read the body, stopping after ``limit`` bytes (Go's ``io.LimitReader``)."""
    await continue_100(request)
    content = request.content
    chunks: list[bytes] = []
    n = 0
    while n < limit:
        chunk = await content.read(limit - n)
        if not chunk:
            break
        chunks.append(chunk)
        n += len(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


async def serve(
    dispatch: Callable[[web.Request], Awaitable[web.StreamResponse]],
    sock: socket.socket,
    ssl_context: ssl.SSLContext | None = None,
) -> web.AppRunner:
    """Serve every path and method through ``dispatch`` on an already-bound socket (HTTPS
    with ``ssl_context``)."""
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", dispatch, expect_handler=expect_handler)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=2.0)
    await runner.setup()
    await web.SockSite(runner, sock, ssl_context=ssl_context, backlog=LISTEN_BACKLOG).start()
    return runner
