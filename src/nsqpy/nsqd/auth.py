"""nsqd's AUTH against auth servers (Go's ``internal/auth``).

A client sends ``AUTH <secret>``; nsqd asks the ``--auth-http-address`` servers, in random
order until one answers, ``GET <addr>/auth?common_name=&remote_ip=&secret=&tls=`` (or the
full URL given, or a POST form with ``--auth-http-request-method=post``) and caches the
answer for its ``ttl`` seconds::

    {"ttl": 3600, "identity": "...", "identity_url": "...",
     "authorizations": [{"topic": "<regex>", "channels": ["<regex>"],
                         "permissions": ["subscribe", "publish"]}]}

A publish needs an authorization with ``publish`` whose topic regex matches the topic and
one of whose channel regexes matches the empty string; a SUB one with ``subscribe`` whose
topic and channel regexes match (Go's unanchored ``MatchString``, here ``re.search``).
"""

from __future__ import annotations

import json
import re
import ssl
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import aiohttp

from ..goflags import go_quote

#: Permissions an auth server may grant.
PERMISSIONS = frozenset({"subscribe", "publish"})


class AuthError(Exception):
    """An auth server could not be asked, or its answer is unusable (logged, never sent to
    the client, which only learns ``E_AUTH_FAILED AUTH failed``)."""


@dataclass(frozen=True)
class Authorization:
    topic: re.Pattern[str]
    channels: tuple[re.Pattern[str], ...]
    permissions: frozenset[str]

    def is_allowed(self, topic: str, channel: str) -> bool:
        """Go's ``Authorization.IsAllowed``: ``channel`` is "" for a publish."""
        if ("subscribe" if channel else "publish") not in self.permissions:
            return False
        if self.topic.search(topic) is None:
            return False
        return any(c.search(channel) is not None for c in self.channels)


@dataclass
class AuthState:
    ttl: int
    identity: str = ""
    identity_url: str = ""
    authorizations: list[Authorization] = field(default_factory=list)
    #: time.monotonic() after which the answer must be fetched again
    expires: float = 0.0

    def is_allowed(self, topic: str, channel: str) -> bool:
        return any(a.is_allowed(topic, channel) for a in self.authorizations)

    def is_expired(self) -> bool:
        return self.expires < time.monotonic()


def _compile(kind: str, pattern: Any) -> re.Pattern[str]:
    if not isinstance(pattern, str):
        raise AuthError(f"unable to compile {kind} {pattern!r} - not a string")
    try:
        return re.compile(pattern)
    except re.error as e:
        raise AuthError(f"unable to compile {kind} {go_quote(pattern)} {e}") from None


def parse_auth_response(doc: Any) -> AuthState:
    """An auth server's JSON answer, validated as Go does (known permissions, compilable
    regexes, ttl > 0)."""
    if not isinstance(doc, dict):
        raise AuthError("invalid response - not a JSON object")
    ttl = doc.get("ttl", 0)
    if isinstance(ttl, bool) or not isinstance(ttl, int):
        raise AuthError(f"invalid response - ttl {ttl!r} is not an integer")
    auths = []
    for a in doc.get("authorizations") or []:
        if not isinstance(a, dict):
            raise AuthError("invalid response - an authorization is not an object")
        perms = a.get("permissions") or []
        if not isinstance(perms, list):
            raise AuthError("invalid response - permissions is not a list")
        for p in perms:
            if p not in PERMISSIONS:
                raise AuthError(f"unknown permission {p}")
        chans = a.get("channels") or []
        if not isinstance(chans, list):
            raise AuthError("invalid response - channels is not a list")
        auths.append(
            Authorization(
                topic=_compile("topic", a.get("topic", "")),
                channels=tuple(_compile("channel", c) for c in chans),
                permissions=frozenset(perms),
            )
        )
    if ttl <= 0:
        raise AuthError(f"invalid TTL {ttl} (must be >0)")
    identity = doc.get("identity") or ""
    identity_url = doc.get("identity_url") or ""
    if not isinstance(identity, str) or not isinstance(identity_url, str):
        raise AuthError("invalid response - identity is not a string")
    return AuthState(
        ttl=ttl,
        identity=identity,
        identity_url=identity_url,
        authorizations=auths,
        expires=time.monotonic() + ttl,
    )


class AuthClient:
    """Asks the auth servers for one daemon (one aiohttp session, Go's timeouts)."""

    def __init__(
        self,
        addresses: list[str],
        *,
        method: str = "get",
        connect_timeout: float = 2.0,
        request_timeout: float = 5.0,
        root_ca_file: str = "",
    ) -> None:
        import aiohttp  # only with --auth-http-address: an nsqd without AUTH never loads it

        self.addresses = list(addresses)
        self.method = method
        self._timeout = aiohttp.ClientTimeout(total=request_timeout, connect=connect_timeout)
        self._ssl: ssl.SSLContext | bool = True
        if root_ca_file:
            self._ssl = ssl.create_default_context(cafile=root_ca_file)
        self._session: aiohttp.ClientSession | None = None

    @property
    def enabled(self) -> bool:
        return bool(self.addresses)

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def query_any(self, remote_ip: str, tls: bool, common_name: str, secret: str) -> AuthState:
        """Go's ``QueryAnyAuthd``: the servers in random order, the first answer wins."""
        import random

        addrs = self.addresses
        start = random.randrange(len(addrs))
        errors: list[str] = []
        for i in range(len(addrs)):
            addr = addrs[(start + i) % len(addrs)]
            try:
                return await self.query(addr, remote_ip, tls, common_name, secret)
            except AuthError as e:
                errors.append(f"failed to auth against {addr} - {e}")
        raise AuthError("; ".join(errors))

    async def query(self, addr: str, remote_ip: str, tls: bool, common_name: str, secret: str) -> AuthState:
        values = {
            "common_name": common_name,
            "remote_ip": remote_ip,
            "secret": secret,
            "tls": "true" if tls else "false",
        }
        import urllib.parse

        import aiohttp

        base = addr if "://" in addr else f"http://{addr}/auth"
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        try:
            if self.method == "post":
                req = self._session.post(base, data=values, ssl=self._ssl)
            else:
                req = self._session.get(f"{base}?{urllib.parse.urlencode(values)}", ssl=self._ssl)
            async with req as resp:
                body = await resp.read()
                if resp.status != 200:
                    raise AuthError(f"got response {resp.status} {body[:200]!r}")
        except (aiohttp.ClientError, TimeoutError, OSError, ValueError) as e:
            raise AuthError(str(e) or type(e).__name__) from None
        try:
            doc = json.loads(body)
        except ValueError as e:
            raise AuthError(f"invalid response - {e}") from None
        except RecursionError:  # nested deeper than the interpreter's recursion limit
            raise AuthError("invalid response - exceeded max depth") from None
        return parse_auth_response(doc)
