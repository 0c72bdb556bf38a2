"""nsqadmin's HTTP server, as NSQ 1.3.0's ``nsqadmin/http.go`` (on :mod:`nsqpy.httpapi`).

Every route lives under ``--base-path`` (Go's ``path.Join(basePath, route)``):

- the page: ``GET /``, ``/topics``, ``/topics/:topic``, ``/topics/:topic/:channel``,
  ``/nodes``, ``/nodes/:node``, ``/counter``, ``/lookup`` all answer ``index.html`` (a
  single-page app), rendered per request (see :func:`render_index`);
- ``GET /static/*asset`` and ``/fonts/*asset``: files of the package's ``static/`` directory
  (or ``--dev-static-dir``); Go serves one path segment, nested paths are an nsqpy addition;
- ``GET /ping`` (plain ``OK``); ``GET /render`` proxied to graphite with
  ``--proxy-graphite``;
- the JSON API (``V1``: ``{"message": "<CODE>"}`` on errors): ``GET /api/topics``
  (``?inactive=true``), ``/api/topics/:topic``, ``/api/topics/:topic/:channel``,
  ``/api/nodes``, ``/api/nodes/:node``, ``/api/counter``, ``/api/graphite``;
  ``POST /api/topics`` (create), ``POST /api/topics/:topic[/:channel]`` (``pause``,
  ``unpause``, ``empty``), ``DELETE /api/topics/:topic[/:channel]``,
  ``DELETE /api/nodes/:node`` (tombstone); ``GET``/``PUT /config/:opt``;
- nsqpy's time series: ``GET /api/series/topics[/:topic[/:channel]]``
  (:mod:`nsqpy.nsqadmin.series`);
- nsqpy's queue settings: ``GET``/``POST /api/config/topics/:topic[/:channel]``, and
  messages: ``GET /api/peek/topics/:topic[/:channel]?n=`` (each nsqd's peek),
  ``POST /api/peek/topics/:topic/:channel`` (requeue or remove one message on one nsqd),
  ``POST /api/peek/topics/:topic`` (redrive), answered per node.

With nsqpy's ``--htpasswd-file`` (:mod:`nsqpy.nsqadmin.login`): ``GET``/``POST /login`` (the
form), ``POST /logout``, ``GET /api/session`` (who is signed in, and the CSRF token); every
other route but ``/ping``, ``/static/*`` and ``/fonts/*`` needs a session or HTTP Basic
credentials (``/api/*``, ``/config/*``, ``/render`` and every non-GET answer 401
``UNAUTHORIZED``, pages redirect to the login), a state-changing request through a session
needs ``X-CSRF-Token`` (403 ``INVALID_CSRF_TOKEN``), one sent from another site is refused
(403 ``CROSS_SITE_REQUEST``), and a client address that failed 5 logins in a minute is
answered 429 ``TOO_MANY_FAILED_LOGINS`` (``Retry-After``).

Reads answer 200 with ``"message": "WARNING: <errors>"`` when some node did not answer (what
the others said is there), 502 ``UPSTREAM_ERROR: <error>`` when nothing could be read.
Actions answer 403 ``FORBIDDEN`` when ``--admin-user`` is set and the ``--acl-http-header``
user (with ``--htpasswd-file``: the signed-in user) is not one of them, and are announced to
``--notification-http-endpoint``.
"""

from __future__ import annotations

import asyncio
import base64
import html as html_lib
import ipaddress
import json
import logging
import mimetypes
import posixpath
import socket
import ssl
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, quote, quote_plus, urlsplit

import aiohttp
import yarl
from aiohttp import web

from .. import NSQ_VERSION
from ..goflags import parse_log_level
from ..httpapi import (
    PLAIN,
    RAW,
    V1,
    HTTPError,
    Params,
    get_param,
    parse_query,
    read_max,
    respond_v1_error,
)
from ..protocol.names import is_valid_channel_name, is_valid_topic_name
from .aioserve import serve, to_aiohttp
from .clusterinfo import ClusterInfo, is_partial
from .httpclient import HTTPClientError, go_json_error
from .login import CSRF_HEADER, IDENTITY, Identity, LoginRefused, Session
from .options import config_value, parse_cidr
from .router import PatternRouter
from .types import TopicStats, go_number

if TYPE_CHECKING:
    from .nsqadmin import NSQAdmin

__all__ = [
    "STATIC_DIR",
    "HTTPServer",
    "decode_body",
    "expand_base_paths",
    "join_base",
    "maybe_warn_msg",
    "render_index",
    "render_login",
    "start_http",
]

log = logging.getLogger("nsqadmin")

#: ``?n=`` of a peek when none is given, and the most it may be (nsqd's own bounds)
DEFAULT_PEEK = 10
MAX_PEEK = 1000

#: The web UI shipped in the package.
STATIC_DIR = Path(__file__).resolve().parent / "static"

#: ``mime.TypeByExtension`` of Go's built-in table, then nsqadmin's own fallbacks.
_GO_MIME = {
    ".avif": "image/avif",
    ".css": "text/css; charset=utf-8",
    ".gif": "image/gif",
    ".htm": "text/html; charset=utf-8",
    ".html": "text/html; charset=utf-8",
    ".jpeg": "image/jpeg",
    ".jpg": "image/jpeg",
    ".js": "text/javascript; charset=utf-8",
    ".json": "application/json",
    ".mjs": "text/javascript; charset=utf-8",
    ".pdf": "application/pdf",
    ".png": "image/png",
    ".svg": "image/svg+xml",
    ".wasm": "application/wasm",
    ".webp": "image/webp",
    ".xml": "text/xml; charset=utf-8",
    ".map": "application/json",
    ".woff": "application/font-woff",
    ".ttf": "application/font-sfnt",
    ".eot": "application/vnd.ms-fontobject",
    ".woff2": "application/font-woff2",
    ".ico": "image/x-icon",
    ".txt": "text/plain; charset=utf-8",
}

#: The single-page app's paths (Go's ``indexHandler`` routes).
INDEX_PATHS = (
    "/",
    "/topics",
    "/topics/:topic",
    "/topics/:topic/:channel",
    "/nodes",
    "/nodes/:node",
    "/counter",
    "/lookup",
)


def join_base(base: str, p: str) -> str:
    """Go's ``path.Join(base, p)``."""
    joined = posixpath.normpath(f"{base}/{p}")
    while joined.startswith("//"):
        joined = joined[1:]
    return joined


def maybe_warn_msg(messages: list[str]) -> str:
    """Go's ``maybeWarnMsg``."""
    return "WARNING: " + "; ".join(messages) if messages else ""


