"""nsqd's HTTP API, as NSQ 1.3.0's ``nsqd/http.go`` on aiohttp.

Same paths, methods, parameters, status codes and bodies as the Go daemon:

- successful ``V1`` responses carry ``X-NSQ-Content-Type: nsq; version=1.0``; a string
  result is sent as text, ``None`` as an empty body, anything else as JSON;
- errors are ``{"message":"<CODE>"}`` with the status (``/ping`` and the ``/debug``
  helpers answer in plain text instead, as Go's ``PlainText`` decorator does);
- routing follows ``julienschmidt/httprouter`` as nsqd configures it: 404 ``NOT_FOUND``,
  405 ``METHOD_NOT_ALLOWED`` with ``Allow``, automatic ``OPTIONS``, and 301/307 redirects
  for a wrong trailing slash or letter case;
- ``/pub`` and ``/mpub`` are not logged (as in Go); every other request is logged at INFO.

``/debug/pprof/*`` are Go-runtime endpoints; Python equivalents answer here in plain text:
``/debug/pprof/`` (index), ``cmdline``, ``goroutine`` (thread stacks and asyncio tasks),
``heap`` (tracemalloc top allocation sites when tracing, else GC/memory counters) and
``profile?seconds=N`` (cProfile of the event loop for N seconds, pstats text).
``symbol``, ``block`` and ``threadcreate`` have no Python meaning and answer 404
``NOT_FOUND``. ``PUT /debug/setblockrate`` validates ``rate`` like Go and is a no-op;
``POST /debug/freememory`` runs a full ``gc.collect()`` plus glibc ``malloc_trim(0)``.
"""

from __future__ import annotations

import asyncio
import cProfile
import gc
import html
import io
import logging
import pstats
import re
import socket
import sys
import threading
import time
import traceback
import tracemalloc
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote_to_bytes

from aiohttp import web

from .. import NSQ_VERSION
from ..protocol.commands import decode_mpub
from ..protocol.errors import ProtocolError
from ..protocol.names import is_valid_channel_name, is_valid_topic_name
from .options import InvalidOptionError, OptionsError, config_value, set_config_value
from .protocol_v2 import go_quote
from .stats import (
    BOOL_PARAMS,
    go_duration,
    go_json,
    install_gc_tracker,
    mem_stats,
    stats_document,
    stats_text,
)
from .topic import Topic, TopicExitingError

if TYPE_CHECKING:
    from .nsqd import NSQD

log = logging.getLogger("nsqd")

JSON_TYPE = "application/json; charset=utf-8"
TEXT_TYPE = "text/plain; charset=utf-8"
V1_HEADER = ("X-NSQ-Content-Type", "nsq; version=1.0")

Params = dict[str, str]
Handler = Callable[[web.Request, Params], Awaitable[Any]]

_V1 = "v1"  # errors as JSON {"message": ...}, results per RespondV1
_PLAIN = "plain"  # errors and results as plain text (Go's PlainText decorator)
_RAW = "raw"  # the handler builds its own response (Go's pprof handlers)


class HTTPError(Exception):
    """Go's ``http_api.Err``: a status code and the message text."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(text)
        self.status = status
        self.text = text


# --- responses ----------------------------------------------------------------------------------


def respond_v1(data: Any, status: int = 200) -> web.Response:
    """Go's ``RespondV1``: str/bytes as text, None as an empty body, else JSON."""
    headers = {V1_HEADER[0]: V1_HEADER[1]}
    if data is None:
        return web.Response(status=status, headers=headers)
    if isinstance(data, str):
        body = data.encode()
    elif isinstance(data, bytes):
        body = data
    else:
        headers["Content-Type"] = JSON_TYPE
        return web.Response(status=status, body=go_json(data), headers=headers)
    if body:
        headers["Content-Type"] = TEXT_TYPE  # what Go's content sniffing picks for text
    return web.Response(status=status, body=body, headers=headers)


