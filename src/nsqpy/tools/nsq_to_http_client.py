"""The HTTP side of ``nsq_to_http``: the requests NSQ 1.3's tool makes, over aiohttp.

What Go's tool sends, and so what this sends:

* ``--post URL``: ``POST URL`` with the message body, ``Content-Type: <--content-type>``,
  ``Content-Length``; success is any 2xx status.
* ``--get URL``: ``GET fmt.Sprintf(URL, url.QueryEscape(body))`` (the body escaped as a
  query component, space as ``+``, then put where the URL's single ``%s`` is, with Go's
  ``fmt`` rules for the rest of the URL: ``%%`` is ``%``, another verb takes the argument
  and leaves ``%s`` ``%!s(MISSING)``…); the URL is sent as written, not re-encoded; success
  is status 200 only.
* Headers: ``Host``, ``User-Agent: nsq_to_http v1.3.0``, ``Accept-Encoding: gzip`` (no
  ``Accept``), then each ``--header`` (name canonicalized as Go's ``Header.Set`` does,
  last one wins, ``Host``/``Content-Length``/``Transfer-Encoding``/``Trailer`` ignored as
  Go's request writer ignores them; a custom ``User-Agent``/``Content-Type`` replaces ours).
* ``--http-client-connect-timeout`` bounds the TCP connect, ``--http-client-request-timeout``
  the whole request including reading the response (0 disables either); the response body
  is read and dropped, and failing to read it all (a timeout, a cut connection) fails the
  request whatever its status, as 1.3's checked ``io.Copy``. Redirects are followed (10 at
  most), no cookies are kept, and ``HTTP_PROXY``/``HTTPS_PROXY``/``NO_PROXY`` apply except
  to loopback hosts (Go's ``ProxyFromEnvironment``).

Every failure is a :class:`PublishError` whose text is shaped like Go's
(``got status code 500``, ``Post "http://…": dial tcp 127.0.0.1:1: connect: connection
refused``…).
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import re
import urllib.parse
import urllib.request
from collections.abc import Iterable, Mapping
from typing import Final

import aiohttp
import yarl

from nsqpy.govalues import go_quote

__all__ = [
    "HTTPClient",
    "PublishError",
    "canonical_header_key",
    "get_endpoint",
    "go_sprintf",
    "parse_custom_headers",
    "query_escape",
]

#: Headers Go's request writer takes from elsewhere (a custom value is not sent).
IGNORED_HEADERS: Final = frozenset({"Host", "Content-Length", "Transfer-Encoding", "Trailer"})

#: Go's error when the request timeout ends the reading of the response body.
BODY_TIMEOUT: Final = "context deadline exceeded (Client.Timeout or context cancellation while reading body)"

_TOKEN: Final = frozenset("!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")
_BAD_ESCAPE: Final = re.compile(r"%(?![0-9A-Fa-f]{2})")


class PublishError(Exception):
    """A request that did not succeed (the message is requeued)."""


# --- the message in the URL --------------------------------------------------------------


def query_escape(body: bytes) -> str:
    """Go's ``url.QueryEscape``: all but ``A-Za-z0-9-_.~`` as ``%XX``, space as ``+``."""
    return urllib.parse.quote_plus(body, safe="")


def go_sprintf(fmt: str, arg: str) -> str:
    """Go's ``fmt.Sprintf(fmt, arg)`` for one string argument.

    Flags (``#0+- ``), width, precision, explicit ``[1]`` indexes and the verbs a string
    takes (``s``, ``v``, ``q``, ``x``, ``X``) as Go formats them; other verbs give
    ``%!d(string=…)``, verbs past the argument ``%!s(MISSING)``, a ``*`` width or precision
    ``%!(BADWIDTH)``/``%!(BADPREC)``, an unused argument ``%!(EXTRA string=…)``.
    """
    return _Printf(fmt, arg).run()