def _js_string(s: str) -> str:
    """Text safe inside a quoted JavaScript string in an HTML ``<script>``."""
    out = []
    for ch in s:
        if ch in "\\'\"<>&" or ord(ch) < 0x20 or ch in "\u2028\u2029":
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return "".join(out)


def _script_json(obj: Any) -> str:
    """JSON safe inside an HTML ``<script>`` element."""
    return (
        json.dumps(obj, separators=(",", ":"))
        .replace("<", "\\u003c")
        .replace(">", "\\u003e")
        .replace("&", "\\u0026")
    )


def expand_base_paths(html: str, base_path: str) -> str:
    """Go's template function: ``{{basePath "/static/app.js"}}`` → the path under
    ``--base-path``."""
    out = []
    i = 0
    marker = '{{basePath "'
    while True:
        j = html.find(marker, i)
        if j == -1:
            out.append(html[i:])
            break
        end = html.find('"}}', j + len(marker))
        if end == -1:
            out.append(html[i:])
            break
        out.append(html[i:j])
        out.append(join_base(base_path, html[j + len(marker) : end]))
        i = end + 3
    return "".join(out)


def render_login(
    html: str, base_path: str, version: str, next_path: str, user: str, alert: str, kind: str
) -> str:
    """The login page (``static/login.html``): ``{{.Version}}``, ``{{.Next}}`` (where to go
    after), ``{{.User}}`` (the name typed before) and ``{{.Alert}}`` (a message box of
    ``kind``, or nothing), all HTML-escaped."""
    esc = html_lib.escape
    box = ""
    if alert:
        role = "alert" if kind == "error" else "status"
        box = (
            f'<div class="alert alert-{esc(kind)}" role="{role}" data-alert="{esc(kind)}">{esc(alert)}</div>'
        )
    html = expand_base_paths(html, base_path)
    for name, text in (
        ("Version", esc(version)),
        ("Next", esc(next_path)),
        ("User", esc(user)),
        ("Alert", box),
    ):
        html = html.replace("{{." + name + "}}", text)
    return html


def render_index(html: str, values: dict[str, Any], base_path: str) -> str:
    """Render ``index.html`` for one request.

    - ``{{basePath "/static/app.js"}}`` becomes the path under ``--base-path`` (Go's
      template function);
    - Go's template fields are substituted: ``{{.Version}}``, ``{{.ProxyGraphite}}``,
      ``{{.GraphEnabled}}``, ``{{.GraphiteURL}}``, ``{{.StatsdInterval}}``,
      ``{{.StatsdCounterFormat}}``, ``{{.StatsdGaugeFormat}}``, ``{{.StatsdPrefix}}``,
      ``{{.NSQLookupd}}`` (a JSON array), ``{{.IsAdmin}}`` (``true``/``false``), and
      ``{{.BasePath}}``;
    - before the first ``</head>`` (or at ``<!-- nsqadmin:config -->`` if present) a script
      defines Go's page globals (``VERSION``, ``IS_ADMIN``, ``BASE_PATH``, ``GRAPHITE_URL``,
      ``GRAPH_ENABLED``, ``STATSD_INTERVAL``, ``STATSD_COUNTER_FORMAT``,
      ``STATSD_GAUGE_FORMAT``, ``STATSD_PREFIX``, ``NSQLOOKUPD``, ``USER_AGENT``) and
      ``NSQADMIN``, an object with all of them plus the time-series settings.
    """
    html = expand_base_paths(html, base_path)
    fields = {
        "Version": _js_string(values["version"]),
        "ProxyGraphite": "true" if values["proxy_graphite"] else "false",
        "GraphEnabled": "true" if values["graph_enabled"] else "false",
        "GraphiteURL": _js_string(values["graphite_url"]),
        "StatsdInterval": str(values["statsd_interval"]),
        "StatsdCounterFormat": _js_string(values["statsd_counter_format"]),
        "StatsdGaugeFormat": _js_string(values["statsd_gauge_format"]),
        "StatsdPrefix": _js_string(values["statsd_prefix"]),
        "NSQLookupd": _script_json(values["nsqlookupd"]),
        "IsAdmin": "true" if values["is_admin"] else "false",
        "BasePath": _js_string(values["base_path"]),
    }
    for name, text in fields.items():
        html = html.replace("{{." + name + "}}", text)
    script = (
        "<script>"
        f"var USER_AGENT = 'nsqadmin';"
        f"var VERSION = '{fields['Version']}';"
        f"var GRAPHITE_URL = '{_js_string(values['page_graphite_url'])}';"
        f"var GRAPH_ENABLED = {fields['GraphEnabled']};"
        f"var STATSD_INTERVAL = {fields['StatsdInterval']};"
        f"var STATSD_COUNTER_FORMAT = '{fields['StatsdCounterFormat']}';"
        f"var STATSD_GAUGE_FORMAT = '{fields['StatsdGaugeFormat']}';"
        f"var STATSD_PREFIX = '{fields['StatsdPrefix']}';"
        f"var NSQLOOKUPD = {fields['NSQLookupd']};"
        f"var IS_ADMIN = {fields['IsAdmin']};"
        f"var BASE_PATH = '{fields['BasePath']}';"
        f"var NSQADMIN = {_script_json(values)};"
        "</script>"
    )
    slot = "<!-- nsqadmin:config -->"
    if slot in html:
        return html.replace(slot, script, 1)
    head = html.lower().find("</head>")
    if head == -1:
        return script + html
    return html[:head] + script + html[head:]


# --- Go's json.Decoder into a struct of string fields --------------------------------------------


def _go_struct_type(fields: tuple[str, ...]) -> str:
    parts = "; ".join(f'{f.capitalize()} string "json:\\"{f}\\""' for f in fields)
    return f"struct {{ {parts} }}"


def _json_kind(v: Any) -> str:
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, int | float):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "array"
    return "object"


def decode_body(data: bytes, fields: tuple[str, ...]) -> dict[str, str]:
    """Go's ``json.NewDecoder(req.Body).Decode(&body)`` into a struct of string ``fields``:
    the first JSON value only, keys matched case-insensitively, unknown keys ignored.
    ValueError carries Go's error text."""
    text = data.decode("utf-8", "replace")
    stripped = text.lstrip(" \t\r\n")
    if not stripped:
        raise ValueError("EOF")
    try:
        value, _ = json.JSONDecoder().raw_decode(stripped)
    except json.JSONDecodeError as e:
        msg = go_json_error(stripped, e)
        raise ValueError("unexpected EOF" if msg == "unexpected end of JSON input" else msg) from None
    out = dict.fromkeys(fields, "")
    if value is None:
        return out
    if not isinstance(value, dict):
        raise ValueError(
            f"json: cannot unmarshal {_json_kind(value)} into Go value of type {_go_struct_type(fields)}"
        )
    type_error = ""
    for key, v in value.items():
        name = key if key in fields else next((f for f in fields if f.lower() == key.lower()), None)
        if name is None or v is None:
            continue
        if not isinstance(v, str):
            type_error = type_error or (
                f"json: cannot unmarshal {_json_kind(v)} into Go struct field .{name} of type string"
            )
            continue
        out[name] = v
    if type_error:
        raise ValueError(type_error)
    return out


