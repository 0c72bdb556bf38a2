"""The HTTP client nsqadmin queries nsqd, nsqlookupd and graphite with: Go's
``internal/http_api.Client`` on aiohttp.

- ``GETV1``/``POSTV1``: ``Accept: application/vnd.nsq; version=1.0``; any status but 200 is
  an error ``got response <status line> <body %q>``; a 403 on plain HTTP is retried once on
  HTTPS at the ``https_port`` the body names (nsqd's ``TLS_REQUIRED`` answer; a 403 JSON
  object without one, as an nsqpy nsqd's ``FORBIDDEN``, is an error as it stands).
- Timeouts as Go's deadline transport: ``--http-client-connect-timeout`` for the connection,
  ``--http-client-request-timeout`` for the whole request; TLS as the ``--http-client-tls-*``
  options say.
- ``bearer_token`` (nsqpy's ``--admin-token-file``) goes to nsqd and nsqlookupd as
  ``Authorization: Bearer``, never to graphite (``auth=False``).
- Errors read like Go's ``net/http`` ones (``Get "http://…": dial tcp …: connect: connection
  refused``), because they end up verbatim in nsqadmin's ``message`` and 502 bodies.
"""

from __future__ import annotations

import asyncio
import json
import ssl
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import aiohttp
import yarl

from ..goflags import go_quote

__all__ = ["Client", "HTTPClientError", "go_json_error"]

ACCEPT_V1 = "application/vnd.nsq; version=1.0"


class HTTPClientError(Exception):
    """A failed request; ``str()`` is what Go's client error would print. ``message`` is the
    ``{"message": ...}`` of an error answer, when it had one."""

    def __init__(self, text: str, message: str = "") -> None:
        super().__init__(text)
        self.message = message


def go_json_error(data: bytes | str, exc: json.JSONDecodeError | None = None) -> str:
    """Go's ``encoding/json`` message for a document that does not parse (approximated from
    Python's: the offending character and what the parser was looking for)."""
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    pos = exc.pos if exc is not None else 0
    while pos < len(text) and text[pos] in " \t\r\n":
        pos += 1
    msg = exc.msg if exc is not None else "Expecting value"
    if pos >= len(text) or msg.startswith("Unterminated"):
        return "unexpected end of JSON input"
    ch = text[pos]
    quoted = "'\\''" if ch == "'" else f"'{ch}'"
    if msg.startswith("Extra data"):
        where = "after top-level value"
    elif "':'" in msg:
        where = "after object key"
    elif "','" in msg:
        where = "after object key:value pair"
    elif "property name" in msg:
        where = "looking for beginning of object key string"
    else:
        where = "looking for beginning of value"
    return f"invalid character {quoted} {where}"


def _dial_target(url: str) -> str:
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    host = f"[{host}]" if ":" in host else host
    return f"{host}:{port}"


def _go_error(method: str, url: str, exc: BaseException) -> HTTPClientError:
    """A Go ``*url.Error`` text for an aiohttp/OS failure."""
    verb = method.capitalize()
    target = _dial_target(url)
    if isinstance(exc, aiohttp.ClientConnectorDNSError):
        host = urlsplit(url).hostname or ""
        reason = f"dial tcp: lookup {host}: no such host"
    elif isinstance(exc, aiohttp.ClientConnectorCertificateError):
        reason = f"tls: failed to verify certificate: {exc.certificate_error}"
    elif isinstance(exc, aiohttp.ClientConnectorError):
        os_err = exc.os_error
        if isinstance(os_err, ConnectionRefusedError):
            reason = f"dial tcp {target}: connect: connection refused"
        elif isinstance(os_err, TimeoutError | asyncio.TimeoutError):
            reason = f"dial tcp {target}: i/o timeout"
        else:
            msg = os_err.strerror if isinstance(os_err, OSError) and os_err.strerror else None
            reason = f"dial tcp {target}: connect: {(msg or str(os_err)).lower()}"
    elif isinstance(exc, aiohttp.ConnectionTimeoutError):
        reason = f"dial tcp {target}: i/o timeout"
    elif isinstance(exc, TimeoutError | asyncio.TimeoutError):
        reason = "context deadline exceeded (Client.Timeout exceeded while awaiting headers)"
    elif isinstance(exc, aiohttp.ServerDisconnectedError):
        reason = "EOF"
    elif isinstance(exc, aiohttp.InvalidURL | aiohttp.NonHttpUrlClientError):
        reason = f'unsupported protocol scheme "{urlsplit(url).scheme}"'
    else:
        reason = str(exc) or type(exc).__name__
    return HTTPClientError(f'{verb} "{url}": {reason}')