def respond_v1_error(status: int, text: str, headers: dict[str, str] | None = None) -> web.Response:
    h = {V1_HEADER[0]: V1_HEADER[1], "Content-Type": JSON_TYPE}
    if headers:
        h.update(headers)
    return web.Response(status=status, body=go_json({"message": text}), headers=h)


def respond_plain(text: str | bytes, status: int = 200) -> web.Response:
    body = text.encode() if isinstance(text, str) else text
    headers = {"Content-Type": TEXT_TYPE} if body else {}
    return web.Response(status=status, body=body, headers=headers)


# --- request parameters -------------------------------------------------------------------------

_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")
_INT = re.compile(r"[+-]?[0-9]+")


def _query_unescape(s: str) -> str:
    """Go's ``url.QueryUnescape`` (``+`` is a space; a bad ``%`` escape is an error)."""
    if "%" not in s and "+" not in s:
        return s
    if _BAD_ESCAPE.search(s):
        raise ValueError(f"invalid URL escape in {s!r}")
    return unquote_to_bytes(s.replace("+", " ")).decode("utf-8", "replace")


def parse_query(raw: str) -> tuple[dict[str, list[str]], bool]:
    """Go's ``url.ParseQuery``: the values, and False if any part was malformed
    (a bad escape, or a ``;`` separator, which Go rejects since 1.17)."""
    values: dict[str, list[str]] = {}
    ok = True
    for part in raw.split("&"):
        if ";" in part:
            ok = False
            continue
        if not part:
            continue
        key, _, value = part.partition("=")
        try:
            key = _query_unescape(key)
            value = _query_unescape(value)
        except ValueError:
            ok = False
            continue
        values.setdefault(key, []).append(value)
    return values, ok


def _req_params(request: web.Request) -> dict[str, list[str]]:
    """Parsed query parameters; a malformed query is 400 ``INVALID_REQUEST``."""
    values, ok = parse_query(request.rel_url.raw_query_string)
    if not ok:
        raise HTTPError(400, "INVALID_REQUEST")
    return values


def _get(values: dict[str, list[str]], key: str) -> str | None:
    v = values.get(key)
    return v[0] if v else None


def _topic_channel_args(values: dict[str, list[str]]) -> tuple[str, str]:
    """Go's ``http_api.GetTopicChannelArgs``."""
    topic = _get(values, "topic")
    if topic is None:
        raise HTTPError(400, "MISSING_ARG_TOPIC")
    if not is_valid_topic_name(topic):
        raise HTTPError(400, "INVALID_ARG_TOPIC")
    channel = _get(values, "channel")
    if channel is None:
        raise HTTPError(400, "MISSING_ARG_CHANNEL")
    if not is_valid_channel_name(channel):
        raise HTTPError(400, "INVALID_ARG_CHANNEL")
    return topic, channel


async def _expect(request: web.Request) -> None:
    """Accept ``Expect: 100-continue`` but send the ``100 Continue`` only when the handler
    reads the body (as Go's server does), so an early 413 saves the upload."""
    expect = request.headers.get("Expect", "")
    if request.version >= (1, 1) and expect.lower() != "100-continue":
        raise web.HTTPExpectationFailed(text=f"Unknown Expect: {expect}")


_CONTINUED = web.RequestKey("nsq.continued", bool)


async def _continue(request: web.Request) -> None:
    """Send the deferred ``100 Continue`` (once) before reading a body."""
    if (
        request.version >= (1, 1)
        and _CONTINUED not in request
        and request.headers.get("Expect", "").lower() == "100-continue"
    ):
        request[_CONTINUED] = True
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        request.writer.output_size = 0


async def _read_max(request: web.Request, limit: int) -> bytes:
    """Read the body, stopping after ``limit`` bytes (Go's ``io.LimitReader``)."""
    await _continue(request)
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


def _ns(seconds: float) -> int:
    return round(seconds * 1_000_000_000)