# --- the server --------------------------------------------------------------------------------


class HTTPServer:
    """Routes and handlers of nsqadmin, bound to one :class:`NSQAdmin`."""

    def __init__(self, admin: NSQAdmin) -> None:
        self.admin = admin
        self.ci: ClusterInfo = admin.ci
        self.router = PatternRouter(log)
        self._static_cache: dict[str, bytes] = {}
        base = admin.options.base_path

        def r(method: str, path: str, handler: Any, style: str = V1) -> None:
            self.router.route(method, join_base(base, path), handler, style)

        r("GET", "/", self.index)
        r("GET", "/ping", self.ping, PLAIN)
        for p in INDEX_PATHS[1:]:
            r("GET", p, self.index)
        r("GET", "/static/*asset", self.static_asset, PLAIN)
        r("GET", "/fonts/*asset", self.static_asset, PLAIN)
        if admin.options.proxy_graphite:
            r("GET", "/render", self.render_proxy, RAW)

        r("GET", "/api/topics", self.topics)
        r("GET", "/api/topics/:topic", self.topic)
        r("GET", "/api/topics/:topic/:channel", self.channel)
        r("GET", "/api/nodes", self.nodes)
        r("GET", "/api/nodes/:node", self.node)
        r("POST", "/api/topics", self.create_topic_channel)
        r("POST", "/api/topics/:topic", self.topic_action)
        r("POST", "/api/topics/:topic/:channel", self.channel_action)
        r("DELETE", "/api/nodes/:node", self.tombstone_node_for_topic)
        r("DELETE", "/api/topics/:topic", self.delete_topic)
        r("DELETE", "/api/topics/:topic/:channel", self.delete_channel)
        r("GET", "/api/config/topics/:topic", self.queue_config)
        r("GET", "/api/config/topics/:topic/:channel", self.queue_config)
        r("POST", "/api/config/topics/:topic", self.queue_config)
        r("POST", "/api/config/topics/:topic/:channel", self.queue_config)
        r("GET", "/api/peek/topics/:topic", self.peek)
        r("GET", "/api/peek/topics/:topic/:channel", self.peek)
        r("POST", "/api/peek/topics/:topic", self.redrive)
        r("POST", "/api/peek/topics/:topic/:channel", self.message_action)
        r("GET", "/api/counter", self.counter)
        r("GET", "/api/graphite", self.graphite)
        r("GET", "/config/:opt", self.config)
        r("PUT", "/config/:opt", self.config)

        if admin.sampler is not None:
            r("GET", "/api/series/topics", self.series_topics)
            r("GET", "/api/series/topics/:topic", self.series_topic)
            r("GET", "/api/series/topics/:topic/:channel", self.series_channel)
        if admin.login is not None:
            r("GET", "/login", self.login_page, RAW)
            r("POST", "/login", self.login_submit, RAW)
            r("POST", "/logout", self.logout, RAW)
            r("GET", "/api/session", self.session_info)

    async def dispatch(self, request: web.Request) -> web.StreamResponse:
        if self.admin.login is not None:
            refusal = await self._gate(request)
            if refusal is not None:
                return refusal
        resp = to_aiohttp(await self.router.dispatch(request))
        # Go's CompressHandler: gzip/deflate when the client accepts it
        accept = request.headers.get("Accept-Encoding", "")
        if isinstance(resp, web.Response) and resp.body and ("gzip" in accept or "deflate" in accept):
            resp.enable_compression()
        return resp

    @property
    def opts(self) -> Any:
        return self.admin.options

    def is_authorized_admin_request(self, request: web.Request) -> bool:
        """Go's ``isAuthorizedAdminRequest``: with no ``--admin-user`` everyone is. With
        ``--htpasswd-file`` the user is the signed-in one (the ACL header is not read)."""
        admin_users = self.opts.admin_users
        if self.admin.login is not None:
            identity = request.get(IDENTITY)
            return identity is not None and (not admin_users or identity.user in admin_users)
        if not admin_users:
            return True
        user = request.headers.get(self.opts.acl_http_header, "")
        return user in admin_users

    # --- nsqpy: the login ---------------------------------------------------------------------

    def _relative(self, path: str) -> str | None:
        """``path`` under ``--base-path`` (``/api/topics``), or None when outside it."""
        base = self.opts.base_path
        if base == "/":
            return path
        if path == base:
            return "/"
        return path[len(base) :] if path.startswith(base + "/") else None

    async def _gate(self, request: web.Request) -> web.StreamResponse | None:
        """Who the request is (set as its :data:`IDENTITY`), or the response refusing it."""
        login = self.admin.login
        assert login is not None
        rel = self._relative(request.path)
        if rel is None or rel == "/ping" or rel.startswith(("/static/", "/fonts/")):
            return None
        if rel in ("/login", "/logout"):
            return None  # their handlers check what they need
        method = request.method
        changes = method not in ("GET", "HEAD", "OPTIONS")
        session = login.session(request)
        identity: Identity | None = Identity(session.user, session) if session is not None else None
        if identity is None:
            try:
                identity = await login.basic(request)
            except LoginRefused as e:
                return await self._refuse(
                    request, 429, "TOO_MANY_FAILED_LOGINS", {"Retry-After": str(e.retry_after)}
                )
            except PermissionError:
                return await self._refuse(request, 401, "UNAUTHORIZED", self._challenge(request))
        if identity is None:
            if changes or rel == "/api" or rel.startswith(("/api/", "/config/")) or rel == "/render":
                return await self._refuse(request, 401, "UNAUTHORIZED", self._challenge(request))
            qs = request.rel_url.raw_query_string
            target = request.rel_url.raw_path + ("?" + qs if qs else "")
            location = join_base(self.opts.base_path, "/login") + "?next=" + quote(target, safe="/")
            return await self._refuse(request, 302, "", {"Location": location})
        if changes:
            if self._cross_site(request):
                return await self._refuse(request, 403, "CROSS_SITE_REQUEST")
            if identity.session is not None and not login.csrf_ok(
                identity.session, request.headers.get(CSRF_HEADER)
            ):
                return await self._refuse(request, 403, "INVALID_CSRF_TOKEN")
        request[IDENTITY] = identity
        return None

    async def _refuse(
        self, request: web.Request, status: int, text: str, headers: dict[str, str] | None = None
    ) -> web.StreamResponse:
        """A refusal, logged as the router logs every answer."""

        async def refuse(request: web.Request, params: Params) -> Any:
            if status == 302:
                return web.Response(status=302, headers=headers)
            raise HTTPError(status, text, headers)

        return to_aiohttp(await self.router.call(request, (refuse, V1, True), {}))

    @staticmethod
    def _challenge(request: web.Request) -> dict[str, str]:
        """``WWW-Authenticate: Basic`` for curl and scripts; not to the pages' own requests
        (``X-Requested-With``), which would make the browser ask for a password itself."""
        if request.headers.get("X-Requested-With"):
            return {}
        return {"WWW-Authenticate": 'Basic realm="nsqadmin", charset="UTF-8"'}

    @staticmethod
    def _cross_site(request: web.Request) -> bool:
        """A browser's request sent by another site's page (credentials a browser remembers,
        HTTP Basic ones included, must not act for it)."""
        if request.headers.get("Sec-Fetch-Site", "") == "cross-site":
            return True
        origin = request.headers.get("Origin")
        if origin is None:
            return False
        return origin == "null" or urlsplit(origin).netloc.lower() != (request.host or "").lower()

    @staticmethod
    def _secure(request: web.Request) -> bool:
        return request.secure or request.headers.get("X-Forwarded-Proto", "").lower() == "https"

    def _cookie_path(self) -> str:
        return str(self.opts.base_path)

    def _next_path(self, raw: str | None) -> str:
        """Where to go after the login: a path under ``--base-path`` on this server, else the
        base path."""
        base: str = self.opts.base_path
        if (
            not raw
            or not raw.startswith("/")
            or raw.startswith("//")
            or "\\" in raw
            or any(ord(c) < 0x20 for c in raw)
        ):
            return base
        rel = self._relative(urlsplit(raw).path)
        if rel is None or rel in ("/login", "/logout"):
            return base
        return raw

    async def _login_html(
        self,
        status: int,
        next_path: str,
        user: str = "",
        alert: str = "",
        kind: str = "error",
        headers: dict[str, str] | None = None,
    ) -> web.Response:
        template = await self._read_static("login.html") or b""
        page = render_login(
            template.decode("utf-8", "replace"),
            self.opts.base_path,
            NSQ_VERSION,
            next_path,
            user,
            alert,
            kind,
        )
        h = {"Content-Type": "text/html; charset=utf-8", **self._page_headers(), **(headers or {})}
        return web.Response(status=status, body=page.encode(), headers=h)

    def _page_headers(self) -> dict[str, str]:
        """With a login: pages are not cached (they hold a CSRF token) nor framed."""
        if self.admin.login is None:
            return {}
        return {
            "Cache-Control": "no-store",
            "X-Frame-Options": "DENY",
            "Content-Security-Policy": "frame-ancestors 'none'",
            "Referrer-Policy": "same-origin",
        }

    async def login_page(self, request: web.Request, params: Params) -> Any:
        values, _ = parse_query(request.rel_url.raw_query_string)
        next_path = self._next_path(get_param(values, "next"))
        login = self.admin.login
        assert login is not None
        if login.session(request) is not None:
            return web.Response(status=303, headers={"Location": next_path, "Cache-Control": "no-store"})
        if get_param(values, "signed_out") is not None:
            return await self._login_html(200, next_path, alert="You have signed out.", kind="success")
        return await self._login_html(200, next_path)

    async def login_submit(self, request: web.Request, params: Params) -> Any:
        login = self.admin.login
        assert login is not None
        body = await read_max(request, 65536)
        form = parse_qs(body.decode("utf-8", "replace"), keep_blank_values=True)
        user = (form.get("user") or [""])[0]
        password = (form.get("password") or [""])[0]
        next_path = self._next_path((form.get("next") or [""])[0])
        if self._cross_site(request):
            return await self._login_html(
                403, next_path, user, "Sign-in refused: the form was sent from another site."
            )
        try:
            ok = await login.attempt(request.remote or "", user, password, "form")
        except LoginRefused as e:
            return await self._login_html(
                429,
                next_path,
                user,
                f"Too many failed sign-ins from your address: try again in {e.retry_after} s.",
                headers={"Retry-After": str(e.retry_after)},
            )
        if not ok:
            return await self._login_html(401, next_path, user, "Wrong user name or password.")
        session = login.start_session(user)
        log.info("login: user %r from %s", user, request.remote)
        resp = web.Response(status=303, headers={"Location": next_path, "Cache-Control": "no-store"})
        login.set_cookie(resp, session, self._cookie_path(), self._secure(request))
        return resp

    async def logout(self, request: web.Request, params: Params) -> Any:
        """End the session (its CSRF token in ``X-CSRF-Token`` or the form's ``csrf_token``),
        then the login page."""
        login = self.admin.login
        assert login is not None
        session = login.session(request)
        if session is not None:
            token = request.headers.get(CSRF_HEADER)
            if token is None:
                form = parse_qs((await read_max(request, 65536)).decode("utf-8", "replace"))
                token = (form.get("csrf_token") or [""])[0]
            if self._cross_site(request) or not login.csrf_ok(session, token):
                return respond_v1_error(403, "INVALID_CSRF_TOKEN")
            login.end_session(session)
            log.info("logout: user %r from %s", session.user, request.remote)
        location = join_base(self.opts.base_path, "/login") + "?signed_out=1"
        resp = web.Response(status=303, headers={"Location": location, "Cache-Control": "no-store"})
        login.clear_cookie(resp, self._cookie_path(), self._secure(request))
        return resp

    async def session_info(self, request: web.Request, params: Params) -> Any:
        """Who is signed in: ``{"user", "is_admin", "via": "session" | "basic",
        "csrf_token" (a session's; "" for HTTP Basic), "expires" (unix seconds or null)}``."""
        identity = request[IDENTITY]
        session: Session | None = identity.session
        return {
            "user": identity.user,
            "is_admin": self.is_authorized_admin_request(request),
            "via": "session" if session is not None else "basic",
            "csrf_token": session.csrf_token if session is not None else "",
            "expires": int(session.expires_at) if session is not None else None,
        }

    def _require_admin(self, request: web.Request) -> None:
        if not self.is_authorized_admin_request(request):
            raise HTTPError(403, "FORBIDDEN")

    def _notify(self, action: str, topic: str, channel: str, node: str, request: web.Request) -> None:
        self.admin.notifier.notify(action, topic, channel, node, request)

    @staticmethod
    def _check(err: BaseException | None, what: str, messages: list[str]) -> None:
        """Go's ``if err != nil { pe, ok := err.(PartialErr); … }``: a partial failure is
        a warning, anything else is 502 ``UPSTREAM_ERROR``."""
        if err is None:
            return
        if not is_partial(err):
            log.error("%s - %s", what, err)
            raise HTTPError(502, f"UPSTREAM_ERROR: {err}")
        log.warning("%s", err)
        messages.append(str(err))

    def _addrs(self) -> tuple[list[str], list[str]]:
        return list(self.opts.nsqlookupd_http_addresses or ()), list(self.opts.nsqd_http_addresses or ())

    # --- pages and files --------------------------------------------------------------------

    async def ping(self, request: web.Request, params: Params) -> Any:
        return "OK"

    def page_values(self, request: web.Request) -> dict[str, Any]:
        """What the page needs to know (also ``NSQADMIN`` in the page)."""
        opts = self.opts
        base = opts.base_path
        sampler = self.admin.sampler
        identity = request.get(IDENTITY)
        if self.admin.login is not None:
            user = identity.user if identity is not None else ""
        else:
            user = request.headers.get(opts.acl_http_header, "") if opts.acl_http_header else ""
        session = identity.session if identity is not None else None
        return {
            "version": NSQ_VERSION,
            "base_path": base,
            "is_admin": self.is_authorized_admin_request(request),
            "user": user,
            # nsqpy's --htpasswd-file: how the page signs out and signs its actions
            "login": {
                "enabled": self.admin.login is not None,
                "via": "" if identity is None else "session" if session is not None else "basic",
                "csrf_token": session.csrf_token if session is not None else "",
            },
            "proxy_graphite": opts.proxy_graphite,
            "graph_enabled": opts.graphite_url != "",
            "graphite_url": opts.graphite_url,
            # where the page sends /render: through nsqadmin when proxied
            "page_graphite_url": (base.rstrip("/") if opts.proxy_graphite else opts.graphite_url),
            "statsd_interval": int(opts.statsd_interval),
            "statsd_counter_format": opts.statsd_counter_format,
            "statsd_gauge_format": opts.statsd_gauge_format,
            "statsd_prefix": opts.statsd_prefix,
            "nsqlookupd": list(opts.nsqlookupd_http_addresses),
            "nsqd": list(opts.nsqd_http_addresses),
            "series": {
                "enabled": sampler is not None,
                "interval": go_number(float(opts.stats_sample_interval)),
                "retention": go_number(float(opts.stats_retention)),
            },
        }

    async def _read_static(self, name: str) -> bytes | None:
        """A file of the static directory (``--dev-static-dir`` or the package's); None when
        it does not exist or the name leaves the directory."""
        parts = name.split("/")
        if any(p in ("", ".", "..") or p.startswith(".") for p in parts):
            return None
        dev = self.opts.dev_static_dir
        root = Path(dev) if dev else STATIC_DIR
        if not dev and name in self._static_cache:
            return self._static_cache[name]
        path = root.joinpath(*parts)

        def read() -> bytes | None:
            try:
                return path.read_bytes() if path.is_file() else None
            except OSError:
                return None

        data = await asyncio.get_running_loop().run_in_executor(None, read)
        if data is not None and not dev:
            self._static_cache[name] = data
        return data

    async def index(self, request: web.Request, params: Params) -> Any:
        asset = await self._read_static("index.html") or b""
        html = render_index(asset.decode("utf-8", "replace"), self.page_values(request), self.opts.base_path)
        return web.Response(body=html.encode(), headers={"Content-Type": "text/html", **self._page_headers()})

    async def static_asset(self, request: web.Request, params: Params) -> Any:
        name = params["asset"]
        if self.opts.dev_static_dir:
            log.debug("using dev dir %r for static asset %r", self.opts.dev_static_dir, name)
        data = await self._read_static(name)
        if data is None:
            raise HTTPError(404, "NOT_FOUND")
        ext = posixpath.splitext(name)[1].lower()
        ct = _GO_MIME.get(ext) or mimetypes.guess_type(name)[0] or "application/octet-stream"
        return web.Response(body=data, headers={"Content-Type": ct})

    async def render_proxy(self, request: web.Request, params: Params) -> Any:
        """``--proxy-graphite``: the request, path and query unchanged, to the graphite
        host (with the URL's basic-auth credentials); 502 when graphite does not answer."""
        target = yarl.URL(self.opts.graphite_url)
        url = yarl.URL.build(
            scheme=target.scheme,
            host=target.raw_host or "",
            port=target.explicit_port,
            path=request.rel_url.raw_path,
            query_string=request.rel_url.raw_query_string,
            encoded=True,
        )
        headers = {
            k: v
            for k, v in request.headers.items()
            if k.lower() not in _HOP_HEADERS and k.lower() not in ("host", "accept-encoding")
        }
        if request.remote:
            prior = request.headers.get("X-Forwarded-For")
            headers["X-Forwarded-For"] = f"{prior}, {request.remote}" if prior else request.remote
        if target.user is not None:
            # Go's SetBasicAuth with the credentials of --graphite-url
            creds = f"{target.user}:{target.password or ''}".encode()
            headers["Authorization"] = "Basic " + base64.b64encode(creds).decode()
        try:
            async with self.admin.client.session().get(url, headers=headers, allow_redirects=False) as resp:
                body = await resp.read()
                status, resp_headers = resp.status, resp.headers
        except (aiohttp.ClientError, OSError, TimeoutError) as e:
            log.error("http: proxy error: %s", e)
            return web.Response(status=502)
        out = {
            k: v
            for k, v in resp_headers.items()
            if k.lower() not in _HOP_HEADERS and k.lower() not in ("content-length", "content-encoding")
        }
        return web.Response(status=status, body=body, headers=out)

    # --- reads ----------------------------------------------------------------------------------

    async def topics(self, request: web.Request, params: Params) -> Any:
        messages: list[str] = []
        values, ok = parse_query(request.rel_url.raw_query_string)
        if not ok:
            raise HTTPError(400, _query_error(request.rel_url.raw_query_string))
        lookupds, nsqds = self._addrs()
        if lookupds:
            topics, err = await self.ci.get_lookupd_topics(lookupds)
        else:
            topics, err = await self.ci.get_nsqd_topics(nsqds)
        self._check(err, "failed to get topics", messages)

        if get_param(values, "inactive") == "true":
            topic_channels: dict[str, list[str] | None] = {}
            if lookupds:
                for name in topics or ():
                    producers, _ = await self.ci.get_lookupd_topic_producers(name, lookupds)
                    if not producers:
                        channels, _ = await self.ci.get_lookupd_topic_channels(name, lookupds)
                        topic_channels[name] = channels
            return {
                "topics": dict(sorted(topic_channels.items())),
                "message": maybe_warn_msg(messages),
            }
        return {"topics": topics, "message": maybe_warn_msg(messages)}

    async def topic(self, request: web.Request, params: Params) -> Any:
        messages: list[str] = []
        topic_name = params["topic"]
        lookupds, nsqds = self._addrs()
        producers, err = await self.ci.get_topic_producers(topic_name, lookupds, nsqds)
        self._check(err, "failed to get topic producers", messages)
        topic_stats, _, err = await self.ci.get_nsqd_stats(producers, topic_name, "", include_clients=False)
        self._check(err, "failed to get topic metadata", messages)
        all_nodes = TopicStats(topic_name)
        for t in topic_stats or ():
            all_nodes.add(t)
        return {**all_nodes.to_json(), "message": maybe_warn_msg(messages)}

    async def channel(self, request: web.Request, params: Params) -> Any:
        messages: list[str] = []
        topic_name = params["topic"]
        channel_name = params["channel"]
        lookupds, nsqds = self._addrs()
        producers, err = await self.ci.get_topic_producers(topic_name, lookupds, nsqds)
        self._check(err, "failed to get topic producers", messages)
        _, channel_stats, err = await self.ci.get_nsqd_stats(
            producers, topic_name, channel_name, include_clients=True
        )
        self._check(err, "failed to get channel metadata", messages)
        cs = (channel_stats or {}).get(channel_name)
        body = cs.to_json() if cs is not None else {}
        return {**body, "message": maybe_warn_msg(messages)}

    async def nodes(self, request: web.Request, params: Params) -> Any:
        messages: list[str] = []
        producers, err = await self.ci.get_producers(*self._addrs())
        self._check(err, "failed to get nodes", messages)
        return {
            "nodes": None if producers is None else [p.to_json() for p in producers],
            "message": maybe_warn_msg(messages),
        }

    async def node(self, request: web.Request, params: Params) -> Any:
        messages: list[str] = []
        node = params["node"]
        producers, err = await self.ci.get_producers(*self._addrs())
        self._check(err, "failed to get producers", messages)
        producer = next((p for p in producers or () if p.http_address() == node), None)
        if producer is None:
            raise HTTPError(404, "NODE_NOT_FOUND")
        topic_stats, _, err = await self.ci.get_nsqd_stats([producer], "", "", include_clients=True)
        if err is not None:
            log.error("failed to get nsqd stats - %s", err)
            raise HTTPError(502, f"UPSTREAM_ERROR: {err}")
        total_clients = 0
        total_messages = 0
        for ts in topic_stats or ():
            for cs in ts.channels or ():
                total_clients += len(cs.clients or ())
            total_messages += ts.message_count
        return {
            "node": node,
            "topics": None if topic_stats is None else [t.to_json() for t in topic_stats],
            "total_messages": total_messages,
            "total_clients": total_clients,
            "message": maybe_warn_msg(messages),
        }

    async def counter(self, request: web.Request, params: Params) -> Any:
        messages: list[str] = []
        stats: dict[str, dict[str, Any]] = {}
        producers, err = await self.ci.get_producers(*self._addrs())
        self._check(err, "failed to get counter producer list", messages)
        _, channel_stats, err = await self.ci.get_nsqd_stats(producers, "", "", include_clients=False)
        self._check(err, "failed to get nsqd stats", messages)
        for cs in (channel_stats or {}).values():
            for host in cs.node_stats or ():
                key = f"{cs.topic_name}:{cs.channel_name}:{host.node}"
                s = stats.get(key)
                if s is None:
                    s = stats[key] = {
                        "node": host.node,
                        "topic_name": cs.topic_name,
                        "channel_name": cs.channel_name,
                        "message_count": 0,
                    }
                s["message_count"] += host.message_count
        return {"stats": dict(sorted(stats.items())), "message": maybe_warn_msg(messages)}

    async def graphite(self, request: web.Request, params: Params) -> Any:
        values, ok = parse_query(request.rel_url.raw_query_string)
        if not ok:
            raise HTTPError(400, "INVALID_REQUEST")
        if get_param(values, "metric") != "rate":
            raise HTTPError(400, "INVALID_ARG_METRIC")
        target = get_param(values, "target")
        if target is None:
            raise HTTPError(400, "INVALID_ARG_TARGET")
        interval = int(self.opts.statsd_interval)
        query = "&".join(
            f"{k}={quote_plus(v, safe='')}"
            for k, v in (
                ("format", "json"),
                ("from", f"-{interval * 2}sec"),
                ("target", target),
                ("until", f"-{interval}sec"),
            )
        )
        url = f"{self.opts.graphite_url}/render?{query}"
        log.info("GRAPHITE: %s", url)
        try:
            response = await self.admin.client.get_v1(url, auth=False)
        except HTTPClientError as e:
            log.error("graphite request failed - %s", e)
            raise HTTPError(500, "INTERNAL_ERROR") from None
        try:
            rate = response[0]["datapoints"][0][0]
            rate = float(rate)
        except (IndexError, KeyError, TypeError, ValueError):
            # Go dereferences these without checks; its panic handler answers 500
            log.error("graphite response without a datapoint: %r", response)
            raise HTTPError(500, "INTERNAL_ERROR") from None
        if rate < 0:
            rate_str = "N/A"
        elif interval == 0:
            rate_str = "+Inf" if rate > 0 else "NaN"
        else:
            rate_str = f"{rate / interval:.2f}"
        return {"rate": rate_str}

    # --- actions --------------------------------------------------------------------------------

    async def _body(self, request: web.Request, fields: tuple[str, ...], error: str = "") -> dict[str, str]:
        data = await read_max(request, 1 << 20)
        try:
            return decode_body(data, fields)
        except ValueError as e:
            raise HTTPError(400, error or str(e)) from None

    async def tombstone_node_for_topic(self, request: web.Request, params: Params) -> Any:
        messages: list[str] = []
        self._require_admin(request)
        node = params["node"]
        body = await self._body(request, ("topic",), "INVALID_BODY")
        topic = body["topic"]
        if not is_valid_topic_name(topic):
            raise HTTPError(400, "INVALID_TOPIC")
        err = await self.ci.tombstone_node_for_topic(topic, node, self._addrs()[0])
        self._check(err, "failed to tombstone node for topic", messages)
        self._notify("tombstone_topic_producer", topic, "", node, request)
        return {"message": maybe_warn_msg(messages)}

    async def create_topic_channel(self, request: web.Request, params: Params) -> Any:
        messages: list[str] = []
        self._require_admin(request)
        body = await self._body(request, ("topic", "channel"))
        topic, channel = body["topic"], body["channel"]
        if not is_valid_topic_name(topic):
            raise HTTPError(400, "INVALID_TOPIC")
        if channel and not is_valid_channel_name(channel):
            raise HTTPError(400, "INVALID_CHANNEL")
        err = await self.ci.create_topic_channel(topic, channel, self._addrs()[0])
        self._check(err, "failed to create topic/channel", messages)
        self._notify("create_topic", topic, "", "", request)
        if channel:
            self._notify("create_channel", topic, channel, "", request)
        return {"message": maybe_warn_msg(messages)}

    async def delete_topic(self, request: web.Request, params: Params) -> Any:
        messages: list[str] = []
        self._require_admin(request)
        topic = params["topic"]
        err = await self.ci.delete_topic(topic, *self._addrs())
        self._check(err, "failed to delete topic", messages)
        self._notify("delete_topic", topic, "", "", request)
        return {"message": maybe_warn_msg(messages)}

    async def delete_channel(self, request: web.Request, params: Params) -> Any:
        messages: list[str] = []
        self._require_admin(request)
        topic, channel = params["topic"], params["channel"]
        err = await self.ci.delete_channel(topic, channel, *self._addrs())
        self._check(err, "failed to delete channel", messages)
        self._notify("delete_channel", topic, channel, "", request)
        return {"message": maybe_warn_msg(messages)}

    async def topic_action(self, request: web.Request, params: Params) -> Any:
        return await self._topic_channel_action(request, params["topic"], "")

    async def channel_action(self, request: web.Request, params: Params) -> Any:
        return await self._topic_channel_action(request, params["topic"], params["channel"])

    async def _topic_channel_action(self, request: web.Request, topic: str, channel: str) -> Any:
        messages: list[str] = []
        self._require_admin(request)
        action = (await self._body(request, ("action",)))["action"]
        if action not in ("pause", "unpause", "empty"):
            raise HTTPError(400, "INVALID_ACTION")
        lookupds, nsqds = self._addrs()
        if channel:
            err = await self.ci.channel_action(action, topic, channel, lookupds, nsqds)
            self._notify(f"{action}_channel", topic, channel, "", request)
        else:
            err = await self.ci.topic_action(action, topic, lookupds, nsqds)
            self._notify(f"{action}_topic", topic, "", "", request)
        self._check(err, f"failed to {action} topic/channel", messages)
        return {"message": maybe_warn_msg(messages)}

    # --- nsqpy: queue policies ------------------------------------------------------------------

    async def queue_config(self, request: web.Request, params: Params) -> Any:
        """GET: a topic's or channel's settings on every nsqd that has the topic; POST
        (admins): set the keys the JSON body names on each of them. ``{"nodes": [{"node",
        "hostname", "config" | "error"}], "message"}`` (the message warns of the nodes that
        failed)."""
        topic, channel = params["topic"], params.get("channel", "")
        settings = None
        if request.method == "POST":
            self._require_admin(request)
            settings = await self._json_object(request)
        lookupds, nsqds = self._addrs()
        nodes, err = await self.ci.queue_config(topic, channel, lookupds, nsqds, settings)
        answer = self._per_node_answer(nodes, err)
        if settings is not None:
            what = f"{topic}/{channel}" if channel else topic
            self._notify("config_channel" if channel else "config_topic", topic, channel, "", request)
            log.info("set queue settings of %s: %s", what, json.dumps(settings))
        return answer

    def _per_node_answer(self, nodes: list[dict[str, Any]], err: BaseException | None) -> dict[str, Any]:
        """``{"nodes": [...], "message"}`` of a per-node call: 502 when the topic's nsqd
        could not be found; the message warns of a partial lookup and of the nodes that
        failed."""
        messages: list[str] = []
        self._check(err, "failed to get topic producers", messages)
        failed = [f"{n['node']}: {n['error']}" for n in nodes if "error" in n]
        if failed:
            messages.append("failed on " + "; ".join(failed))
        return {"nodes": nodes, "message": maybe_warn_msg(messages)}

    async def _json_object(self, request: web.Request) -> dict[str, Any]:
        """The request's body, a JSON object (else 400 ``INVALID_BODY``)."""
        body = await read_max(request, 65537)
        try:
            doc = json.loads(body or b"null")
        except (ValueError, UnicodeDecodeError):
            raise HTTPError(400, "INVALID_BODY") from None
        if not isinstance(doc, dict):
            raise HTTPError(400, "INVALID_BODY")
        return doc

    # --- nsqpy: messages (peek, requeue, remove, redrive) -----------------------------------------

    async def peek(self, request: web.Request, params: Params) -> Any:
        """Up to ``?n=`` (10; 1 to 1000) of the messages a topic's backlog or a channel
        holds on every nsqd that has the topic, nothing consumed: ``{"nodes": [{"node",
        "hostname", "peek" | "error"}], "message"}``. Bodies can be sensitive: with
        ``--admin-user``, admins only."""
        self._require_admin(request)
        values, ok = parse_query(request.rel_url.raw_query_string)
        if not ok:
            raise HTTPError(400, "INVALID_REQUEST")
        raw = get_param(values, "n")
        n = DEFAULT_PEEK
        if raw:
            if not (raw.isascii() and raw.isdigit()) or not 1 <= int(raw) <= MAX_PEEK:
                raise HTTPError(400, "INVALID_N")
            n = int(raw)
        topic, channel = params["topic"], params.get("channel", "")
        nodes, err = await self.ci.peek(topic, channel, n, *self._addrs())
        return self._per_node_answer(nodes, err)

    async def message_action(self, request: web.Request, params: Params) -> Any:
        """Admins: ``{"action": "requeue" | "remove", "node": "<host:port>", "id":
        "<message id>"}`` on one nsqd of the topic: ``{"nodes": [{"node", "hostname",
        "done": true} | {..., "error"}], "message"}``; 404 ``NODE_NOT_FOUND`` when that
        nsqd does not have the topic."""
        self._require_admin(request)
        topic, channel = params["topic"], params["channel"]
        doc = await self._json_object(request)
        action = doc.get("action")
        if action not in ("requeue", "remove"):
            raise HTTPError(400, "INVALID_ACTION")
        node, msg_id = doc.get("node"), doc.get("id")
        if node is None or node == "":
            raise HTTPError(400, "MISSING_ARG_NODE")
        if not isinstance(node, str):
            raise HTTPError(400, "INVALID_NODE")
        if msg_id is None or msg_id == "":
            raise HTTPError(400, "MISSING_ARG_ID")
        if not isinstance(msg_id, str) or len(msg_id) != 16 or not msg_id.isascii():
            raise HTTPError(400, "INVALID_MESSAGE_ID")
        nodes, err = await self.ci.message_action(action, topic, channel, node, msg_id, *self._addrs())
        answer = self._per_node_answer(nodes, err)
        if not nodes:
            raise HTTPError(404, "NODE_NOT_FOUND")
        self._notify(f"{action}_message", topic, channel, node, request)
        log.info("%s message %s of %s/%s on %s", action, msg_id, topic, channel, node)
        return answer

    async def redrive(self, request: web.Request, params: Params) -> Any:
        """Admins: ``{"action": "redrive", "destination": "<topic>", "n": <count> | null,
        "channel": "<channel>" | null}``: the topic's backlog (or its channel's queue) moved
        to the destination on every nsqd that has the topic, at most ``n`` in all:
        ``{"nodes": [{"node", "hostname", "moved": k} | {..., "error"}], "moved": <total>,
        "message"}``."""
        self._require_admin(request)
        topic = params["topic"]
        doc = await self._json_object(request)
        if doc.get("action") != "redrive":
            raise HTTPError(400, "INVALID_ACTION")
        dest = doc.get("destination")
        if dest is None or dest == "":
            raise HTTPError(400, "MISSING_ARG_DESTINATION")
        if not isinstance(dest, str) or not is_valid_topic_name(dest):
            raise HTTPError(400, "INVALID_DESTINATION")
        n = doc.get("n")
        if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n < 1):
            raise HTTPError(400, "INVALID_N")
        channel = doc.get("channel") or ""
        if not isinstance(channel, str) or (channel and not is_valid_channel_name(channel)):
            raise HTTPError(400, "INVALID_CHANNEL")
        if dest == topic and not channel:
            raise HTTPError(400, "DESTINATION_IS_TOPIC")
        nodes, err = await self.ci.redrive(topic, dest, n, channel, *self._addrs())
        answer = self._per_node_answer(nodes, err)
        answer["moved"] = sum(e.get("moved", 0) for e in nodes)
        self._notify("redrive_topic", topic, channel, "", request)
        what = f"{topic}/{channel}" if channel else topic
        log.info("redrive %s to %s (n=%s): %d moved", what, dest, n, answer["moved"])
        return answer

    # --- /config ---------------------------------------------------------------------------------

    async def config(self, request: web.Request, params: Params) -> Any:
        opt = params["opt"]
        cidr = self.opts.allow_config_from_cidr
        if cidr:
            network = parse_cidr(cidr)
            try:
                ip = ipaddress.ip_address((request.remote or "").split("%")[0])
            except ValueError:
                log.error("failed to parse RemoteAddr %s", request.remote)
                raise HTTPError(400, "INVALID_REMOTE_ADDR") from None
            if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
                ip = ip.ipv4_mapped
            if ip.version != network.version or ip not in network:
                raise HTTPError(403, "FORBIDDEN")

        if request.method == "PUT":
            if self.admin.login is not None:
                self._require_admin(request)  # (Go has no users to ask: anyone in the CIDR)
            limit = 1024 * 1024 + 1
            body = await read_max(request, limit)
            if len(body) == limit or not body:
                raise HTTPError(413, "INVALID_VALUE")
            if opt == "nsqlookupd_http_addresses":
                try:
                    value = json.loads(body)
                except (json.JSONDecodeError, UnicodeDecodeError):
                    raise HTTPError(400, "INVALID_VALUE") from None
                if value is not None and (
                    not isinstance(value, list) or not all(isinstance(v, str) for v in value)
                ):
                    raise HTTPError(400, "INVALID_VALUE")
                self.admin.swap_options(nsqlookupd_http_addresses=value)
            elif opt == "log_level":
                try:
                    level = parse_log_level(body.decode("utf-8", "replace"))
                except ValueError:
                    raise HTTPError(400, "INVALID_VALUE") from None
                self.admin.swap_options(log_level=level)
            else:
                raise HTTPError(400, "INVALID_OPTION")
        try:
            return config_value(self.opts, opt)
        except KeyError:
            raise HTTPError(400, "INVALID_OPTION") from None

    # --- nsqpy: time series -----------------------------------------------------------------------

    def _series_selection(self, request: web.Request) -> list[int]:
        values, ok = parse_query(request.rel_url.raw_query_string)
        if not ok:
            raise HTTPError(400, "INVALID_REQUEST")
        sampler = self.admin.sampler
        assert sampler is not None
        bounds: dict[str, float | None] = {}
        for key, code in (("window", "INVALID_ARG_WINDOW"), ("since", "INVALID_ARG_SINCE")):
            raw = get_param(values, key)
            if raw is None or raw == "":
                bounds[key] = None
                continue
            try:
                bounds[key] = float(raw)
            except ValueError:
                raise HTTPError(400, code) from None
            if bounds[key] != bounds[key] or (key == "window" and bounds[key] < 0):  # type: ignore[operator]
                raise HTTPError(400, code)
        return sampler.store.samples(bounds["window"], bounds["since"])

    async def series_topics(self, request: web.Request, params: Params) -> Any:
        store = self.admin.sampler.store  # type: ignore[union-attr]
        numbers = self._series_selection(request)
        return {
            **store.header(numbers),
            "topics": {name: store.series_json(store.topics[name], numbers) for name in sorted(store.topics)},
            "message": store.message,
        }

    async def series_topic(self, request: web.Request, params: Params) -> Any:
        store = self.admin.sampler.store  # type: ignore[union-attr]
        numbers = self._series_selection(request)
        topic = params["topic"]
        channels = sorted(c for (t, c) in store.channels if t == topic)
        return {
            **store.header(numbers),
            "topic_name": topic,
            **store.series_json(store.topics.get(topic), numbers),
            "channels": {c: store.series_json(store.channels[(topic, c)], numbers) for c in channels},
            "message": store.message,
        }

    async def series_channel(self, request: web.Request, params: Params) -> Any:
        store = self.admin.sampler.store  # type: ignore[union-attr]
        numbers = self._series_selection(request)
        topic, channel = params["topic"], params["channel"]
        return {
            **store.header(numbers),
            "topic_name": topic,
            "channel_name": channel,
            **store.series_json(store.channels.get((topic, channel)), numbers),
            "message": store.message,
        }


_HOP_HEADERS = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
    }
)


def _query_error(raw: str) -> str:
    """Go's ``url.ParseQuery`` error text."""
    if ";" in raw:
        return "invalid semicolon separator in query"
    for part in raw.split("&"):
        i = part.find("%")
        while i != -1:
            esc = part[i : i + 3]
            if len(esc) < 3 or not all(c in "0123456789abcdefABCDEF" for c in esc[1:]):
                return f'invalid URL escape "{esc}"'
            i = part.find("%", i + 3)
    return "invalid query"


async def start_http(
    admin: NSQAdmin, sock: socket.socket, ssl_context: ssl.SSLContext | None = None
) -> web.AppRunner:
    """Serve nsqadmin on an already-bound listening socket (HTTPS with ``ssl_context``)."""
    return await serve(HTTPServer(admin).dispatch, sock, ssl_context)
