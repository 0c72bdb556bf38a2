"""A small HTTP/1.1 server on asyncio Protocols for nsqd's and nsqlookupd's few routes,
answering as Go's ``net/http`` server does (NSQ's daemons run on it).

aiohttp's server pulls in its client side and their dependencies (~15 MiB of an nsqd's
memory, issue 31); this is the part of ``net/http`` the daemons use, byte for byte:

- request parsing: the request line, ``HTTP/1.x`` (505 for others), headers (1 MiB + 4 KiB
  at most: 431), ``Host`` required by HTTP/1.1, ``Content-Length`` or ``chunked`` bodies
  (501 for any other transfer coding), ``Expect: 100-continue`` answered when the handler
  reads the body (417 for other expectations); a malformed request gets Go's plain-text
  ``400 Bad Request`` and the connection is closed;
- responses: the handler's headers sorted by canonical name, then ``Date``,
  ``Content-Length``, a sniffed ``Content-Type`` (when the handler set none),
  ``Connection: close`` and, past 2048 bytes of body, ``Transfer-Encoding: chunked``
  (HTTP/1.0: no length, the connection closes) — Go's chunkWriter;
- keep-alive (HTTP/1.1 unless ``Connection: close``; HTTP/1.0 with ``Connection:
  keep-alive``), pipelining, an unread body up to 256 KiB discarded to keep the connection,
  HEAD without a body; TLS (the HTTPS listener) and unix sockets through asyncio.

nsqadmin stays on aiohttp (:mod:`nsqpy.nsqadmin.aioserve`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from .daemon import LISTEN_BACKLOG

if TYPE_CHECKING:
    import ssl

__all__ = ["BodyError", "HTTPServer", "Headers", "Request", "Response", "canonical_key", "serve", "sniff"]

log = logging.getLogger("nsqpy.http")

#: Go's ``http.DefaultMaxHeaderBytes`` plus the 4096 bytes of slack its server allows
MAX_HEADER_BYTES = (1 << 20) + 4096
#: Go's ``maxPostHandlerReadBytes``: an unread body up to this is discarded, not a close
MAX_POST_HANDLER_READ = 256 << 10
#: Go's ``bufferBeforeChunkingSize``: a larger body goes out chunked (no Content-Length)
CHUNKING_SIZE = 2048
#: pause reading a connection while this much unread input is buffered
_HIGH_WATER = MAX_HEADER_BYTES + (64 << 10)

#: Go's ``http.StatusText``
STATUS_TEXT = {
    100: "Continue",
    101: "Switching Protocols",
    200: "OK",
    201: "Created",
    202: "Accepted",
    204: "No Content",
    206: "Partial Content",
    301: "Moved Permanently",
    302: "Found",
    303: "See Other",
    304: "Not Modified",
    307: "Temporary Redirect",
    308: "Permanent Redirect",
    400: "Bad Request",
    401: "Unauthorized",
    403: "Forbidden",
    404: "Not Found",
    405: "Method Not Allowed",
    406: "Not Acceptable",
    408: "Request Timeout",
    409: "Conflict",
    410: "Gone",
    411: "Length Required",
    412: "Precondition Failed",
    413: "Request Entity Too Large",
    414: "Request URI Too Long",
    415: "Unsupported Media Type",
    417: "Expectation Failed",
    422: "Unprocessable Entity",
    429: "Too Many Requests",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    501: "Not Implemented",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Gateway Timeout",
    505: "HTTP Version Not Supported",
}

_TOKEN = frozenset(b"!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
_HOST_BYTES = frozenset(b"!$%&'()*+,-.:;=[]_~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
_HEX = frozenset(b"0123456789abcdefABCDEF")
_DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


class BodyError(Exception):
    """The request body broke off or its chunked framing was malformed."""


class _BadRequest(Exception):
    """A request Go's server refuses before any handler: the status and its text."""

    def __init__(self, status: int = 400, text: str = "") -> None:
        super().__init__(text)
        self.status = status
        self.text = text


def canonical_key(name: str) -> str:
    """Go's ``textproto.CanonicalMIMEHeaderKey``: ``x-nsq-content-type`` → ``X-Nsq-Content-Type``."""
    return "-".join(p[:1].upper() + p[1:].lower() for p in name.split("-"))


