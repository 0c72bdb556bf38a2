"""The HTTP plumbing the NSQ daemons share (Go's ``internal/http_api`` plus
``julienschmidt/httprouter`` as NSQ configures it). nsqd and nsqlookupd serve it on
:mod:`nsqpy.httpserver` (Go's ``net/http`` answers, without aiohttp's memory); nsqadmin on
aiohttp (:mod:`nsqpy.nsqadmin.aioserve` turns these responses into aiohttp's).

- :class:`Router`: exact-path and ``/prefix/:param`` routes; 404 ``NOT_FOUND`` and 405
  ``METHOD_NOT_ALLOWED`` (with ``Allow``) as JSON, automatic ``OPTIONS``, 301/307 redirects
  for a wrong trailing slash or letter case; every request logged at INFO like Go's ``Log``
  decorator (unless the route opts out); a handler crash is 500 ``INTERNAL_ERROR``.
- Response styles: ``V1`` (successful results carry ``X-NSQ-Content-Type: nsq; version=1.0``;
  a string is sent as text, ``None`` as an empty body, anything else as Go-style JSON; errors
  are ``{"message":"<CODE>"}``), ``PLAIN`` (Go's ``PlainText`` decorator: text both ways) and
  ``RAW`` (the handler builds its own response, as Go's pprof handlers do).
- Request helpers with Go's semantics: ``url.ParseQuery``, ``http_api.ReqParams.Get``,
  ``GetTopicChannelArgs``, bodies read with a limit (the deferred ``100 Continue`` first).

Python equivalents of Go's ``/debug/pprof`` endpoints are in :mod:`nsqpy.pprof`.
"""

from __future__ import annotations

import json
import logging
import re
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from .goflags import format_duration_ns
from .httpserver import BodyError, Request, Response, serve
from .protocol.names import is_valid_channel_name, is_valid_topic_name

if TYPE_CHECKING:
    from .adminauth import AdminAuth

__all__ = [
    "JSON_TYPE",
    "PLAIN",
    "RAW",
    "TEXT_TYPE",
    "V1",
    "V1_HEADER",
    "HTTPError",
    "Handler",
    "Params",
    "Request",
    "Response",
    "Router",
    "clean_path",
    "get_param",
    "go_json",
    "parse_query",
    "raw_query",
    "read_max",
    "req_params",
    "respond_plain",
    "respond_v1",
    "respond_v1_error",
    "serve",
    "topic_channel_args",
]

JSON_TYPE = "application/json; charset=utf-8"
TEXT_TYPE = "text/plain; charset=utf-8"
V1_HEADER = ("X-NSQ-Content-Type", "nsq; version=1.0")

Params = dict[str, str]
#: a handler gets the request (ours, or aiohttp's for nsqadmin) and the path parameters
Handler = Callable[[Any, Params], Awaitable[Any]]

V1 = "v1"  #: errors as JSON {"message": ...}, results per RespondV1
PLAIN = "plain"  #: errors and results as plain text (Go's PlainText decorator)
RAW = "raw"  #: the handler builds its own response (Go's pprof handlers)

Route = tuple[Handler, str, bool]  # handler, response style, logged

#: Who may call a route (an nsqpy addition: ``--admin-token-file``, see :mod:`nsqpy.adminauth`).
#: Every route of nsqd and nsqlookupd is given one; a test walks them.
OPEN = "open"  #: anyone: reads that show no message bodies
ADMIN = "admin"  #: a listed admin token, when the daemon has some: what changes state, /debug
BODIES = "bodies"  #: as ADMIN, and refused to all when AUTH is on without tokens: peek
PUBLISH = "publish"  #: /pub, /mpub: open, or under AUTH with --http-publish-auth
ACCESS_LEVELS = (OPEN, ADMIN, BODIES, PUBLISH)


class HTTPError(Exception):
    """Go's ``http_api.Err``: a status code and the message text."""

    def __init__(
        self, status: int, text: str, headers: dict[str, str] | None = None, auth: bool = False
    ) -> None:
        super().__init__(text)
        self.status = status
        self.text = text
        #: extra response headers (``WWW-Authenticate``)
        self.headers = headers
        #: an access refusal: JSON whatever the route's style
        self.auth = auth


# --- responses ----------------------------------------------------------------------------------


def go_json(obj: Any) -> bytes:
    """``encoding/json.Marshal``: compact, UTF-8, and HTML-safe like Go (``<>&`` escaped)."""
    s = json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    if "<" in s or ">" in s or "&" in s or "\u2028" in s or "\u2029" in s:
        s = (
            s.replace("<", "\\u003c")
            .replace(">", "\\u003e")
            .replace("&", "\\u0026")
            .replace("\u2028", "\\u2028")
            .replace("\u2029", "\\u2029")
        )
    return s.encode()


