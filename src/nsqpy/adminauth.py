"""Admin tokens for the daemons' HTTP APIs (an nsqpy addition; NSQ's HTTP admin endpoints
are open to anyone who reaches the port: nsqio/nsq #1103, #876).

``--admin-token-file=PATH`` names a file of tokens, one per line (blank lines and ``#``
comments ignored), that must not be readable by other users. A request that needs a token
carries ``Authorization: Bearer <token>``: none answers 401 ``UNAUTHORIZED`` with
``WWW-Authenticate: Bearer``, a wrong one 403 ``FORBIDDEN``; tokens are compared in
constant time. The file is read at start (refused when it cannot be read, is empty or is
readable by others) and again on SIGHUP (a bad file then keeps the old tokens, logged).

What needs a token is the daemon's to say (:meth:`AdminAuth.require`). Message bodies are
the most sensitive: with ``bodies=True`` a request is refused outright when the daemon
checks clients with an auth server (``--auth-http-address``) and has no token file, since
nothing could tell who is asking.
"""

from __future__ import annotations

import logging
import os
import stat
from typing import Any

__all__ = ["AdminAuth", "AdminTokenError", "read_token_file"]


class AdminTokenError(ValueError):
    """The token file cannot be used (its text says why)."""


def read_token_file(path: str) -> list[bytes]:
    """The tokens of ``path``. Raises :class:`AdminTokenError`."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as e:
        raise AdminTokenError(f"--admin-token-file: cannot open {path} - {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if st.st_mode & (stat.S_IRGRP | stat.S_IROTH):
            raise AdminTokenError(
                f"--admin-token-file: {path} is readable by other users "
                f"(mode {stat.S_IMODE(st.st_mode):04o}; chmod 600 it)"
            )
        with os.fdopen(os.dup(fd), "rb") as f:
            text = f.read()
    finally:
        os.close(fd)
    tokens = []
    for line in text.splitlines():
        t = line.strip()
        if t and not t.startswith(b"#"):
            tokens.append(t)
    if not tokens:
        raise AdminTokenError(f"--admin-token-file: {path} holds no token")
    return tokens


class AdminAuth:
    """A daemon's admin tokens (none: every request passes, as in NSQ)."""

    def __init__(self, path: str = "", gate_bodies: bool = False, log: logging.Logger | None = None) -> None:
        self.path = path
        #: refuse requests that show message bodies when there is no token file
        self.gate_bodies = gate_bodies
        self.log = log or logging.getLogger("nsqpy")
        self.tokens: list[bytes] = read_token_file(path) if path else []

    @property
    def enabled(self) -> bool:
        return bool(self.tokens)

    def reload(self) -> None:
        """SIGHUP: read the file again; a file that cannot be used keeps the old tokens."""
        if not self.path:
            return
        try:
            self.tokens = read_token_file(self.path)
        except AdminTokenError as e:
            self.log.error("%s (keeping the %d token(s) read before)", e, len(self.tokens))
            return
        self.log.info("admin tokens: %d read from %s", len(self.tokens), self.path)

    def check(self, header: str | None) -> int:
        """200 when the ``Authorization`` header carries a listed token, else 401 (none) or
        403 (another)."""
        if not header or not header.startswith("Bearer "):
            return 401
        import hmac  # (hashlib with it: only where tokens are checked)

        given = header[7:].strip().encode()
        ok = False
        for t in self.tokens:
            ok |= hmac.compare_digest(t, given)  # every token compared, match or not
        return 200 if ok else 403

    def require(self, request: Any, bodies: bool = False) -> None:
        """Raise the HTTPError that refuses ``request``, if any."""
        from .httpapi import HTTPError  # the HTTP server's own module: imported with it

        if not self.tokens:
            if bodies and self.gate_bodies:
                raise HTTPError(403, "FORBIDDEN", auth=True)
            return
        status = self.check(request.headers.get("Authorization"))
        if status == 401:
            raise HTTPError(401, "UNAUTHORIZED", {"WWW-Authenticate": "Bearer"}, auth=True)
        if status == 403:
            raise HTTPError(403, "FORBIDDEN", auth=True)