class _Printf:
    """The state of one :func:`go_sprintf` (Go's ``pp.doPrintf`` for a single argument)."""

    def __init__(self, fmt: str, arg: str) -> None:
        self.fmt = fmt
        self.arg = arg
        self.i = 0
        self.arg_used = False  # the next verb has no argument left
        self.reordered = False
        self.good_index = True
        self.out: list[str] = []

    def run(self) -> str:
        fmt, n, out = self.fmt, len(self.fmt), self.out
        while self.i < n:
            j = fmt.find("%", self.i)
            if j < 0:
                out.append(fmt[self.i :])
                break
            out.append(fmt[self.i : j])
            self.i = j + 1
            flags = ""
            while self.i < n and fmt[self.i] in "#0+- ":
                flags += fmt[self.i]
                self.i += 1
            self.good_index = True
            self._arg_index()
            width = self._number("%!(BADWIDTH)")
            prec: int | None = None
            if self.i < n and fmt[self.i] == ".":
                self.i += 1
                self._arg_index()
                prec = self._number("%!(BADPREC)")
                if prec is None:
                    prec = 0
            self._arg_index()
            if self.i >= n:
                out.append("%!(NOVERB)")
                break
            verb = fmt[self.i]
            self.i += 1
            if verb == "%":
                out.append("%")
            elif not self.good_index:
                out.append(f"%!{verb}(BADINDEX)")
            elif self.arg_used:
                out.append(f"%!{verb}(MISSING)")
            else:
                self.arg_used = True
                minus = "-" in flags
                out.append(
                    _format_string(
                        self.arg,
                        verb,
                        "#" in flags,
                        "0" in flags and not minus,
                        "+" in flags,
                        minus,
                        " " in flags,
                        width,
                        prec,
                    )
                )
        if not self.arg_used and not self.reordered:
            out.append(f"%!(EXTRA string={self.arg})")
        return "".join(out)

    def _arg_index(self) -> None:
        """``[n]``: the next verb takes argument n (the only argument is 1)."""
        fmt = self.fmt
        if self.i >= len(fmt) or fmt[self.i] != "[":
            return
        self.reordered = True
        close = fmt.find("]", self.i)
        if close < 0:
            self.good_index = False
            self.i = len(fmt)
            return
        digits = fmt[self.i + 1 : close]
        self.i = close + 1
        if digits.isdigit() and int(digits) == 1:
            self.arg_used = False
        else:
            self.good_index = False

    def _number(self, bad: str) -> int | None:
        """A width or precision: digits, or ``*`` (which takes the string argument: bad)."""
        fmt, n = self.fmt, len(self.fmt)
        if self.i < n and fmt[self.i] == "*":
            self.i += 1
            self.arg_used = True
            self.out.append(bad)
            return None
        start = self.i
        while self.i < n and fmt[self.i].isdigit():
            self.i += 1
        return int(fmt[start : self.i]) if self.i > start else None


def _format_string(
    s: str,
    verb: str,
    sharp: bool,
    zero: bool,
    plus: bool,
    minus: bool,
    space: bool,
    width: int | None,
    prec: int | None,
) -> str:
    if verb in "sv":
        text = go_quote(s) if verb == "v" and sharp else s if prec is None else s[:prec]
    elif verb == "q":
        t = s if prec is None else s[:prec]
        if sharp and "`" not in t and all(c == "\t" or (c >= " " and c != "\x7f") for c in t):
            text = f"`{t}`"
        elif plus:
            text = go_quote(t.encode("ascii", "backslashreplace").decode())
        else:
            text = go_quote(t)
    elif verb in "xX":
        data = s.encode()
        if prec is not None:
            data = data[:prec]
        digits = "0123456789abcdef" if verb == "x" else "0123456789ABCDEF"
        prefix = ("0x" if verb == "x" else "0X") if sharp else ""
        parts = [digits[b >> 4] + digits[b & 15] for b in data]
        text = " ".join(prefix + p for p in parts) if space else (prefix if parts else "") + "".join(parts)
    else:  # Go prints the argument with %v, the flags, width and precision still applying
        inner = _format_string(s, "s", False, zero, plus, minus, space, width, prec)
        return f"%!{verb}(string={inner})"
    if width is not None and len(text) < width:
        pad = width - len(text)
        if minus:
            text += " " * pad
        else:
            text = ("0" if zero else " ") * pad + text
    return text


