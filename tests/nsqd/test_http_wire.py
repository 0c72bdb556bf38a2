"""nsqd's HTTP answers byte for byte (``Date`` aside), as the Go nsqd 1.3.0 sends them: the
status line, which headers in which order, Content-Length or chunked, keep-alive or close,
and the plain-text refusals of requests Go's ``net/http`` cannot parse. Every expected answer
below was recorded from the Go binary on raw sockets (nsqpy.httpserver's issue 31)."""

# ruff: noqa: E501  (each request and answer reads best as one line of raw bytes)

from __future__ import annotations

import asyncio
import re

import pytest
from conftest import make_options

from nsqpy.httpserver import canonical_key, sniff
from nsqpy.nsqd.nsqd import NSQD

pytestmark = pytest.mark.timeout(30)

OPEN = b"<open>"  # the connection stayed open after the answer
DATE = re.compile(rb"Date: [A-Z][a-z]{2}, \d\d [A-Z][a-z]{2} \d{4} \d\d:\d\d:\d\d GMT\r\n")

PING = b"HTTP/1.1 200 OK\r\nDate: D\r\nContent-Length: 2\r\nContent-Type: text/plain; charset=utf-8\r\n\r\nOK"
V1_JSON = b"Content-Type: application/json; charset=utf-8\r\nX-Nsq-Content-Type: nsq; version=1.0\r\n"
PUB_OK = (
    b"HTTP/1.1 200 OK\r\nX-Nsq-Content-Type: nsq; version=1.0\r\nDate: D\r\nContent-Length: 2\r\n"
    b"Content-Type: text/plain; charset=utf-8\r\n\r\nOK"
)
NOT_ALLOWED = (
    b"HTTP/1.1 405 Method Not Allowed\r\nAllow: GET, OPTIONS\r\n"
    + V1_JSON
    + b"Date: D\r\nContent-Length: 32\r\n\r\n"
)
BAD = b"HTTP/1.1 400 Bad Request\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n400 Bad Request"


def refusal(status_text: bytes) -> bytes:
    return (
        b"HTTP/1.1 " + status_text + b"\r\nContent-Type: text/plain; charset=utf-8\r\n"
        b"Connection: close\r\n\r\n" + status_text
    )


