"""NSQLookupd: the discovery daemon object. Owns the registration DB and both listeners.

Use it in-process::

    async with NSQLookupd(Options(tcp_address="127.0.0.1:0", http_address="127.0.0.1:0")) as l:
        print(l.tcp_port, l.http_port)
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import os
import socket
import time
from typing import Any

from ..adminauth import AdminAuth
from ..daemon import LISTEN_BACKLOG, Address, address_str, bound_address, bound_port, listen_socket
from .lookup_protocol_v1 import LookupProtocolV1
from .options import Options
from .registration_db import RegistrationDB

__all__ = ["NSQLookupd", "Options"]

log = logging.getLogger("nsqlookupd")


def _listen(addr: str) -> socket.socket:
    """Listen on ``addr``; an empty address means any interface, any port (as Go's
    ``net.Listen("tcp", "")``)."""
    try:
        return listen_socket(addr or ":0")
    except (OSError, ValueError) as e:
        raise RuntimeError(f"listen ({addr}) failed - {e}") from None


class NSQLookupd:
    """The nsqlookupd daemon, runnable in-process (``async with``) or from the
    ``nsqlookupd`` script."""

    def __init__(self, options: Options | None = None, **overrides: Any) -> None:
        opts = options if options is not None else Options()
        if overrides:
            opts = dataclasses.replace(opts, **overrides)
        self.options = opts
        self.db = RegistrationDB()
        #: bearer tokens for the HTTP API's changes and /debug (--admin-token-file)
        self.admin_auth = AdminAuth(opts.admin_token_file, False, log)
        self.clients: set[LookupProtocolV1] = set()
        self.exiting = False
        self._client_numbers = itertools.count(1)
        self._tcp_server: asyncio.AbstractServer | None = None
        self._http_runner: Any = None
        #: (host, port) actually bound, or the unix path; None before start.
        self.tcp_address: Address | None = None
        self.http_address: Address | None = None

    # --- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        from .http import start_http

        opts = self.options
        loop = asyncio.get_running_loop()
        tcp_sock = _listen(opts.tcp_address)
        try:
            http_sock = _listen(opts.http_address)
        except BaseException:
            tcp_sock.close()
            raise
        try:
            self.tcp_address = bound_address(tcp_sock)
            self.http_address = bound_address(http_sock)
            self._tcp_server = await loop.create_server(
                lambda: LookupProtocolV1(self), sock=tcp_sock, backlog=LISTEN_BACKLOG
            )
            log.info("TCP: listening on %s", self.tcp_addr_str)
            self._http_runner = await start_http(self, http_sock)
            log.info("HTTP: listening on %s", self.http_addr_str)
        except BaseException:
            if self._tcp_server is not None:
                self._tcp_server.close()
            tcp_sock.close()
            http_sock.close()
            raise

    async def stop(self) -> None:
        """Close the listeners and every client (their peers leave the registry)."""
        if self.exiting:
            return
        self.exiting = True
        if self._tcp_server is not None:
            self._tcp_server.close()
        for client in list(self.clients):
            client.close()
        if self._http_runner is not None:
            await self._http_runner.cleanup()
        if self._tcp_server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._tcp_server.wait_closed(), 2)
        for addr in (self.tcp_address, self.http_address):
            if isinstance(addr, str):
                with contextlib.suppress(OSError):
                    os.unlink(addr)

    async def __aenter__(self) -> NSQLookupd:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # --- addresses ----------------------------------------------------------------------

    @property
    def tcp_port(self) -> int:
        """The bound TCP port (-1 for a unix socket, as nsqd's)."""
        return bound_port(self.tcp_address)

    @property
    def http_port(self) -> int:
        """The bound HTTP port (-1 for a unix socket, as nsqd's)."""
        return bound_port(self.http_address)

    @property
    def tcp_addr_str(self) -> str:
        return address_str(self.tcp_address)

    @property
    def http_addr_str(self) -> str:
        return address_str(self.http_address)

    # --- clients and time -----------------------------------------------------------------

    def add_client(self, client: LookupProtocolV1) -> None:
        self.clients.add(client)
        if self.exiting:
            client.close()

    def remove_client(self, client: LookupProtocolV1) -> None:
        self.clients.discard(client)

    def next_client_number(self) -> int:
        return next(self._client_numbers)

    def now_ns(self) -> int:
        """Wall-clock nanoseconds (what Go's ``time.Now().UnixNano()`` gives)."""
        return time.time_ns()
