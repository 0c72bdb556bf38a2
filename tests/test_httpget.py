"""nsqpy.httpget: the one GET nsqd makes of its own (a new topic's channels from each
nsqlookupd), against servers answering the ways Go's and ours do."""

from __future__ import annotations

import asyncio

import pytest

from nsqpy.httpget import HTTPGetError, http_get

pytestmark = pytest.mark.timeout(30)


async def serve_once(answer: bytes | None, seen: list[bytes]):
    """A server that reads one request and writes ``answer`` (None: never answers)."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(await reader.readuntil(b"\r\n\r\n"))
        if answer is None:
            await asyncio.sleep(10)
        else:
            writer.write(answer)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, f"127.0.0.1:{server.sockets[0].getsockname()[1]}"


@pytest.mark.parametrize(
    "answer",
    [
        b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 18\r\n\r\n{"channels":["a"]}',
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        b'5\r\n{"cha\r\nd;x=1\r\nnnels":["a"]}\r\n0\r\n\r\n',
        b'HTTP/1.0 200 OK\r\n\r\n{"channels":["a"]}',
    ],
    ids=["content-length", "chunked", "until-close"],
)
async def test_bodies_however_they_are_framed(answer):
    seen: list[bytes] = []
    server, addr = await serve_once(answer, seen)
    async with server:
        status, body = await http_get(addr, "/channels?topic=t%23ephemeral", 1.0, 5.0, "nsqd/1.3.0")
    assert (status, body) == (200, b'{"channels":["a"]}')
    assert seen[0].startswith(b"GET /channels?topic=t%23ephemeral HTTP/1.1\r\nHost: " + addr.encode())
    assert b"\r\nUser-Agent: nsqd/1.3.0\r\n" in seen[0] and b"\r\nConnection: close\r\n" in seen[0]


async def test_an_error_status_is_returned():
    server, addr = await serve_once(b"HTTP/1.1 404 Not Found\r\nContent-Length: 2\r\n\r\n{}", [])
    async with server:
        assert await http_get(addr, "/channels?topic=t", 1.0, 5.0) == (404, b"{}")


@pytest.mark.parametrize(
    "answer",
    [
        b"SSH-2.0-OpenSSH\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort",
        b"HTTP/1.1 200 OK\r\n",
    ],
    ids=["not-http", "truncated-body", "truncated-head"],
)
async def test_a_malformed_answer_is_an_error(answer):
    server, addr = await serve_once(answer, [])
    async with server:
        with pytest.raises(HTTPGetError):
            await http_get(addr, "/", 1.0, 5.0)


async def test_timeouts_and_refusals():
    server, addr = await serve_once(None, [])
    async with server:
        with pytest.raises(TimeoutError):
            await http_get(addr, "/", 1.0, 0.2)
    with pytest.raises(OSError):
        await http_get(addr, "/", 1.0, 5.0)  # closed now