CASES = [
    (b"GET /ping HTTP/1.1\r\nHost: x\r\n\r\n", PING + OPEN),
    (
        b"GET /ping HTTP/1.0\r\n\r\n",
        b"HTTP/1.0 200 OK\r\nDate: D\r\nContent-Length: 2\r\nContent-Type: text/plain; charset=utf-8\r\n\r\nOK",
    ),
    (
        b"GET /ping HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
        b"HTTP/1.0 200 OK\r\nDate: D\r\nContent-Length: 2\r\nContent-Type: text/plain; charset=utf-8\r\n"
        b"Connection: keep-alive\r\n\r\nOK" + OPEN,
    ),
    (
        b"GET /ping HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nDate: D\r\nContent-Length: 2\r\nContent-Type: text/plain; charset=utf-8\r\n"
        b"Connection: close\r\n\r\nOK",
    ),
    (b"GET /ping HTTP/1.1\nHost: x\n\n", PING + OPEN),
    (b"GET /p%69ng HTTP/1.1\r\nHost: x\r\n\r\n", PING + OPEN),
    (b"GET http://x/ping HTTP/1.1\r\nHost: x\r\n\r\n", PING + OPEN),
    (b"GET /ping HTTP/1.2\r\nHost: x\r\n\r\n", PING + OPEN),
    (b"HEAD /ping HTTP/1.1\r\nHost: x\r\n\r\n", NOT_ALLOWED + OPEN),
    (
        b"POST /ping HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
        NOT_ALLOWED + b'{"message":"METHOD_NOT_ALLOWED"}' + OPEN,
    ),
    (
        b"GET /nope HTTP/1.1\r\nHost: x\r\n\r\n",
        b"HTTP/1.1 404 Not Found\r\n"
        + V1_JSON
        + b'Date: D\r\nContent-Length: 23\r\n\r\n{"message":"NOT_FOUND"}'
        + OPEN,
    ),
    (
        b"HEAD /nope HTTP/1.1\r\nHost: x\r\n\r\n",
        b"HTTP/1.1 404 Not Found\r\n" + V1_JSON + b"Date: D\r\nContent-Length: 23\r\n\r\n" + OPEN,
    ),
    (
        b"OPTIONS /ping HTTP/1.1\r\nHost: x\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nAllow: GET, OPTIONS\r\nDate: D\r\nContent-Length: 0\r\n\r\n" + OPEN,
    ),
    (
        b"GET * HTTP/1.1\r\nHost: x\r\n\r\n",
        b"HTTP/1.1 405 Method Not Allowed\r\nAllow: GET, OPTIONS, POST, PUT\r\n"
        + V1_JSON
        + b'Date: D\r\nContent-Length: 32\r\n\r\n{"message":"METHOD_NOT_ALLOWED"}'
        + OPEN,
    ),
    (
        b"GET /Ping HTTP/1.1\r\nHost: x\r\n\r\n",
        b"HTTP/1.1 301 Moved Permanently\r\nContent-Type: text/html; charset=utf-8\r\nLocation: /ping\r\n"
        b'Date: D\r\nContent-Length: 40\r\n\r\n<a href="/ping">Moved Permanently</a>.\n\n' + OPEN,
    ),
    (
        b"GET //ping HTTP/1.1\r\nHost: x\r\n\r\n",
        b"HTTP/1.1 301 Moved Permanently\r\nContent-Type: text/html; charset=utf-8\r\nLocation: /ping\r\n"
        b'Date: D\r\nContent-Length: 40\r\n\r\n<a href="/ping">Moved Permanently</a>.\n\n' + OPEN,
    ),
    (
        b"GET /ping/?a=1 HTTP/1.1\r\nHost: x\r\n\r\n",
        b"HTTP/1.1 301 Moved Permanently\r\nContent-Type: text/html; charset=utf-8\r\nLocation: /ping?a=1\r\n"
        b'Date: D\r\nContent-Length: 44\r\n\r\n<a href="/ping?a=1">Moved Permanently</a>.\n\n' + OPEN,
    ),
    (
        b"POST /Pub?topic=t HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 307 Temporary Redirect\r\nLocation: /pub?topic=t\r\nDate: D\r\nContent-Length: 0\r\n\r\n"
        + OPEN,
    ),
    (b"POST /pub?topic=t HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello", PUB_OK + OPEN),
    (
        b"POST /pub?topic=t HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhel\r\n0\r\nT: x\r\n\r\n",
        b"HTTP/1.1 500 Internal Server Error\r\n"
        + V1_JSON
        + b'Date: D\r\nContent-Length: 28\r\nConnection: close\r\n\r\n{"message":"INTERNAL_ERROR"}',
    ),
    (
        b"POST /pub?topic=t HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n5;ext=1\r\nhello\r\n0\r\nT: x\r\n\r\n",
        PUB_OK + OPEN,
    ),
    (
        b"POST /pub?topic=t HTTP/1.1\r\nHost: x\r\n\r\n",
        b"HTTP/1.1 400 Bad Request\r\n"
        + V1_JSON
        + b'Date: D\r\nContent-Length: 23\r\n\r\n{"message":"MSG_EMPTY"}'
        + OPEN,
    ),
    (
        b"POST /topic/create?topic=a HTTP/1.1\r\nHost: x\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nX-Nsq-Content-Type: nsq; version=1.0\r\nDate: D\r\nContent-Length: 0\r\n\r\n"
        + OPEN,
    ),
    (
        b"POST /pub?topic=t HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n",
        b"HTTP/1.1 100 Continue\r\n\r\n" + OPEN,
    ),
    (b"GET /ping HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\n\r\n", PING + OPEN),
    (
        b"GET /ping HTTP/1.1\r\nHost: x\r\nExpect: foo\r\n\r\n",
        b"HTTP/1.1 417 Expectation Failed\r\nConnection: close\r\nDate: D\r\nContent-Length: 0\r\n\r\n",
    ),
    # a body the handler does not read: discarded (keep-alive), the next request answered
    (
        b"GET /ping HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\n\r\nabcGET /ping HTTP/1.1\r\nHost: x\r\n\r\n",
        PING + PING + OPEN,
    ),
    (
        b"GET /ping HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"HTTP/1.1 200 OK\r\nDate: D\r\nContent-Length: 2\r\nContent-Type: text/plain; charset=utf-8\r\n"
        b"Connection: close\r\n\r\nOK",
    ),
    (b"GET /ping HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\nabc", PING + OPEN),
    (
        b"GET /ping HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
        PING + OPEN,
    ),
    (
        b"POST /topic/create?topic=zz HTTP/1.1\r\nHost: x\r\nContent-Length: 300000\r\n\r\nabc",
        b"HTTP/1.1 200 OK\r\nX-Nsq-Content-Type: nsq; version=1.0\r\nDate: D\r\nContent-Length: 0\r\n"
        b"Connection: close\r\n\r\n",
    ),
    # refusals before any handler
    (b"GARBAGE\r\n\r\n", BAD),
    (b"GET /ping  HTTP/1.1\r\nHost: x\r\n\r\n", BAD),
    (b"GET ping HTTP/1.1\r\nHost: x\r\n\r\n", BAD),
    (b"GET /pi%zzng HTTP/1.1\r\nHost: x\r\n\r\n", BAD),
    (b"GET /ping HTTP/1.10\r\nHost: x\r\n\r\n", BAD),
    (b"GET /ping HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n", BAD),
    (b"GET /ping HTTP/1.1\r\nHost: x\r\nContent-Length: +3\r\n\r\nabc", BAD),
    (b"GET /ping HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", BAD),
    (b"GET /ping HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n", BAD),
    (b"GET /ping HTTP/1.1\r\nHost: x\r\nHost: y\r\n\r\n", BAD),
    (b"GET /ping HTTP/1.1\r\n\r\n", refusal(b"400 Bad Request: missing required Host header")),
    (b"GET /ping HTTP/1.1\r\nHost: x\r\n folded\r\n\r\n", refusal(b"400 Bad Request: malformed Host header")),
    (b"GET /ping HTTP/1.1\r\nHost: x\r\nX : y\r\n\r\n", refusal(b"400 Bad Request: invalid header name")),
    (
        b"GET /ping HTTP/1.1\r\nHost: x\r\nX: a\x00b\r\n\r\n",
        refusal(b"400 Bad Request: invalid header value"),
    ),
    (
        b"GET /ping HTTP/2.0\r\nHost: x\r\n\r\n",
        refusal(b"505 HTTP Version Not Supported: unsupported protocol version"),
    ),
    (
        b"GET /ping HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip\r\n\r\n",
        b"HTTP/1.1 501 Not Implemented\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n"
        b"Unsupported transfer encoding",
    ),
    (
        b"GET /ping HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked, chunked\r\n\r\n0\r\n\r\n",
        b"HTTP/1.1 501 Not Implemented\r\nContent-Type: text/plain; charset=utf-8\r\nConnection: close\r\n\r\n"
        b"Unsupported transfer encoding",
    ),
]