def sniff(body: bytes) -> str:
    """The ``Content-Type`` Go's ``DetectContentType`` picks for the bodies the daemons send
    without one: HTML, binary, else UTF-8 text."""
    head = body[:512].lstrip(b"\t\n\x0c\r ")
    low = head[:14].lower()
    if low.startswith((b"<!doctype html", b"<html", b"<head", b"<body", b"<a ", b"<a>", b"<p>", b"<br")):
        return "text/html; charset=utf-8"
    if any(b <= 0x08 or b == 0x0B or 0x0E <= b <= 0x1A or 0x1C <= b <= 0x1F for b in body[:512]):
        return "application/octet-stream"
    return "text/plain; charset=utf-8"


_date_cache: tuple[int, str] = (0, "")


def http_date() -> str:
    """``Date`` in Go's ``TimeFormat`` (``Mon, 02 Jan 2006 15:04:05 GMT``), once a second."""
    global _date_cache
    now = int(time.time())
    if _date_cache[0] != now:
        t = time.gmtime(now)
        text = (
            f"{_DAYS[t.tm_wday]}, {t.tm_mday:02d} {_MONTHS[t.tm_mon - 1]} {t.tm_year} "
            f"{t.tm_hour:02d}:{t.tm_min:02d}:{t.tm_sec:02d} GMT"
        )
        _date_cache = (now, text)
    return _date_cache[1]


class Headers(dict[str, str]):
    """Request headers by lower-case name (the first value of a repeated one); lookups
    ignore case, as aiohttp's and Go's do."""

    def get(self, key: str, default: Any = None) -> Any:
        return super().get(key.lower(), default)

    def __getitem__(self, key: str) -> str:
        return super().__getitem__(key.lower())

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and super().__contains__(key.lower())