def respond_v1(data: Any, status: int = 200) -> Response:
    """Go's ``RespondV1``: str/bytes as text, None as an empty body, else JSON. Text gets no
    ``Content-Type`` of its own: the server sniffs one, as Go's does."""
    headers = {V1_HEADER[0]: V1_HEADER[1]}
    if data is None:
        return Response(status, b"", headers)
    if isinstance(data, str):
        return Response(status, data.encode(), headers)
    if isinstance(data, bytes):
        return Response(status, data, headers)
    headers["Content-Type"] = JSON_TYPE
    return Response(status, go_json(data), headers)


def respond_v1_error(status: int, text: str, headers: dict[str, str] | None = None) -> Response:
    h = {V1_HEADER[0]: V1_HEADER[1], "Content-Type": JSON_TYPE}
    if headers:
        h.update(headers)
    return Response(status, go_json({"message": text}), h)


def respond_plain(text: str | bytes, status: int = 200) -> Response:
    """Go's ``PlainText`` decorator: the text as it is (its type sniffed by the server)."""
    return Response(status, text.encode() if isinstance(text, str) else text)


# --- request parameters -------------------------------------------------------------------------

_BAD_ESCAPE = re.compile(r"%(?![0-9A-Fa-f]{2})")


def _query_unescape(s: str) -> str:
    """Go's ``url.QueryUnescape`` (``+`` is a space; a bad ``%`` escape is an error)."""
    if "%" not in s and "+" not in s:
        return s
    if _BAD_ESCAPE.search(s):
        raise ValueError(f"invalid URL escape in {s!r}")
    first, *rest = s.replace("+", " ").encode().split(b"%")
    out = bytearray(first)
    for part in rest:  # each starts with two hex digits (checked above)
        out.append(int(part[:2], 16))
        out += part[2:]
    return out.decode("utf-8", "replace")


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


def raw_query(request: Any) -> str:
    """The query string as sent (ours, or an aiohttp request's)."""
    if isinstance(request, Request):
        return request.raw_query_string
    return str(request.rel_url.raw_query_string)


def req_params(request: Any) -> dict[str, list[str]]:
    """Parsed query parameters (``http_api.NewReqParams``); a malformed query is 400
    ``INVALID_REQUEST``."""
    values, ok = parse_query(raw_query(request))
    if not ok:
        raise HTTPError(400, "INVALID_REQUEST")
    return values


def get_param(values: dict[str, list[str]], key: str) -> str | None:
    """``ReqParams.Get``: the first value, or None when the key is absent (an empty value
    is a value)."""
    v = values.get(key)
    return v[0] if v else None


def topic_channel_args(values: dict[str, list[str]]) -> tuple[str, str]:
    """Go's ``http_api.GetTopicChannelArgs``."""
    topic = get_param(values, "topic")
    if topic is None:
        raise HTTPError(400, "MISSING_ARG_TOPIC")
    if not is_valid_topic_name(topic):
        raise HTTPError(400, "INVALID_ARG_TOPIC")
    channel = get_param(values, "channel")
    if channel is None:
        raise HTTPError(400, "MISSING_ARG_CHANNEL")
    if not is_valid_channel_name(channel):
        raise HTTPError(400, "INVALID_ARG_CHANNEL")
    return topic, channel


async def read_max(request: Any, limit: int) -> bytes:
    """Read the body, stopping after ``limit`` bytes (Go's ``io.LimitReader``); a body that
    breaks off is Go's 500 ``INTERNAL_ERROR``."""
    if isinstance(request, Request):
        try:
            return await request.read(limit)
        except BodyError:
            raise HTTPError(500, "INTERNAL_ERROR") from None
    from .nsqadmin.aioserve import read_max as aiohttp_read_max

    return await aiohttp_read_max(request, limit)


def _html_escape(s: str) -> str:
    """Go's ``net/http`` ``htmlEscape`` (what ``http.Redirect`` writes in its body)."""
    return (
        s.replace("&", "&amp;")
        .replace("<", "&lt;")
        .replace(">", "&gt;")
        .replace('"', "&#34;")
        .replace("'", "&#39;")
    )


def clean_path(p: str) -> str:
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


# --- routing ------------------------------------------------------------------------------------