async def exchange(port: int, request: bytes, quiet: float = 0.3) -> bytes:
    """Send ``request``, read until the server closes or stays quiet; ``Date`` masked."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    out = b""
    try:
        while True:
            chunk = await asyncio.wait_for(reader.read(65536), quiet)
            if not chunk:
                break
            out += chunk
    except TimeoutError:
        out += OPEN
    except ConnectionResetError:
        pass
    writer.close()
    return DATE.sub(b"Date: D\r\n", out)


@pytest.fixture
async def port(tmp_path):
    async with NSQD(make_options(tmp_path)) as nsqd:
        yield nsqd.http_port


@pytest.mark.parametrize(("request_bytes", "expected"), CASES, ids=[repr(c[0][:40]) for c in CASES])
async def test_answers_as_the_go_nsqd(port, request_bytes, expected):
    assert await exchange(port, request_bytes) == expected


async def test_a_body_past_2048_bytes_is_chunked_and_http_1_0_gets_it_until_close(port):
    for i in range(40):
        await exchange(port, b"POST /topic/create?topic=topic_number_%d HTTP/1.1\r\nHost: x\r\n\r\n" % i)
    got = await exchange(port, b"GET /stats?format=json HTTP/1.1\r\nHost: x\r\n\r\n")
    head, _, body = got.partition(b"\r\n\r\n")
    assert head == b"HTTP/1.1 200 OK\r\n" + V1_JSON + b"Date: D\r\nTransfer-Encoding: chunked"
    size, _, rest = body.partition(b"\r\n")
    assert int(size, 16) > 2048 and rest.endswith(b"\r\n0\r\n\r\n" + OPEN)
    assert len(rest) == int(size, 16) + len(b"\r\n0\r\n\r\n" + OPEN)
    got = await exchange(port, b"GET /stats?format=json HTTP/1.0\r\n\r\n")
    head, _, body = got.partition(b"\r\n\r\n")
    assert head == b"HTTP/1.0 200 OK\r\n" + V1_JSON + b"Date: D"
    assert body.startswith(b'{"version":"1.3.0"') and body.endswith(b"}")


async def test_request_headers_up_to_1_mib_and_4_kib(port):
    header = b"GET /ping HTTP/1.1\r\nHost: x\r\nX: %s\r\n\r\n"
    assert await exchange(port, header % (b"a" * (1 << 20)), quiet=2) == PING + OPEN
    got = await exchange(port, header % (b"a" * ((1 << 20) + 8192)), quiet=2)
    assert got == refusal(b"431 Request Header Fields Too Large")


async def test_the_deferred_100_continue_then_the_answer(port):
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(
        b"POST /pub?topic=t HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 5\r\n\r\n"
    )
    assert await reader.readuntil(b"\r\n\r\n") == b"HTTP/1.1 100 Continue\r\n\r\n"
    writer.write(b"hello")
    head = await reader.readuntil(b"\r\n\r\n")
    assert DATE.sub(b"Date: D\r\n", head + await reader.readexactly(2)) == PUB_OK
    writer.close()


def test_header_names_and_sniffing_as_go():
    assert canonical_key("x-nsq-content-type") == "X-Nsq-Content-Type"
    assert canonical_key("WWW-Authenticate") == "Www-Authenticate"
    assert sniff(b"OK") == "text/plain; charset=utf-8"
    assert sniff(b'{"a":1}') == "text/plain; charset=utf-8"
    assert sniff(b"  <html><body>") == "text/html; charset=utf-8"
    assert sniff(b"a\x00b") == "application/octet-stream"