def _int64_wrap(v: int) -> int:
    v &= (1 << 64) - 1
    return v - (1 << 64) if v >= 1 << 63 else v


def _split_text_mpub(data: bytes, read_max: int, max_msg_size: int) -> list[bytes]:
    """``/mpub`` text mode: newline-separated bodies, empty lines dropped, Go's checks."""
    parts = data.split(b"\n")
    last = len(parts) - 1
    total = 0
    out = []
    for i, block in enumerate(parts):
        total += len(block) + (i < last)
        if total == read_max:
            raise HTTPError(413, "BODY_TOO_BIG")
        if not block:
            continue
        if len(block) > max_msg_size:
            raise HTTPError(413, "MSG_TOO_BIG")
        out.append(block)
    return out


def _clean_path(p: str) -> str:
    """httprouter's ``CleanPath``: collapse ``//``, resolve ``.``/``..``, keep a trailing /."""
    if not p:
        return "/"
    parts: list[str] = []
    for seg in p.split("/"):
        if seg in ("", "."):
            continue
        if seg == "..":
            if parts:
                parts.pop()
            continue
        parts.append(seg)
    out = "/" + "/".join(parts)
    if p.endswith("/") and out != "/":
        out += "/"
    return out


# --- the server -------------------------------------------------------------------------------