class Router:
    """httprouter with ``HandleMethodNotAllowed``, NSQ's NotFound/MethodNotAllowed/Panic
    handlers and the ``Log`` decorator; requests and crashes are logged to ``log``."""

    def __init__(self, log: logging.Logger) -> None:
        self.log = log
        #: path → method → (handler, style, logged)
        self.routes: dict[str, dict[str, Route]] = {}
        #: (method, path as registered) → its access level (None: undecided)
        self.access: dict[tuple[str, str], str | None] = {}
        #: checks ADMIN and BODIES routes (None: everyone passes, as in NSQ)
        self.admin_auth: AdminAuth | None = None
        #: ``/config/:opt``-style routes: (prefix, param name, method → route)
        self.param_routes: list[tuple[str, str, dict[str, Route]]] = []
        self.methods: set[str] = set()

    #: what a handler may return as a finished response
    response_types: tuple[type, ...] = (Response,)

    def route(
        self,
        method: str,
        path: str,
        handler: Handler,
        style: str = V1,
        logged: bool = True,
        access: str | None = None,
    ) -> None:
        """Register ``handler``; ``access`` says who may call it (:data:`ACCESS_LEVELS`):
        ADMIN and BODIES routes are checked against :attr:`admin_auth` first."""
        if access is not None and access not in ACCESS_LEVELS:
            raise ValueError(f"unknown access level {access!r}")
        self.access[(method, path)] = access
        if access in (ADMIN, BODIES):
            handler = self._guarded(handler, access == BODIES)
        self.methods.add(method)
        self._add(method, path, (handler, style, logged))

    def _add(self, method: str, path: str, route: Route) -> None:
        if "/:" in path:
            prefix, _, name = path.rpartition(":")
            for p, n, table in self.param_routes:
                if p == prefix and n == name:
                    table[method] = route
                    return
            self.param_routes.append((prefix, name, {method: route}))
            return
        self.routes.setdefault(path, {})[method] = route

    def _guarded(self, handler: Handler, bodies: bool) -> Handler:
        async def guarded(request: Any, params: Params) -> Any:
            auth = self.admin_auth
            if auth is not None:
                auth.require(request, bodies=bodies)
            return await handler(request, params)

        return guarded

    def _lookup(self, path: str) -> tuple[dict[str, Route] | None, Params]:
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
        if path == "*":  # server-wide: every method routed anywhere
            return ", ".join(sorted(self.methods | {"OPTIONS"}))
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
        alt = path[:-1] if len(path) > 1 and path.endswith("/") else path + "/"
        if self._has(alt, method):
            return alt
        clean = clean_path(path)
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

    async def dispatch(self, request: Any) -> Any:
        path = request.path
        method = request.method
        table, params = self._lookup(path)
        if table is not None:
            route = table.get(method)
            if route is not None:
                return await self.call(request, route, params)
        if method in self.methods and method != "CONNECT" and path != "/":
            fixed = self._fixed_path(path, method)
            if fixed is not None:
                return self._redirect(request, fixed, 301 if method == "GET" else 307)
        if method == "OPTIONS":
            allow = self._allowed(path, method)
            if allow:
                return Response(200, b"", {"Allow": allow})
        else:
            allow = self._allowed(path, method)
            if allow:
                return await self.call(request, (self._method_not_allowed, V1, True), {"allow": allow})
        return await self.call(request, (self._not_found, V1, True), {})

    @staticmethod
    def _redirect(request: Any, path: str, code: int) -> Response:
        qs = raw_query(request)
        location = path + ("?" + qs if qs else "")
        headers = {"Location": location}
        if request.method in ("GET", "HEAD"):
            headers["Content-Type"] = "text/html; charset=utf-8"
            text = "Moved Permanently" if code == 301 else "Temporary Redirect"
            return Response(code, f'<a href="{_html_escape(location)}">{text}</a>.\n\n'.encode(), headers)
        return Response(code, b"", headers)

    @staticmethod
    async def _not_found(request: Any, params: Params) -> Any:
        raise HTTPError(404, "NOT_FOUND")

    @staticmethod
    async def _method_not_allowed(request: Any, params: Params) -> Any:
        raise HTTPError(405, "METHOD_NOT_ALLOWED")

    async def call(self, request: Any, route: Route, params: Params) -> Any:
        """Run one handler in its response style; log it like Go's ``Log`` decorator."""
        handler, style, logged = route
        start = time.perf_counter_ns()
        status = 200
        resp: Any
        try:
            data = await handler(request, params)
        except HTTPError as e:
            status = e.status
            if style == PLAIN and not e.auth:
                resp = respond_plain(e.text, status)
            else:
                extra = {"Allow": params["allow"]} if status == 405 and "allow" in params else e.headers
                resp = respond_v1_error(status, e.text, extra)
        except Exception:
            # Go's PanicHandler: log it, answer 500 INTERNAL_ERROR
            self.log.exception("panic in HTTP handler - %s %s", request.method, request.path)
            status = 500
            resp = respond_v1_error(500, "INTERNAL_ERROR")
        else:
            if isinstance(data, self.response_types):
                resp = data
                status = resp.status
            elif style == PLAIN:
                resp = respond_plain(data or "")
            else:
                resp = respond_v1(data)
        if logged:
            self.log.info(
                "%d %s %s (%s) %s",
                status,
                request.method,
                request.raw_path,
                request.remote,
                format_duration_ns(time.perf_counter_ns() - start),
            )
        return resp
