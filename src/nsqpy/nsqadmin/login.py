"""nsqadmin's own login (an nsqpy addition; Go's nsqadmin has none and trusts a header set by
an authenticating proxy: nsqio/nsq #1103).

``--htpasswd-file=PATH`` names an Apache htpasswd file of bcrypt entries (``htpasswd -B``;
``$2y$``, ``$2b$`` and ``$2a$``, checked with the ``bcrypt`` library; any other kind of entry
refuses the start, naming its line). With it every page and ``/api/*`` needs a session (the
login form sets an HttpOnly, SameSite=Strict cookie, Secure under HTTPS, lasting
``--session-timeout``) or HTTP Basic credentials of a listed user. A state-changing request
through a session carries the session's CSRF token in ``X-CSRF-Token``. Failed logins are
counted per client address: after :data:`MAX_FAILURES` in :data:`FAILURE_WINDOW` seconds
every login from it (form or Basic) is answered 429 until the oldest failure is that old.

This module keeps the credentials, the sessions and the failure counts; the routes that use
them are in :mod:`nsqpy.nsqadmin.http`.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import hmac
import logging
import math
import re
import secrets
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web

from .options import OptionsError

__all__ = [
    "CSRF_HEADER",
    "FAILURE_WINDOW",
    "IDENTITY",
    "MAX_FAILURES",
    "SESSION_COOKIE",
    "HtpasswdError",
    "Identity",
    "Login",
    "LoginRefused",
    "LoginThrottle",
    "Session",
    "read_htpasswd",
]

log = logging.getLogger("nsqadmin")

SESSION_COOKIE = "nsqadmin_session"
CSRF_HEADER = "X-CSRF-Token"
#: failed logins allowed per client address within FAILURE_WINDOW seconds
MAX_FAILURES = 5
FAILURE_WINDOW = 60.0
#: bcrypt reads only this many bytes of a password (htpasswd -B truncates likewise)
BCRYPT_MAX_BYTES = 72
#: sessions kept per user (the oldest is ended past this)
MAX_SESSIONS_PER_USER = 100
#: how long a checked HTTP Basic password is remembered (a script's every request would
#: otherwise pay a bcrypt check)
BASIC_CACHE_SECONDS = 300.0

_BCRYPT = re.compile(r"\$2[aby]\$(0[4-9]|[12][0-9]|3[01])\$[./A-Za-z0-9]{53}")


class HtpasswdError(OptionsError):
    """The htpasswd file cannot be used (its text says why)."""


class LoginRefused(Exception):
    """A login attempt not even checked: the address failed too often. ``retry_after`` is in
    seconds."""

    def __init__(self, retry_after: int) -> None:
        super().__init__(f"too many failed logins; retry after {retry_after}s")
        self.retry_after = retry_after


def _entry_kind(hashed: str) -> str:
    """What an htpasswd entry that is not bcrypt is, in words."""
    if hashed.startswith("$apr1$"):
        return "an MD5 ($apr1$) entry"
    if hashed.startswith("{SHA}"):
        return "a SHA-1 ({SHA}) entry"
    if hashed.startswith("$2"):
        return "a malformed bcrypt entry"
    if hashed.startswith(("$1$", "$5$", "$6$", "$md5$")):
        return "a crypt(3) entry"
    return "a crypt (DES) or plain-text entry"


def read_htpasswd(path: str) -> dict[str, bytes]:
    """The users of an htpasswd file and their bcrypt hashes. Blank lines and ``#``
    comments are skipped. Raises :class:`HtpasswdError`."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise HtpasswdError(f"--htpasswd-file: cannot open {path} - {e.strerror or e}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise HtpasswdError(f"--htpasswd-file: {path} is not UTF-8 text") from None
    users: dict[str, bytes] = {}
    lines: dict[str, int] = {}
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        user, sep, hashed = line.partition(":")
        if not sep or not user or not hashed:
            raise HtpasswdError(f"--htpasswd-file: {path} line {n} is not 'user:hash'")
        if not _BCRYPT.fullmatch(hashed):
            raise HtpasswdError(
                f"--htpasswd-file: {path} line {n} (user {user!r}) is {_entry_kind(hashed)}: "
                "only bcrypt entries are accepted (make them with htpasswd -B)"
            )
        if user in users:
            raise HtpasswdError(
                f"--htpasswd-file: {path} lists user {user!r} twice (lines {lines[user]}, {n})"
            )
        users[user] = hashed.encode()
        lines[user] = n
    if not users:
        raise HtpasswdError(f"--htpasswd-file: {path} holds no user")
    return users


