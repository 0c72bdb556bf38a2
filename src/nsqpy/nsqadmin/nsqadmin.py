"""NSQAdmin: the web UI daemon object. Owns the HTTP(S) listener, the cluster client, the
notification worker, the time-series sampler and (nsqpy's ``--htpasswd-file``) the login.

Use it in-process::

    async with NSQAdmin(Options(http_address="127.0.0.1:0",
                                nsqlookupd_http_addresses=["127.0.0.1:4161"])) as admin:
        print(admin.http_addr_str)
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import socket
import ssl
from typing import Any

from .. import daemon
from ..adminauth import AdminTokenError, read_token_file
from ..daemon import Address, address_str, bound_address
from .clusterinfo import ClusterInfo
from .httpclient import Client
from .login import Login
from .notify import Notifier
from .options import Options, OptionsError, client_ssl_context, validate
from .series import Sampler

__all__ = ["NSQAdmin", "Options", "OptionsError"]

log = logging.getLogger("nsqadmin")


def _listen(addr: str) -> socket.socket:
    """A TCP listener on ``addr`` (Go's ``net.Listen("tcp", addr)``; "" is any port)."""
    target = daemon.split_address(addr) if addr else ("", 0)
    if isinstance(target, str):
        raise RuntimeError(f"listen ({addr}) failed - listen tcp: address {addr}: missing port in address")
    try:
        return daemon.listen_socket(daemon.format_address(*target))
    except OSError as e:
        reason = (e.strerror or str(e)).lower()
        raise RuntimeError(f"listen ({addr}) failed - listen tcp {addr}: bind: {reason}") from None
    except ValueError as e:
        raise RuntimeError(f"listen ({addr}) failed - {e}") from None


class NSQAdmin:
    """The nsqadmin daemon, runnable in-process (``async with``) or from the ``nsqadmin``
    script. ``start`` raises OptionsError with Go's ``nsqadmin.New`` messages."""

    def __init__(self, options: Options | None = None, **overrides: Any) -> None:
        opts = options if options is not None else Options()
        if overrides:
            opts = dataclasses.replace(opts, **overrides)
        self.options = opts
        self.client: Client = Client(None, opts.http_client_connect_timeout, opts.http_client_request_timeout)
        self.ci = ClusterInfo(self.client)
        self.notifier = Notifier(self)
        self.sampler: Sampler | None = None
        #: the users and sessions of --htpasswd-file (None: no login, as Go's nsqadmin)
        self.login: Login | None = None
        #: HTTPS with --tls-cert/--tls-key
        self.tls_context: ssl.SSLContext | None = None
        self.exiting = False
        self._http_runner: Any = None
        self._started = False
        #: (host, port) actually bound; None before start.
        self.http_address: Address | None = None

    # --- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        opts = self.options
        validate(opts)
        self.client.ssl_context = client_ssl_context(opts)
        self.client.bearer_token = self._read_token()
        if opts.htpasswd_file:
            self.login = Login(opts.htpasswd_file, opts.session_timeout)
        if opts.tls_cert:
            from ..transport import TransportError, server_tls_context

            try:
                ctx = server_tls_context(opts.tls_cert, opts.tls_key, min_version="tls1.2")
            except (OSError, ValueError, ssl.SSLError, TransportError) as e:
                raise OptionsError(f"failed to build TLS config - {e}") from None
            assert isinstance(ctx, ssl.SSLContext)  # (no client certificates asked)
            self.tls_context = ctx
        log.info(daemon.version_string("nsqadmin"))
        if opts.stats_sample_interval > 0:
            # the sampler polls every few seconds: its queries are logged at DEBUG
            self.sampler = Sampler(self, ClusterInfo(self.client, logging.DEBUG))
        sock = _listen(opts.http_address)
        try:
            from .http import start_http

            self.http_address = bound_address(sock)
            self._http_runner = await start_http(self, sock, self.tls_context)
        except BaseException:
            sock.close()
            await self.client.close()
            raise
        self._started = True
        log.info("%s: listening on %s", self.scheme.upper(), self.http_addr_str)
        if self.login is not None:
            self._warn_login_setup()
        self.notifier.start()
        if self.sampler is not None:
            self.sampler.start()

    async def stop(self) -> None:
        """Close the listener, post the queued notifications, stop the sampler."""
        if self.exiting or not self._started:
            return
        self.exiting = True
        if self._http_runner is not None:
            await self._http_runner.cleanup()
        if self.sampler is not None:
            await self.sampler.stop()
        await self.notifier.stop()
        await self.client.close()

    async def __aenter__(self) -> NSQAdmin:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # --- nsqpy: credentials ------------------------------------------------------------------

    def _read_token(self) -> str:
        """The first token of --admin-token-file ("" without one); OptionsError if unusable."""
        path = self.options.admin_token_file
        if not path:
            return ""
        try:
            return read_token_file(path)[0].decode("utf-8", "replace")
        except AdminTokenError as e:
            raise OptionsError(str(e)) from None

    def reload(self) -> None:
        """SIGHUP: read --admin-token-file and --htpasswd-file again (a file that cannot be
        used keeps what was read before, logged)."""
        if self.options.admin_token_file:
            try:
                self.client.bearer_token = self._read_token()
            except OptionsError as e:
                log.error("%s (keeping the admin token read before)", e)
            else:
                log.info("admin token: read from %s", self.options.admin_token_file)
        if self.login is not None:
            self.login.reload()

    def _warn_login_setup(self) -> None:
        assert self.login is not None
        for user in self.options.admin_users:
            if user not in self.login.users:
                log.warning("--admin-user %s is not a user of --htpasswd-file", user)
        host = self.http_address[0] if isinstance(self.http_address, tuple) else ""
        try:
            loopback = ipaddress.ip_address(host).is_loopback
        except ValueError:
            loopback = False
        if self.tls_context is None and not loopback:
            log.warning(
                "--htpasswd-file without --tls-cert: passwords and session cookies cross the "
                "network in clear text unless a TLS proxy is in front"
            )

    # --- options ----------------------------------------------------------------------------

    def swap_options(self, **changes: Any) -> None:
        """Go's ``swapOpts``: a new options object with ``changes`` (``PUT /config``)."""
        self.options = dataclasses.replace(self.options, **changes)
        if "log_level" in changes:
            log.setLevel(daemon.LEVELS.get(self.options.log_level, logging.INFO))

    # --- addresses ----------------------------------------------------------------------------

    @property
    def scheme(self) -> str:
        return "https" if self.tls_context is not None else "http"

    @property
    def http_port(self) -> int:
        return self.http_address[1] if isinstance(self.http_address, tuple) else 0

    @property
    def http_addr_str(self) -> str:
        return address_str(self.http_address)