class Response:
    """A whole response: status, body and the handler's headers (Go's ``Header()`` map)."""

    __slots__ = ("body", "headers", "status")

    def __init__(self, status: int = 200, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
        self.status = status
        self.body = body
        self.headers = headers if headers is not None else {}


class Request:
    """One request, with the names of aiohttp's ``web.Request`` that the daemons use."""

    __slots__ = (
        "_conn",
        "_continue",
        "content_length",
        "headers",
        "keep_alive_10",
        "method",
        "path",
        "raw_path",
        "raw_query_string",
        "remote",
        "secure",
        "transport",
        "version",
        "wants_close",
    )

    def __init__(self, conn: _Connection, method: str, target: str, version: tuple[int, int]) -> None:
        self._conn = conn
        self.method = method
        self.raw_path = target
        self.version = version
        self.headers = Headers()
        self.transport = conn.transport
        self.remote = conn.remote
        self.secure = conn.server.ssl_context is not None
        self.content_length: int | None = 0
        #: ``Expect: 100-continue`` not answered yet
        self._continue = False
        self.wants_close = False
        self.keep_alive_10 = False
        path, _, query = target.partition("?")
        self.raw_query_string = query
        self.path = path

    @property
    def content_type(self) -> str:
        """The media type of the body (aiohttp's default when none is given)."""
        ct = self.headers.get("Content-Type", "")
        return ct.split(";", 1)[0].strip().lower() or "application/octet-stream"

    async def read(self, limit: int) -> bytes:
        """Up to ``limit`` bytes of the body (Go's ``io.LimitReader``); the deferred ``100
        Continue`` goes out first. Raises :class:`BodyError` on a broken body."""
        conn = self._conn
        if self._continue:
            self._continue = False
            conn.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        return await conn.read_body(limit)


Dispatch = Callable[[Request], Awaitable[Response]]


class _Connection(asyncio.Protocol):
    """One client connection: parse a request, run the handler, answer, repeat."""

    def __init__(self, server: HTTPServer) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.remote = ""
        self.buf = bytearray()
        self.closed = False
        self.eof = False
        self.paused = False
        self.task: asyncio.Task[None] | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._drained: asyncio.Future[None] | None = None
        # the body being read: bytes left of a Content-Length body, or -1 for chunked
        self.body_left = 0
        self.chunk_left = 0  # chunked: bytes left of the current chunk (-1: at a size line)
        self.body_error = False

    # --- asyncio.Protocol ---------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]  # (uvloop's are not subclasses)
        peer = transport.get_extra_info("peername")
        self.remote = str(peer[0]) if isinstance(peer, (list, tuple)) else str(peer or "")
        self.server.connections.add(self)

    def data_received(self, data: bytes) -> None:
        self.buf += data
        if self._waiter is not None:
            self._wake()
        elif self.task is None:
            self._next_request()
        if len(self.buf) > _HIGH_WATER and not self.paused and self.transport is not None:
            self.paused = True
            self.transport.pause_reading()

    def eof_received(self) -> bool:
        self.eof = True
        self._wake()
        # nothing more to answer: close (False); else answer first
        return self.task is not None or bool(self.buf)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.server.connections.discard(self)
        self._wake()
        self.resume_writing()

    def pause_writing(self) -> None:
        """The client does not read its answers: read no more requests until it does."""
        if self._drained is None:
            self._drained = asyncio.get_running_loop().create_future()

    def resume_writing(self) -> None:
        d = self._drained
        if d is not None:
            self._drained = None
            if not d.done():
                d.set_result(None)

    # --- I/O helpers --------------------------------------------------------------------------

    def write(self, data: bytes) -> None:
        if not self.closed and self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def _wake(self) -> None:
        w = self._waiter
        if w is not None:
            self._waiter = None
            if not w.done():
                w.set_result(None)

    async def _more(self) -> None:
        """Wait for more input (or the end of it)."""
        if self.closed or self.eof:
            raise BodyError("unexpected EOF")
        if self.paused and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()
        self._waiter = asyncio.get_running_loop().create_future()
        await self._waiter

    def _consumed(self, n: int) -> None:
        del self.buf[:n]
        if self.paused and len(self.buf) < _HIGH_WATER // 2 and self.transport is not None:
            self.paused = False
            self.transport.resume_reading()

    # --- bodies -------------------------------------------------------------------------------

    def body_done(self) -> bool:
        return self.body_left == 0

    async def read_body(self, limit: int) -> bytes:
        """Up to ``limit`` bytes of the current request's body."""
        out = bytearray()
        while len(out) < limit and self.body_left != 0:
            if self.body_error:
                raise BodyError("malformed chunked encoding")
            if self.body_left > 0:
                n = min(self.body_left, len(self.buf), limit - len(out))
                if n:
                    out += self.buf[:n]
                    self._consumed(n)
                    self.body_left -= n
                    continue
            elif self._chunked_step(out, limit):
                continue
            try:
                await self._more()
            except BodyError:
                self.body_error = True
                raise
        return bytes(out)

    def _chunked_step(self, out: bytearray, limit: int) -> bool:
        """Decode what the buffer holds of a chunked body into ``out``; False when more
        input is needed."""
        buf = self.buf
        if self.chunk_left > 0:
            n = min(self.chunk_left, len(buf), limit - len(out))
            if not n:
                return False
            out += buf[:n]
            self._consumed(n)
            self.chunk_left -= n
            if self.chunk_left == 0:
                self.chunk_left = -2  # the CRLF after the data
            return True
        if self.chunk_left == -2:  # Go's chunkedReader wants exactly CRLF after the data
            if len(buf) < 2:
                if buf and buf[0] != 13:  # anything but the CR
                    self._fail_body()
                    return True
                return False
            if buf[:2] != b"\r\n":
                self._fail_body()
                return True
            self._consumed(2)
            self.chunk_left = -1
            return True
        end = buf.find(b"\n")
        if end < 0:
            if len(buf) > 4096:
                self._fail_body()
                return True
            return False
        line = bytes(buf[:end]).rstrip(b"\r")
        if self.chunk_left == -3:  # trailers, up to an empty line
            self._consumed(end + 1)
            if not line:
                self.body_left = 0
            return True
        size_text = line.split(b";", 1)[0].strip()
        if not size_text or not all(c in _HEX for c in size_text) or len(size_text) > 16:
            self._fail_body()
            return True
        self._consumed(end + 1)
        size = int(size_text, 16)
        self.chunk_left = size if size else -3
        return True

    def _fail_body(self) -> None:
        self.body_error = True

    async def discard_body(self, limit: int) -> bool:
        """Read and drop up to ``limit`` bytes of what is left of the body: True if it ended
        within them."""
        try:
            while self.body_left != 0 and limit > 0:
                got = await self.read_body(min(limit, 65536))
                if not got and self.body_left != 0:
                    return False
                limit -= len(got)
        except BodyError:
            return False
        return self.body_left == 0

    # --- requests -----------------------------------------------------------------------------

    def _header_end(self) -> int:
        """Where the header block ends (the index after its empty line), or -1."""
        buf = self.buf
        pos = 0
        while True:
            nl = buf.find(b"\n", pos)
            if nl < 0:
                return -1
            nxt = buf.find(b"\n", nl + 1)
            if nxt < 0:
                return -1
            if nxt == nl + 1 or (nxt == nl + 2 and buf[nl + 1] == 13):
                return nxt + 1
            pos = nl + 1

    def _next_request(self) -> None:
        if self.closed or self.task is not None:
            return
        end = self._header_end()
        if end < 0:
            if len(self.buf) > MAX_HEADER_BYTES:
                self._refuse(_BadRequest(431))
            elif self.eof:
                self.close()
            return
        if end > MAX_HEADER_BYTES:
            self._refuse(_BadRequest(431))
            return
        head = bytes(self.buf[:end])
        self._consumed(end)
        try:
            request = self._parse(head)
        except _Expectation:
            self.write(
                f"HTTP/1.1 417 Expectation Failed\r\nConnection: close\r\nDate: {http_date()}\r\n"
                "Content-Length: 0\r\n\r\n".encode()
            )
            self.close()
            return
        except _BadRequest as e:
            self._refuse(e)
            return
        except UnicodeDecodeError:
            self._refuse(_BadRequest())
            return
        self.task = asyncio.get_running_loop().create_task(self._serve(request))

    def _refuse(self, e: _BadRequest) -> None:
        """Go's answer to a request it cannot parse, then close."""
        if e.status == 501:
            text = "Unsupported transfer encoding"
            status_line = "501 Not Implemented"
        elif e.status == 431:
            text = status_line = "431 Request Header Fields Too Large"
        else:
            text = status_line = f"{e.status} {STATUS_TEXT[e.status]}" + (f": {e.text}" if e.text else "")
        self.write(
            f"HTTP/1.1 {status_line}\r\nContent-Type: text/plain; charset=utf-8\r\n"
            f"Connection: close\r\n\r\n{text}".encode()
        )
        self.close()

    def _parse(self, head: bytes) -> Request:
        lines = head.decode("latin-1").split("\n")
        first = lines[0].removesuffix("\r")
        method, sp1, rest = first.partition(" ")
        target, sp2, proto = rest.partition(" ")
        if not sp1 or not sp2 or not method or not all(ord(c) in _TOKEN for c in method):
            raise _BadRequest()
        if proto == "HTTP/1.1":
            version = (1, 1)
        elif proto == "HTTP/1.0":
            version = (1, 0)
        elif (
            len(proto) == 8
            and proto.startswith("HTTP/")
            and proto[5].isdigit()
            and proto[6] == "."
            and proto[7].isdigit()
            and proto.isascii()
        ):
            version = (int(proto[5]), int(proto[7]))
        else:
            raise _BadRequest()
        request = Request(self, method, target, version)
        request.path = _unescape_path(_request_path(target))
        headers = request.headers
        last = ""
        hosts = 0
        lengths: list[str] = []
        encodings: list[str] = []
        for raw in lines[1:]:
            line = raw.removesuffix("\r")
            if not line:
                break
            if line[0] in " \t":  # obsolete line folding: part of the previous value
                if not last:
                    raise _BadRequest()
                folded = line.strip(" \t")
                headers[last] = f"{headers[last]} {folded}".strip()
                continue
            name, colon, value = line.partition(":")
            if not colon:
                raise _BadRequest()
            if not name or not all(ord(c) in _TOKEN for c in name):
                raise _BadRequest(400, "invalid header name")
            value = value.strip(" \t")
            if any((ord(c) < 32 and c != "\t") or ord(c) == 127 for c in value):
                raise _BadRequest(400, "invalid header value")
            key = name.lower()
            if key == "host":
                hosts += 1
            elif key == "content-length":
                lengths.append(value)
            elif key == "transfer-encoding":
                encodings.append(value)
            if key in headers:
                if key not in ("host", "content-length", "transfer-encoding"):
                    headers[key] = headers[key] + ", " + value
            else:
                headers[key] = value
            last = key
        if version[0] != 1:
            raise _BadRequest(505, "unsupported protocol version")
        if hosts > 1:
            raise _BadRequest()
        if version >= (1, 1) and not hosts and method != "CONNECT":
            raise _BadRequest(400, "missing required Host header")
        if hosts and not all(ord(c) in _HOST_BYTES for c in headers["host"]):
            raise _BadRequest(400, "malformed Host header")
        self.body_left = 0
        self.body_error = False
        if encodings and version >= (1, 1):
            if len(encodings) != 1 or encodings[0].lower() != "chunked":
                raise _BadRequest(501)
            request.content_length = None
            self.body_left = -1
            self.chunk_left = -1
        elif lengths:
            first_len = lengths[0]
            if any(v != first_len for v in lengths) or not first_len.isdigit() or not first_len.isascii():
                raise _BadRequest()
            n = int(first_len)
            request.content_length = n
            self.body_left = n
        connection = headers.get("Connection", "").lower()
        tokens = {t.strip() for t in connection.split(",")}
        if version >= (1, 1):
            request.wants_close = "close" in tokens
        else:
            request.keep_alive_10 = "keep-alive" in tokens
        expect = headers.get("Expect", "")
        if expect:
            if "100-continue" in {t.strip() for t in expect.lower().split(",")}:
                if version >= (1, 1) and self.body_left != 0:
                    request._continue = True
            else:
                raise _Expectation()
        return request

    async def _serve(self, request: Request) -> None:
        try:
            try:
                response = await self.server.dispatch(request)
            except Exception:  # the Router answers every error: this is a bug
                log.exception("HTTP: handler failed - %s %s", request.method, request.raw_path)
                response = Response(500, b"Internal Server Error")
            close = await self._respond(request, response)
            if not close and request._continue and self.body_left != 0:
                # the 100 was never sent: drop a small body if it comes, else close
                if self.body_left > MAX_POST_HANDLER_READ:
                    close = True
                else:
                    close = not await self.discard_body(MAX_POST_HANDLER_READ)
            if close or (self.eof and not self.buf):
                self.close()
                return
            if self._drained is not None:
                await self._drained
        except asyncio.CancelledError:
            self.close()
            raise
        except Exception:
            log.exception("HTTP: connection failed")
            self.close()
            return
        finally:
            self.task = None
        self._next_request()

    async def _respond(self, request: Request, response: Response) -> bool:
        """Write ``response`` as Go's chunkWriter does; True if the connection closes after."""
        head = request.method == "HEAD"
        status = response.status
        body = response.body
        handler_headers = {canonical_key(k): v for k, v in response.headers.items()}
        close = request.wants_close or request.version < (1, 1)
        extra_connection = ""
        body_allowed = not (100 <= status < 200 or status in (204, 304))
        length: int | None = None
        if (
            body_allowed
            and "Content-Length" not in handler_headers
            and len(body) <= CHUNKING_SIZE
            and (not head or body)
        ):
            length = len(body)
        if request.keep_alive_10 and (head or length is not None or not body_allowed):
            close = False
            if "Connection" not in handler_headers:
                extra_connection = "keep-alive"
        if handler_headers.get("Connection", "").lower() == "close":
            close = True
        if not close and self.body_left != 0 and not request._continue:
            # Go reads what is left of an unread body to reuse the connection, up to 256 KiB
            close = self.body_left >= MAX_POST_HANDLER_READ or not await self.discard_body(
                MAX_POST_HANDLER_READ + 1
            )
        reason = STATUS_TEXT.get(status, f"status code {status}")
        lines = [f"HTTP/1.{1 if request.version >= (1, 1) else 0} {status} {reason}"]
        lines += [f"{k}: {handler_headers[k]}" for k in sorted(handler_headers)]
        if "Date" not in handler_headers:
            lines.append(f"Date: {http_date()}")
        if length is not None:
            lines.append(f"Content-Length: {length}")
        if body_allowed and body and "Content-Type" not in handler_headers:
            lines.append(f"Content-Type: {sniff(body)}")
        chunked = False
        if body_allowed and length is None and "Content-Length" not in handler_headers:
            if request.version >= (1, 1):
                chunked = not head
            else:
                close = True
        if close and "close" not in handler_headers.get("Connection", "").lower():
            extra_connection = "close" if request.version >= (1, 1) else ""
        if extra_connection:
            lines.append(f"Connection: {extra_connection}")
        if chunked:
            lines.append("Transfer-Encoding: chunked")
        out = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
        if not head and body_allowed and body:
            if chunked:
                out += b"%x\r\n" % len(body) + body + b"\r\n0\r\n\r\n"
            else:
                out += body
        self.write(out)
        return close


class _Expectation(_BadRequest):
    """An ``Expect`` other than ``100-continue``: Go answers 417 and closes."""


def _request_path(target: str) -> str:
    """The path of a request target (origin form, absolute form or ``*``), as Go's
    ``url.ParseRequestURI`` accepts it."""
    if target == "*":
        return "*"
    if any(ord(c) < 33 or ord(c) == 127 for c in target):
        raise _BadRequest()
    if target.startswith("/"):
        return target.partition("?")[0]
    scheme, sep, rest = target.partition("://")
    if sep and scheme and scheme[0].isalpha() and all(c.isalnum() or c in "+-." for c in scheme):
        path = rest.partition("?")[0]
        slash = path.find("/")
        return path[slash:] if slash >= 0 else ""
    raise _BadRequest()


def _unescape_path(path: str) -> str:
    """Go's ``url.PathUnescape`` (a bad ``%`` escape is a 400)."""
    if "%" not in path:
        return path
    out = bytearray()
    i = 0
    raw = path.encode("latin-1")
    while i < len(raw):
        c = raw[i]
        if c == 37:  # %
            hx = raw[i + 1 : i + 3]
            if len(hx) != 2 or not all(h in _HEX for h in hx):
                raise _BadRequest()
            out.append(int(hx, 16))
            i += 3
        else:
            out.append(c)
            i += 1
    return out.decode("utf-8", "replace")


class HTTPServer:
    """The listener and its connections (``cleanup`` as aiohttp's ``AppRunner``)."""

    def __init__(self, dispatch: Dispatch, ssl_context: ssl.SSLContext | None = None) -> None:
        self.dispatch = dispatch
        self.ssl_context = ssl_context
        self.connections: set[_Connection] = set()
        self.server: asyncio.AbstractServer | None = None

    async def start(self, sock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        self.server = await loop.create_server(
            lambda: _Connection(self), sock=sock, ssl=self.ssl_context, backlog=LISTEN_BACKLOG
        )

    async def cleanup(self, timeout: float = 2.0) -> None:
        """Stop listening, let requests in progress finish (``timeout``), close the rest."""
        if self.server is not None:
            self.server.close()
        for conn in list(self.connections):
            if conn.task is None:
                conn.close()
        tasks = [c.task for c in self.connections if c.task is not None]
        if tasks:
            with contextlib.suppress(Exception):
                await asyncio.wait(tasks, timeout=timeout)
        for conn in list(self.connections):
            if conn.task is not None:
                conn.task.cancel()
            conn.close()
        if self.server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.server.wait_closed(), timeout)


async def serve(
    dispatch: Dispatch, sock: socket.socket, ssl_context: ssl.SSLContext | None = None
) -> HTTPServer:
    """Serve every request through ``dispatch`` on an already-bound socket (HTTPS with
    ``ssl_context``)."""
    server = HTTPServer(dispatch, ssl_context)
    await server.start(sock)
    return server
