"""One HTTP/1.1 GET on asyncio streams, for the daemons' few requests of their own (nsqd asks
each nsqlookupd for a new topic's channels, as Go's ``GetTopic``): aiohttp's client, which
the tools and nsqadmin use, would cost an nsqd ~12 MiB and a 0.2 s import on its event loop
with its first topic (issue 31).

A fresh connection per request (``Connection: close``); the body by ``Content-Length``,
``chunked`` or up to the close; redirects are not followed.
"""

from __future__ import annotations

import asyncio

from .daemon import open_stream
from .protocol.address import split_address

__all__ = ["HTTPGetError", "http_get"]

#: the most of a response read (headers and body)
MAX_RESPONSE = 16 << 20


class HTTPGetError(ValueError):
    """The server's answer is not HTTP/1.x as expected."""


async def http_get(
    address: str, target: str, connect_timeout: float, timeout: float, user_agent: str = "nsqpy"
) -> tuple[int, bytes]:
    """GET ``target`` (path and query, already escaped) from ``host:port``: (status, body).

    Raises :class:`TimeoutError` past ``connect_timeout`` to connect or ``timeout`` in all,
    :class:`OSError` for the connection, :class:`HTTPGetError` for a malformed answer."""
    host, port = split_address(address)
    async with asyncio.timeout(timeout):
        reader, writer = await asyncio.wait_for(open_stream(host, port, limit=MAX_RESPONSE), connect_timeout)
        try:
            writer.write(
                f"GET {target} HTTP/1.1\r\nHost: {address}\r\nUser-Agent: {user_agent}\r\n"
                "Accept-Encoding: identity\r\nConnection: close\r\n\r\n".encode()
            )
            return await _read_response(reader)
        finally:
            writer.close()


async def _read_response(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    try:
        line = await reader.readuntil(b"\n")
        proto, _, rest = line.decode("latin-1").strip().partition(" ")
        code = rest.partition(" ")[0]
        if not proto.startswith("HTTP/1.") or len(code) != 3 or not code.isdigit():
            raise HTTPGetError(f"malformed status line {line[:100]!r}")
        headers: dict[str, str] = {}
        while True:
            line = await reader.readuntil(b"\n")
            text = line.decode("latin-1").strip()
            if not text:
                break
            name, colon, value = text.partition(":")
            if colon:
                headers[name.strip().lower()] = value.strip()
        if headers.get("transfer-encoding", "").lower() == "chunked":
            body = bytearray()
            while True:
                size_line = (await reader.readuntil(b"\n")).split(b";", 1)[0].strip()
                size = int(size_line, 16)
                if size == 0:
                    break
                if len(body) + size > MAX_RESPONSE:
                    raise HTTPGetError("response too large")
                body += await reader.readexactly(size)
                await reader.readuntil(b"\n")
            return int(code), bytes(body)
        length = headers.get("content-length")
        if length is not None:
            n = int(length)
            if not 0 <= n <= MAX_RESPONSE:
                raise HTTPGetError(f"bad Content-Length {length!r}")
            return int(code), await reader.readexactly(n)
        return int(code), await reader.read(MAX_RESPONSE)
    except (asyncio.LimitOverrunError, asyncio.IncompleteReadError) as e:
        raise HTTPGetError(f"truncated or oversized response ({e})") from None
    except ValueError as e:
        if isinstance(e, HTTPGetError):
            raise
        raise HTTPGetError(str(e)) from None