def get_endpoint(address: str, body: bytes) -> str:
    """The URL Go's ``GetPublisher`` requests for ``body``."""
    return go_sprintf(address, query_escape(body))


# --- headers ------------------------------------------------------------------------------


def parse_custom_headers(items: Iterable[str]) -> dict[str, str]:
    """Go's ``parseCustomHeaders``: ``key:value`` (both trimmed, neither empty); the last
    of a repeated key wins. ValueError names the first bad item."""
    parsed: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition(":")
        key, value = key.strip(), value.strip()
        if not sep or not key or not value:
            raise ValueError(f"invalid header: {go_quote(item)}")
        parsed[key] = value
    return parsed


def canonical_header_key(key: str) -> str:
    """Go's ``textproto.CanonicalMIMEHeaderKey`` (``x-foo-bar`` → ``X-Foo-Bar``); a key with
    a byte that is not a token character is left as it is."""
    if not key or any(c not in _TOKEN for c in key):
        return key
    out = []
    upper = True
    for c in key:
        out.append(c.upper() if upper else c.lower())
        upper = c == "-"
    return "".join(out)


def _header_error(headers: Mapping[str, str]) -> str | None:
    """Go's transport refuses a request with a header it could not write."""
    for k, v in headers.items():
        if not k or any(c not in _TOKEN for c in k):
            return f"net/http: invalid header field name {go_quote(k)}"
        if any((ord(c) < 0x20 and c != "\t") or ord(c) == 0x7F for c in v):
            return f"net/http: invalid header field value for {go_quote(k)}"
    return None


# --- URLs, proxies and errors ---------------------------------------------------------------


def _parse_url(method: str, url: str) -> yarl.URL:
    """``http.NewRequest`` + the client's checks; raises PublishError as Go words it."""
    if any(ord(c) < 0x20 or ord(c) == 0x7F for c in url):
        raise PublishError(f"parse {go_quote(url)}: net/url: invalid control character in URL")
    before_query = url.split("?", 1)[0].split("#", 1)[0]
    bad = _BAD_ESCAPE.search(before_query)
    if bad is not None:
        raise PublishError(
            f"parse {go_quote(url)}: invalid URL escape "
            f"{go_quote(before_query[bad.start() : bad.start() + 3])}"
        )
    try:
        u = yarl.URL(url, encoded=True)
        scheme = u.scheme.lower()
        host = u.raw_host
        u.port  # noqa: B018 - a bad port is refused here, as Go's parser does
    except (ValueError, TypeError) as e:
        raise PublishError(f"parse {go_quote(url)}: {e}") from None
    op = method.capitalize()
    if scheme not in ("http", "https"):
        raise PublishError(f"{op} {go_quote(url)}: unsupported protocol scheme {go_quote(u.scheme)}")
    if not host:
        raise PublishError(f"{op} {go_quote(url)}: http: no Host in request URL")
    return u


def _is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def env_proxy(url: yarl.URL) -> str | None:
    """The proxy Go's ``http.ProxyFromEnvironment`` would use for ``url``, if any."""
    host = url.raw_host or ""
    if _is_loopback(host):
        return None
    proxies = urllib.request.getproxies_environment()
    proxy = proxies.get(url.scheme.lower())
    # NO_PROXY as urllib reads it (a stdlib function typeshed does not list)
    bypass = urllib.request.proxy_bypass_environment  # type: ignore[attr-defined]
    if not proxy or bypass(host, proxies):
        return None
    return proxy if "://" in proxy else "http://" + proxy


