"""NSQAdmin: the web UI daemon object. Owns the HTTP listener, the cluster client, the
notification worker and the time-series sampler.

Use it in-process::

    async with NSQAdmin(Options(http_address="127.0.0.1:0",
                                nsqlookupd_http_addresses=["127.0.0.1:4161"])) as admin:
        print(admin.http_addr_str)
"""

from __future__ import annotations

import dataclasses
import logging
import socket
from typing import Any

from .. import daemon
from ..daemon import Address, address_str, bound_address
from .clusterinfo import ClusterInfo
from .httpclient import Client
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
        log.info(daemon.version_string("nsqadmin"))
        if opts.stats_sample_interval > 0:
            # the sampler polls every few seconds: its queries are logged at DEBUG
            self.sampler = Sampler(self, ClusterInfo(self.client, logging.DEBUG))
        sock = _listen(opts.http_address)
        try:
            from .http import start_http

            self.http_address = bound_address(sock)
            self._http_runner = await start_http(self, sock)
        except BaseException:
            sock.close()
            await self.client.close()
            raise
        self._started = True
        log.info("HTTP: listening on %s", self.http_addr_str)
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

    # --- options ----------------------------------------------------------------------------

    def swap_options(self, **changes: Any) -> None:
        """Go's ``swapOpts``: a new options object with ``changes`` (``PUT /config``)."""
        self.options = dataclasses.replace(self.options, **changes)
        if "log_level" in changes:
            log.setLevel(daemon.LEVELS.get(self.options.log_level, logging.INFO))

    # --- addresses ----------------------------------------------------------------------------

    @property
    def http_port(self) -> int:
        return self.http_address[1] if isinstance(self.http_address, tuple) else 0

    @property
    def http_addr_str(self) -> str:
        return address_str(self.http_address)