class HTTPServer:
    """Routes and handlers of nsqd's HTTP API, bound to one :class:`NSQD`."""

    def __init__(self, nsqd: NSQD) -> None:
        self.nsqd = nsqd
        #: path → method → (handler, style, logged)
        self.routes: dict[str, dict[str, tuple[Handler, str, bool]]] = {}
        #: ``/config/:opt``-style routes: (prefix, param name, method → route)
        self.param_routes: list[tuple[str, str, dict[str, tuple[Handler, str, bool]]]] = []
        self.methods: set[str] = set()
        self._profiling = False
        r = self._route
        r("GET", "/ping", self.ping, _PLAIN)
        r("GET", "/info", self.info)
        r("POST", "/pub", self.pub, logged=False)
        r("POST", "/mpub", self.mpub, logged=False)
        r("GET", "/stats", self.stats)
        r("POST", "/topic/create", self.topic_create)
        r("POST", "/topic/delete", self.topic_delete)
        r("POST", "/topic/empty", self.topic_empty)
        r("POST", "/topic/pause", self.topic_pause)
        r("POST", "/topic/unpause", self.topic_pause)
        r("POST", "/channel/create", self.channel_create)
        r("POST", "/channel/delete", self.channel_delete)
        r("POST", "/channel/empty", self.channel_empty)
        r("POST", "/channel/pause", self.channel_pause)
        r("POST", "/channel/unpause", self.channel_pause)
        r("GET", "/config/:opt", self.config)
        r("PUT", "/config/:opt", self.config)
        r("GET", "/debug/pprof/", self.pprof_index, _RAW, logged=False)
        r("GET", "/debug/pprof/cmdline", self.pprof_cmdline, _RAW, logged=False)
        r("GET", "/debug/pprof/goroutine", self.pprof_goroutine, _RAW, logged=False)
        r("GET", "/debug/pprof/heap", self.pprof_heap, _RAW, logged=False)
        r("GET", "/debug/pprof/profile", self.pprof_profile, _RAW, logged=False)
        r("PUT", "/debug/setblockrate", self.set_block_rate, _PLAIN)
        r("POST", "/debug/freememory", self.free_memory, _PLAIN)

    # --- routing ----------------------------------------------------------------------------

    def _route(
        self, method: str, path: str, handler: Handler, style: str = _V1, logged: bool = True
    ) -> None:
        self.methods.add(method)
        if "/:" in path:
            prefix, _, name = path.rpartition(":")
            for p, n, table in self.param_routes:
                if p == prefix and n == name:
                    table[method] = (handler, style, logged)
                    return
            self.param_routes.append((prefix, name, {method: (handler, style, logged)}))
            return
        self.routes.setdefault(path, {})[method] = (handler, style, logged)

    def _lookup(self, path: str) -> tuple[dict[str, tuple[Handler, str, bool]] | None, Params]:
        table = self.routes.get(path)
        if table is not None:
            return table, {}
        for prefix, name, ptable in self.param_routes:
            if path.startswith(prefix):
                value = path[len(prefix) :]
                if value and "/" not in value:
                    return ptable, {name: value}
        return None, {}

    def _allowed(self, path: str, method: str) -> str:
        table, _ = self._lookup(path)
        if not table:
            return ""
        allow = sorted(m for m in table if m != method and m != "OPTIONS")
        return ", ".join([*allow, "OPTIONS"]) if allow else ""

    def _has(self, path: str, method: str) -> bool:
        table, _ = self._lookup(path)
        return table is not None and method in table

    def _fixed_path(self, path: str, method: str) -> str | None:
        """httprouter's redirects: wrong trailing slash, then a case-insensitive match of the
        cleaned path (for the request's method only)."""
        if len(path) > 1 and path.endswith("/"):
            alt = path[:-1]
        else:
            alt = path + "/"
        if self._has(alt, method):
            return alt
        clean = _clean_path(path)
        for cand in (clean, clean[:-1] if len(clean) > 1 and clean.endswith("/") else clean + "/"):
            low = cand.lower()
            for route, table in self.routes.items():
                if method in table and route.lower() == low:
                    return route
            for prefix, _, ptable in self.param_routes:
                if method in ptable and low.startswith(prefix.lower()):
                    value = cand[len(prefix) :]
                    if value and "/" not in value:
                        return prefix + value
        return None

    async def dispatch(self, request: web.Request) -> web.StreamResponse:
        nsqd = self.nsqd
        if nsqd.options.tls_required == "true":
            # plain HTTP while TLS is required (``tcp-https`` exempts HTTP); Go's exact bytes
            https_port = getattr(nsqd, "https_port", 0)  # no HTTPS listener yet: Go gives 0
            return web.Response(
                status=403,
                body=f'{{"message": "TLS_REQUIRED", "https_port": {https_port}}}'.encode(),
                headers={V1_HEADER[0]: V1_HEADER[1], "Content-Type": JSON_TYPE},
            )
        path = request.path
        method = request.method
        table, params = self._lookup(path)
        if table is not None:
            route = table.get(method)
            if route is not None:
                return await self._call(request, route, params)
        if method in self.methods and method != "CONNECT" and path != "/":
            fixed = self._fixed_path(path, method)
            if fixed is not None:
                return self._redirect(request, fixed, 301 if method == "GET" else 307)
        if method == "OPTIONS":
            allow = self._allowed(path, method)
            if allow:
                return web.Response(status=200, headers={"Allow": allow})
        else:
            allow = self._allowed(path, method)
            if allow:
                return await self._call(
                    request, (self._method_not_allowed, _V1, True), {"allow": allow}
                )
        return await self._call(request, (self._not_found, _V1, True), {})

    @staticmethod
    def _redirect(request: web.Request, path: str, code: int) -> web.Response:
        qs = request.rel_url.raw_query_string
        location = path + ("?" + qs if qs else "")
        headers = {"Location": location}
        if request.method in ("GET", "HEAD"):
            headers["Content-Type"] = "text/html; charset=utf-8"
            text = "Moved Permanently" if code == 301 else "Temporary Redirect"
            return web.Response(
                status=code,
                body=f'<a href="{html.escape(location)}">{text}</a>.\n\n'.encode(),
                headers=headers,
            )
        return web.Response(status=code, headers=headers)

    async def _not_found(self, request: web.Request, params: Params) -> Any:
        raise HTTPError(404, "NOT_FOUND")

    async def _method_not_allowed(self, request: web.Request, params: Params) -> Any:
        raise HTTPError(405, "METHOD_NOT_ALLOWED")

    async def _call(
        self, request: web.Request, route: tuple[Handler, str, bool], params: Params
    ) -> web.StreamResponse:
        handler, style, logged = route
        start = time.perf_counter_ns()
        status = 200
        resp: web.StreamResponse
        try:
            data = await handler(request, params)
        except HTTPError as e:
            status = e.status
            if style == _PLAIN:
                resp = respond_plain(e.text, status)
            else:
                extra = {"Allow": params["allow"]} if status == 405 and "allow" in params else None
                resp = respond_v1_error(status, e.text, extra)
        except Exception:
            # Go's PanicHandler: log it, answer 500 INTERNAL_ERROR
            log.exception("panic in HTTP handler - %s %s", request.method, request.path)
            status = 500
            resp = respond_v1_error(500, "INTERNAL_ERROR")
        else:
            if isinstance(data, web.StreamResponse):
                resp = data
                status = data.status
            elif style == _PLAIN:
                resp = respond_plain(data or "")
            else:
                resp = respond_v1(data)
        if logged:
            log.info(
                "%d %s %s (%s) %s",
                status,
                request.method,
                request.raw_path,
                request.remote,
                go_duration(time.perf_counter_ns() - start),
            )
        return resp

    # --- basics -------------------------------------------------------------------------------

    async def ping(self, request: web.Request, params: Params) -> Any:
        health = self.nsqd.health()
        if not self.nsqd.is_healthy():
            raise HTTPError(500, health)
        return health

    async def info(self, request: web.Request, params: Params) -> Any:
        nsqd = self.nsqd
        opts = nsqd.options
        try:
            hostname = socket.gethostname()
        except OSError as e:  # pragma: no cover
            raise HTTPError(500, str(e)) from None
        return {
            "version": NSQ_VERSION,
            "broadcast_address": opts.broadcast_address,
            "hostname": hostname,
            "http_port": nsqd.http_port,
            "tcp_port": nsqd.tcp_port,
            "start_time": nsqd.start_time,
            "max_heartbeat_interval": _ns(opts.max_heartbeat_interval),
            "max_output_buffer_size": opts.max_output_buffer_size,
            "max_output_buffer_timeout": _ns(opts.max_output_buffer_timeout),
            "max_deflate_level": opts.max_deflate_level,
        }

    # --- publishing ---------------------------------------------------------------------------

    def _topic_from_query(self, request: web.Request) -> tuple[dict[str, list[str]], Topic]:
        """Go's ``getTopicFromQuery``: validates ``topic`` and gets (creates) the topic."""
        values = _req_params(request)
        name = _get(values, "topic")
        if name is None:
            raise HTTPError(400, "MISSING_ARG_TOPIC")
        if not is_valid_topic_name(name):
            raise HTTPError(400, "INVALID_TOPIC")
        return values, self.nsqd.get_topic(name)

    async def _put(self, topic: Topic, bodies: list[bytes], defer: float) -> None:
        """Publish through the same path as TCP PUB/MPUB (including waiting for the fsync
        when --sync-every is reached); any failure is Go's 503 EXITING."""
        if self.nsqd.exiting or topic.exiting:
            raise HTTPError(503, "EXITING")
        if not bodies:
            return
        try:
            must_sync = topic.put_bodies(bodies, defer)
        except (TopicExitingError, OSError) as e:
            log.error("TOPIC(%s): failed to put message(s) - %s", topic.name, e)
            raise HTTPError(503, "EXITING") from None
        if must_sync:
            done: asyncio.Future[BaseException | None] = asyncio.get_running_loop().create_future()
            self.nsqd.wait_durable(lambda err: done.done() or done.set_result(err))
            if await done is not None:
                raise HTTPError(503, "EXITING")

    async def pub(self, request: web.Request, params: Params) -> Any:
        opts = self.nsqd.options
        max_size = opts.max_msg_size
        length = request.content_length
        if length is not None and length > max_size:
            raise HTTPError(413, "MSG_TOO_BIG")
        body = await _read_max(request, max_size + 1)
        if len(body) > max_size:
            raise HTTPError(413, "MSG_TOO_BIG")
        if not body:
            raise HTTPError(400, "MSG_EMPTY")
        values, topic = self._topic_from_query(request)
        defer = 0.0
        ds = values.get("defer")
        if ds is not None:
            raw = ds[0]
            if not _INT.fullmatch(raw):
                raise HTTPError(400, "INVALID_DEFER")
            di = int(raw)
            if not -(1 << 63) <= di < 1 << 63:
                raise HTTPError(400, "INVALID_DEFER")
            ns = _int64_wrap(di * 1_000_000)  # time.Duration(di) * time.Millisecond
            if ns < 0 or ns > _ns(opts.max_req_timeout):
                raise HTTPError(400, "INVALID_DEFER")
            defer = ns / 1_000_000_000
        await self._put(topic, [body], defer)
        return "OK"

    async def mpub(self, request: web.Request, params: Params) -> Any:
        opts = self.nsqd.options
        max_body = opts.max_body_size
        length = request.content_length
        if length is not None and length > max_body:
            raise HTTPError(413, "BODY_TOO_BIG")
        values, topic = self._topic_from_query(request)
        binary = False
        mode = _get(values, "binary")
        if mode is not None:
            b = BOOL_PARAMS.get(mode)
            if b is None:
                log.warning("deprecated value '%s' used for /mpub binary param", mode)
                b = True
            binary = b
        body = await _read_max(request, max_body + 1)
        if binary:
            # Go reads a chunked binary body message by message; we cap it at max-body-size
            if len(body) > max_body:
                raise HTTPError(413, "BODY_TOO_BIG")
            try:
                bodies = decode_mpub(body, opts.max_msg_size, max_body)
            except ProtocolError as e:
                raise HTTPError(413, e.code[2:]) from None
        else:
            bodies = _split_text_mpub(body, max_body + 1, opts.max_msg_size)
        await self._put(topic, bodies, 0.0)
        return "OK"

    # --- topics and channels -----------------------------------------------------------------

    async def topic_create(self, request: web.Request, params: Params) -> Any:
        self._topic_from_query(request)
        return None

    async def topic_delete(self, request: web.Request, params: Params) -> Any:
        name = _get(_req_params(request), "topic")
        if name is None:
            raise HTTPError(400, "MISSING_ARG_TOPIC")
        if not self.nsqd.delete_topic(name):
            raise HTTPError(404, "TOPIC_NOT_FOUND")
        return None

    async def topic_empty(self, request: web.Request, params: Params) -> Any:
        name = _get(_req_params(request), "topic")
        if name is None:
            raise HTTPError(400, "MISSING_ARG_TOPIC")
        if not is_valid_topic_name(name):
            raise HTTPError(400, "INVALID_TOPIC")
        topic = self.nsqd.get_existing_topic(name)
        if topic is None:
            raise HTTPError(404, "TOPIC_NOT_FOUND")
        topic.empty()
        return None

    async def topic_pause(self, request: web.Request, params: Params) -> Any:
        name = _get(_req_params(request), "topic")
        if name is None:
            raise HTTPError(400, "MISSING_ARG_TOPIC")
        topic = self.nsqd.get_existing_topic(name)
        if topic is None:
            raise HTTPError(404, "TOPIC_NOT_FOUND")
        if "unpause" in request.path:
            topic.unpause()
        else:
            topic.pause()
        return None  # Topic.(un)pause persists the metadata

    def _existing_topic(self, request: web.Request) -> tuple[Topic, str]:
        """Go's ``getExistingTopicFromQuery``: (topic, channel name)."""
        topic_name, channel_name = _topic_channel_args(_req_params(request))
        topic = self.nsqd.get_existing_topic(topic_name)
        if topic is None:
            raise HTTPError(404, "TOPIC_NOT_FOUND")
        return topic, channel_name

    async def channel_create(self, request: web.Request, params: Params) -> Any:
        topic, name = self._existing_topic(request)
        topic.get_channel(name)
        return None

    async def channel_delete(self, request: web.Request, params: Params) -> Any:
        topic, name = self._existing_topic(request)
        if not topic.delete_channel(name):
            raise HTTPError(404, "CHANNEL_NOT_FOUND")
        return None

    async def channel_empty(self, request: web.Request, params: Params) -> Any:
        topic, name = self._existing_topic(request)
        channel = topic.channels.get(name)
        if channel is None:
            raise HTTPError(404, "CHANNEL_NOT_FOUND")
        channel.empty()
        return None

    async def channel_pause(self, request: web.Request, params: Params) -> Any:
        topic, name = self._existing_topic(request)
        channel = topic.channels.get(name)
        if channel is None:
            raise HTTPError(404, "CHANNEL_NOT_FOUND")
        if "unpause" in request.path:
            channel.unpause()
        else:
            channel.pause()
        return None

    # --- stats and config ----------------------------------------------------------------------

    async def stats(self, request: web.Request, params: Params) -> Any:
        values = _req_params(request)
        topic = _get(values, "topic") or ""
        channel = _get(values, "channel") or ""
        include_clients = BOOL_PARAMS.get(_get(values, "include_clients") or "", True)
        include_mem = BOOL_PARAMS.get(_get(values, "include_mem") or "", True)
        if _get(values, "format") == "json":
            return stats_document(self.nsqd, topic, channel, include_clients, include_mem)
        return stats_text(self.nsqd, topic, channel, include_clients, include_mem)

    async def config(self, request: web.Request, params: Params) -> Any:
        opt = params["opt"]
        opts = self.nsqd.options
        if request.method == "PUT":
            read_max = opts.max_msg_size + 1
            body = await _read_max(request, read_max)
            if len(body) == read_max or not body:
                raise HTTPError(413, "INVALID_VALUE")
            try:
                set_config_value(opts, opt, body)
            except InvalidOptionError:
                raise HTTPError(400, "INVALID_OPTION") from None
            except OptionsError:
                raise HTTPError(400, "INVALID_VALUE") from None
            self._options_changed(opt)
        try:
            return config_value(opts, opt)
        except KeyError:
            raise HTTPError(400, "INVALID_OPTION") from None

    def _options_changed(self, opt: str) -> None:
        if opt == "log_level":
            from .main import LEVELS

            log.setLevel(LEVELS.get(self.nsqd.options.log_level.lower(), logging.INFO))
        # Go's triggerOptsNotification (lookupd peers reconnect): the daemon may attach one
        hook = getattr(self.nsqd, "on_options_changed", None)
        if hook is not None:
            hook(opt)

    # --- debug (Python equivalents of Go's pprof) ------------------------------------------------

    async def pprof_index(self, request: web.Request, params: Params) -> Any:
        return respond_plain(
            "nsqpy debug endpoints (Python equivalents of Go's pprof):\n\n"
            "/debug/pprof/cmdline     the command line, NUL-separated\n"
            "/debug/pprof/goroutine   stacks of every thread and asyncio task\n"
            "/debug/pprof/heap        tracemalloc top allocation sites (when tracing)\n"
            "/debug/pprof/profile     cProfile of the event loop; ?seconds=N (default 30)\n"
            "/debug/freememory        POST: gc.collect() and malloc_trim(0)\n"
        )

    async def pprof_cmdline(self, request: web.Request, params: Params) -> Any:
        return respond_plain("\x00".join(sys.argv))

    async def pprof_goroutine(self, request: web.Request, params: Params) -> Any:
        out = io.StringIO()
        frames = sys._current_frames()
        for th in threading.enumerate():
            out.write(f"thread {th.name} (ident {th.ident}{', daemon' if th.daemon else ''}):\n")
            frame = frames.get(th.ident) if th.ident is not None else None
            if frame is not None:
                out.writelines(traceback.format_stack(frame))
            out.write("\n")
        tasks = asyncio.all_tasks()
        out.write(f"asyncio tasks: {len(tasks)}\n\n")
        for task in tasks:
            out.write(f"{task!r}:\n")
            out.writelines(traceback.format_list(_await_stack(task.get_coro())))
            out.write("\n")
        return respond_plain(out.getvalue())

    async def pprof_heap(self, request: web.Request, params: Params) -> Any:
        out = io.StringIO()
        if tracemalloc.is_tracing():
            snap = tracemalloc.take_snapshot()
            top = snap.statistics("lineno")
            total = sum(s.size for s in top)
            out.write(f"tracemalloc: {total} bytes in {len(top)} allocation sites\n\n")
            for s in top[:100]:
                out.write(f"{s}\n")
        else:
            out.write(
                "tracemalloc is not tracing; start nsqd with PYTHONTRACEMALLOC=1 "
                "(or -X tracemalloc) for allocation sites\n\n"
            )
        for key, value in mem_stats().items():
            out.write(f"{key} {value}\n")
        out.write(f"gc_count {gc.get_count()}\ngc_threshold {gc.get_threshold()}\n")
        for gen, st in enumerate(gc.get_stats()):
            out.write(f"gc_generation_{gen} {st}\n")
        return respond_plain(out.getvalue())

    async def pprof_profile(self, request: web.Request, params: Params) -> Any:
        values, _ = parse_query(request.rel_url.raw_query_string)
        try:
            seconds = float(_get(values, "seconds") or "0")
        except ValueError:
            seconds = 0.0
        if not 0 < seconds < float("inf"):
            seconds = 30.0
        if self._profiling:
            return respond_plain(
                "Could not enable CPU profiling: cpu profiling already in use\n", 500
            )
        prof = cProfile.Profile()
        try:
            prof.enable()
        except ValueError as e:  # another profiler owns this thread
            return respond_plain(f"Could not enable CPU profiling: {e}\n", 500)
        self._profiling = True
        try:
            await asyncio.sleep(seconds)
        finally:
            prof.disable()
            self._profiling = False
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(100)
        return respond_plain(out.getvalue())

    async def set_block_rate(self, request: web.Request, params: Params) -> Any:
        values, _ = parse_query(request.rel_url.raw_query_string)
        raw = _get(values, "rate")
        if raw is None and request.content_type == "application/x-www-form-urlencoded":
            await _continue(request)
            form = await request.post()
            v = form.get("rate")
            raw = v if isinstance(v, str) else None
        raw = raw or ""
        if not _INT.fullmatch(raw):
            raise HTTPError(
                400, f"invalid block rate : strconv.Atoi: parsing {go_quote(raw)}: invalid syntax"
            )
        return ""  # Python has no block profiler: accepted, no effect

    async def free_memory(self, request: web.Request, params: Params) -> Any:
        gc.collect()
        _malloc_trim()
        return ""


def _await_stack(coro: Any) -> traceback.StackSummary:
    """The frames of a coroutine and everything it awaits (outermost first)."""
    frames = []
    while coro is not None:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if frame is not None:
            frames.append((frame, frame.f_lineno))
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
    return traceback.StackSummary.extract(iter(frames))


def _malloc_trim() -> None:
    """Hand freed heap back to the OS (glibc only), like Go's ``debug.FreeOSMemory``."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # pragma: no cover - not glibc
        pass


async def start_http(nsqd: NSQD, sock: socket.socket) -> web.AppRunner:
    """Serve nsqd's HTTP API on an already-bound listening socket."""
    server = HTTPServer(nsqd)
    install_gc_tracker()
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", server.dispatch, expect_handler=_expect)
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=2.0)
    await runner.setup()
    await web.SockSite(runner, sock).start()
    return runner