def _checkpw(password: bytes, hashed: bytes) -> bool:
    import bcrypt  # only nsqadmin with --htpasswd-file needs it

    try:
        return bool(bcrypt.checkpw(password, hashed))
    except ValueError:
        return False


class LoginThrottle:
    """Failed logins per client address: at most ``limit`` in ``window`` seconds."""

    def __init__(
        self,
        limit: int = MAX_FAILURES,
        window: float = FAILURE_WINDOW,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limit = limit
        self.window = window
        self.clock = clock
        self.failures: dict[str, deque[float]] = {}

    def _recent(self, address: str, now: float) -> deque[float] | None:
        times = self.failures.get(address)
        if times is None:
            return None
        while times and times[0] <= now - self.window:
            times.popleft()
        if not times:
            del self.failures[address]
            return None
        return times

    def retry_after(self, address: str) -> int:
        """0 when ``address`` may try to log in now, else the whole seconds to wait."""
        now = self.clock()
        times = self._recent(address, now)
        if times is None or len(times) < self.limit:
            return 0
        return max(1, math.ceil(times[-self.limit] + self.window - now))

    def failed(self, address: str) -> None:
        now = self.clock()
        if len(self.failures) > 10_000:  # forget the addresses that have waited long enough
            for a in list(self.failures):
                self._recent(a, now)
        times = self._recent(address, now)
        if times is None:
            times = self.failures[address] = deque(maxlen=self.limit)
        times.append(now)


@dataclass(slots=True)
class Session:
    """One login: its cookie value, its user, the CSRF token its pages send, when it ends
    (``time.monotonic``, and the wall clock for the page) and the htpasswd entry it was
    checked against (a changed password ends it)."""

    id: str
    user: str
    csrf_token: str
    expires: float
    expires_at: float
    entry: bytes


@dataclass(frozen=True, slots=True)
class Identity:
    """Who a request is: a session's user, or (``session`` None) an HTTP Basic user."""

    user: str
    session: Session | None = None


#: the request's :class:`Identity` once checked
IDENTITY = web.RequestKey("nsqadmin.identity", Identity)


class Login:
    """The users of ``--htpasswd-file``, their sessions and the failed-login counts."""

    def __init__(self, path: str, session_timeout: float) -> None:
        self.path = path
        self.session_timeout = session_timeout
        self.users = read_htpasswd(path)
        self.sessions: dict[str, Session] = {}
        self.throttle = LoginThrottle()
        self._cache_key = secrets.token_bytes(32)
        #: HMAC of user and password → (the entry it matched, until when)
        self._basic_ok: dict[bytes, tuple[bytes, float]] = {}

    def reload(self) -> None:
        """SIGHUP: read the file again (a file that cannot be used keeps the old users). The
        sessions of removed users and of changed passwords end."""
        try:
            users = read_htpasswd(self.path)
        except HtpasswdError as e:
            log.error("%s (keeping the %d user(s) read before)", e, len(self.users))
            return
        self.users = users
        self._basic_ok.clear()
        for sid, s in list(self.sessions.items()):
            if users.get(s.user) != s.entry:
                del self.sessions[sid]
        log.info("htpasswd: %d user(s) read from %s", len(users), self.path)

    # --- passwords ----------------------------------------------------------------------------

    async def verify(self, user: str, password: str) -> bool:
        """Whether ``password`` is ``user``'s (bcrypt, off the event loop). An unknown user
        costs the same check."""
        entry = self.users.get(user)
        secret = password.encode("utf-8", "surrogateescape")[:BCRYPT_MAX_BYTES]
        key = hmac.new(
            self._cache_key, user.encode("utf-8", "surrogateescape") + b"\0" + secret, hashlib.sha256
        )
        digest = key.digest()
        now = time.monotonic()
        cached = self._basic_ok.get(digest)
        if entry is not None and cached is not None and cached[0] == entry and cached[1] > now:
            return True
        target = entry if entry is not None else next(iter(self.users.values()))
        ok = await asyncio.get_running_loop().run_in_executor(None, _checkpw, secret, target)
        if not ok or entry is None:
            return False
        if len(self._basic_ok) >= 1000:
            self._basic_ok.clear()
        self._basic_ok[digest] = (entry, now + BASIC_CACHE_SECONDS)
        return True

    async def attempt(self, address: str, user: str, password: str, how: str) -> bool:
        """One login attempt from ``address`` (``how``: "form" or "HTTP Basic"): counted when
        it fails. Raises :class:`LoginRefused` while the address has failed too often."""
        wait = self.throttle.retry_after(address)
        if wait:
            log.warning("login refused: %s has failed %d times in %ds", address, MAX_FAILURES, FAILURE_WINDOW)
            raise LoginRefused(wait)
        if await self.verify(user, password):
            return True
        self.throttle.failed(address)
        log.warning("login failed: user %r from %s (%s)", user, address, how)
        return False

    async def basic(self, request: web.Request) -> Identity | None:
        """The HTTP Basic user of ``request``: None when it sends no Basic credentials;
        PermissionError when they are wrong; :class:`LoginRefused` when throttled."""
        scheme, _, value = request.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "basic":
            return None
        try:
            decoded = base64.b64decode(value.strip(), validate=True).decode("utf-8")
        except (binascii.Error, ValueError):
            decoded = ""
        user, _, password = decoded.partition(":")
        if not await self.attempt(request.remote or "", user, password, "HTTP Basic"):
            raise PermissionError(user)
        return Identity(user)

    # --- sessions -------------------------------------------------------------------------------

    def start_session(self, user: str) -> Session:
        now = time.monotonic()
        for sid, s in list(self.sessions.items()):
            if s.expires <= now:
                del self.sessions[sid]
        mine = [sid for sid, s in self.sessions.items() if s.user == user]
        for sid in mine[: max(0, len(mine) - MAX_SESSIONS_PER_USER + 1)]:
            del self.sessions[sid]
        session = Session(
            id=secrets.token_urlsafe(32),
            user=user,
            csrf_token=secrets.token_urlsafe(32),
            expires=now + self.session_timeout,
            expires_at=time.time() + self.session_timeout,
            entry=self.users[user],
        )
        self.sessions[session.id] = session
        return session

    def session(self, request: web.Request) -> Session | None:
        """The live session the request's cookie names, if any."""
        sid = request.cookies.get(SESSION_COOKIE)
        if not sid:
            return None
        s = self.sessions.get(sid)
        if s is None:
            return None
        if s.expires <= time.monotonic():
            del self.sessions[sid]
            return None
        return s

    def end_session(self, session: Session) -> None:
        self.sessions.pop(session.id, None)

    @staticmethod
    def csrf_ok(session: Session, token: str | None) -> bool:
        return bool(token) and hmac.compare_digest(session.csrf_token.encode(), (token or "").encode())

    def set_cookie(self, resp: web.StreamResponse, session: Session, path: str, secure: bool) -> None:
        resp.set_cookie(
            SESSION_COOKIE,
            session.id,
            max_age=max(1, int(self.session_timeout)),
            path=path,
            httponly=True,
            samesite="Strict",
            secure=secure or None,
        )

    @staticmethod
    def clear_cookie(resp: web.StreamResponse, path: str, secure: bool) -> None:
        resp.del_cookie(SESSION_COOKIE, path=path, httponly=True, samesite="Strict", secure=secure or None)