def _describe(method: str, url: str, u: yarl.URL, exc: BaseException) -> str:
    """A Go-shaped text for a failed request."""
    op = f"{method.capitalize()} {go_quote(url)}"
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return f"{op}: dial tcp {u.raw_host}:{u.port}: i/o timeout"
    if isinstance(exc, (asyncio.TimeoutError, aiohttp.ServerTimeoutError)):
        return f"{op}: context deadline exceeded (Client.Timeout exceeded while awaiting headers)"
    if isinstance(exc, aiohttp.ClientConnectorDNSError):
        err = exc.os_error
        why = (err.strerror or str(err)).lower()
        return f"{op}: dial tcp: lookup {exc.host}: {'no such host' if 'not known' in why else why}"
    if isinstance(exc, aiohttp.ClientConnectorError):
        err = exc.os_error
        why = os.strerror(err.errno) if err.errno else (err.strerror or str(err))
        return f"{op}: dial tcp {exc.host}:{exc.port}: connect: {why.lower()}"
    if isinstance(exc, aiohttp.ServerDisconnectedError):
        return f"{op}: EOF"
    if isinstance(exc, aiohttp.TooManyRedirects):
        return f"{op}: stopped after 10 redirects"
    return f"{op}: {exc or type(exc).__name__}"


# --- the client -----------------------------------------------------------------------------


class HTTPClient:
    """Makes nsq_to_http's requests (create it on the running loop; :meth:`close` it)."""

    def __init__(
        self,
        *,
        user_agent: str,
        content_type: str,
        custom_headers: Mapping[str, str],
        connect_timeout: float,
        request_timeout: float,
    ) -> None:
        base = {"User-Agent": user_agent}
        extra = {}
        for k, v in custom_headers.items():
            key = canonical_header_key(k)
            if key not in IGNORED_HEADERS:
                extra[key] = v
        self.header_error = _header_error(extra)
        get_headers = {**base, **extra}
        post_headers = {**base, "Content-Type": content_type, **extra}
        for h in (get_headers, post_headers):
            if not any(k.lower() == "accept-encoding" for k in h):
                h["Accept-Encoding"] = "gzip"  # Go's transport asks for gzip by itself
        self.get_headers = get_headers
        self.post_headers = post_headers
        self.timeout = aiohttp.ClientTimeout(
            total=request_timeout if request_timeout > 0 else None,
            sock_connect=connect_timeout if connect_timeout > 0 else None,
        )
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=90.0),
            timeout=self.timeout,
            skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"),
            auto_decompress=False,
            cookie_jar=aiohttp.DummyCookieJar(),
            trust_env=False,
        )
        self._post_urls: dict[str, yarl.URL | PublishError] = {}

    async def close(self) -> None:
        await self.session.close()

    async def post(self, address: str, body: bytes) -> None:
        """Go's ``PostPublisher.Publish``: PublishError unless the status is 2xx."""
        u = self._post_urls.get(address)
        if u is None:
            try:
                u = _parse_url("POST", address)
            except PublishError as e:
                u = e
            self._post_urls[address] = u
        if isinstance(u, PublishError):
            raise u
        status = await self._request("POST", address, u, body, self.post_headers)
        if not 200 <= status < 300:
            raise PublishError(f"got status code {status}")

    async def get(self, address: str, body: bytes) -> None:
        """Go's ``GetPublisher.Publish``: PublishError unless the status is 200."""
        endpoint = get_endpoint(address, body)
        u = _parse_url("GET", endpoint)
        status = await self._request("GET", endpoint, u, None, self.get_headers)
        if status != 200:
            raise PublishError(f"got status code {status}")

    async def _request(
        self, method: str, url: str, u: yarl.URL, body: bytes | None, headers: Mapping[str, str]
    ) -> int:
        if self.header_error is not None:
            raise PublishError(f"{method.capitalize()} {go_quote(url)}: {self.header_error}")
        try:
            async with self.session.request(
                method, u, data=body, headers=headers, proxy=env_proxy(u)
            ) as resp:
                try:
                    while await resp.content.read(65536):
                        pass
                except TimeoutError:
                    raise PublishError(BODY_TIMEOUT) from None
                except aiohttp.ClientError:
                    raise PublishError("unexpected EOF") from None
                return resp.status
        except (TimeoutError, aiohttp.ClientError, OSError, ValueError) as e:
            raise PublishError(_describe(method, url, u, e)) from None