class Client:
    """Go's ``http_api.Client``: one connection pool, Go's timeouts and TLS settings."""

    def __init__(
        self,
        ssl_context: ssl.SSLContext | None,
        connect_timeout: float,
        request_timeout: float,
    ) -> None:
        self.ssl_context = ssl_context
        self.connect_timeout = connect_timeout
        self.request_timeout = request_timeout
        #: sent as ``Authorization: Bearer`` to nsqd and nsqlookupd ("" sends none)
        self.bearer_token = ""
        self._session: aiohttp.ClientSession | None = None

    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(
                ssl=self.ssl_context if self.ssl_context is not None else True,
                limit=100,
                keepalive_timeout=90,
            )
            self._session = aiohttp.ClientSession(
                connector=connector,
                timeout=aiohttp.ClientTimeout(
                    total=self.request_timeout or None,
                    sock_connect=self.connect_timeout or None,
                ),
                auto_decompress=True,
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def request(
        self,
        method: str,
        url: str,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, str, bytes]:
        """One request: (status, Go-style status line, body); HTTPClientError on failure."""
        try:
            target = yarl.URL(url, encoded=True)
        except (ValueError, TypeError) as e:
            raise HTTPClientError(f'parse "{url}": {e}') from None
        if target.scheme not in ("http", "https"):
            raise HTTPClientError(
                f'{method.capitalize()} "{url}": unsupported protocol scheme "{target.scheme}"'
            )
        try:
            async with self.session().request(
                method, target, data=body, headers=headers, allow_redirects=True
            ) as resp:
                data = await resp.read()
                return resp.status, f"{resp.status} {resp.reason or ''}".rstrip(), data
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError) as e:
            raise _go_error(method, url, e) from None

    async def _v1(self, method: str, endpoint: str, payload: Any = None, auth: bool = True) -> bytes:
        while True:
            headers = {"Accept": ACCEPT_V1}
            if auth and self.bearer_token:
                headers["Authorization"] = f"Bearer {self.bearer_token}"
            body = None
            if payload is not None:
                body = json.dumps(payload).encode()
                headers["Content-Type"] = "application/json"
            status, status_line, data = await self.request(method, endpoint, body, headers)
            if status == 200:
                return data
            if status == 403 and not endpoint.startswith("https") and _names_https_port(data):
                endpoint = _https_endpoint(endpoint, data)
                continue
            raise HTTPClientError(f"got response {status_line} {go_quote(_text(data))}", _message(data))

    async def get_v1(self, endpoint: str, auth: bool = True) -> Any:
        """Go's ``GETV1``: the decoded JSON body of a 200 answer (``auth=False``: without
        the admin token, for graphite)."""
        data = await self._v1("GET", endpoint, auth=auth)
        try:
            return json.loads(data)
        except json.JSONDecodeError as e:
            raise HTTPClientError(go_json_error(data, e)) from None
        except UnicodeDecodeError:
            raise HTTPClientError("invalid character in JSON input") from None

    async def post_v1(self, endpoint: str, payload: Any = None) -> None:
        """Go's ``POSTV1`` with no response value."""
        await self._v1("POST", endpoint, payload)

    async def post_v1_json(self, endpoint: str, payload: Any) -> Any:
        """POST ``payload`` as JSON; the decoded JSON answer."""
        data = await self._v1("POST", endpoint, payload)
        try:
            return json.loads(data)
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise HTTPClientError("invalid JSON in the answer") from None


def _message(data: bytes) -> str:
    """The ``message`` of an error answer's JSON body, else ""."""
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError):
        return ""
    msg = doc.get("message") if isinstance(doc, dict) else None
    return msg if isinstance(msg, str) else ""


def _text(data: bytes) -> str:
    return data.decode("utf-8", "replace")


def _names_https_port(body: bytes) -> bool:
    """Whether a 403 is nsqd's ``TLS_REQUIRED`` (its body names the ``https_port``). Go
    retries every 403 on HTTPS, at port 0 when the body names none; an nsqpy nsqd's 403
    ``FORBIDDEN`` (a wrong admin token) is reported as it is instead."""
    try:
        doc = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return True  # Go's error for a body that does not parse
    return not isinstance(doc, dict) or "https_port" in doc


def _https_endpoint(endpoint: str, body: bytes) -> str:
    """Go's ``httpsEndpoint``: the same URL on https at the body's ``https_port``."""
    try:
        doc = json.loads(body)
    except json.JSONDecodeError as e:
        raise HTTPClientError(go_json_error(body, e)) from None
    port = doc.get("https_port", 0) if isinstance(doc, dict) else 0
    if not isinstance(port, int) or isinstance(port, bool):
        raise HTTPClientError("json: cannot unmarshal into Go struct field .https_port of type int")
    parts = urlsplit(endpoint)
    host = parts.hostname or ""
    host = f"[{host}]" if ":" in host else host
    return urlunsplit(("https", f"{host}:{port}", parts.path, parts.query, parts.fragment))
