"""NSQD: the daemon object. Owns topics, listeners, clients and the periodic queue scan.

Use it in-process::

    async with NSQD(Options(tcp_address="127.0.0.1:0", http_address="127.0.0.1:0")) as nsqd:
        print(nsqd.tcp_address, nsqd.http_address)
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

from ..protocol.names import is_valid_topic_name
from .guid import GUIDFactory
from .options import Options
from .protocol_v2 import ClientV2
from .topic import Topic

log = logging.getLogger("nsqd")


def split_address(addr: str) -> tuple[str, int] | str:
    """``host:port`` → (host, port); anything without a port is a unix socket path."""
    if addr.startswith("/") or ":" not in addr:
        return addr
    host, _, port = addr.rpartition(":")
    host = host.strip("[]")
    if not port.isdigit() or int(port) > 65535:
        raise ValueError(f"invalid address {addr!r}: bad port {port!r}")
    return host, int(port)


def format_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _listen_socket(addr: str) -> socket.socket:
    target = split_address(addr)
    if isinstance(target, str):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(target)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(target)
        sock.listen(1024)
        return sock
    host, port = target
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host or "0.0.0.0", port), family=family, backlog=1024, reuse_port=False)


class NSQD:
    """The nsqd daemon, runnable in-process (``async with``) or from the ``nsqd`` script."""

    def __init__(self, options: Options | None = None, **overrides: Any) -> None:
        opts = options if options is not None else Options()
        if overrides:
            opts = dataclasses.replace(opts, **overrides)
        self.options = opts
        self.topics: dict[str, Topic] = {}
        self.clients: dict[int, ClientV2] = {}
        self.guid = GUIDFactory(opts.node_id)
        self.start_time_ns = time.time_ns()
        self.start_time = self.start_time_ns // 1_000_000_000
        self.exiting = False
        self._client_ids = itertools.count(1)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tcp_server: asyncio.AbstractServer | None = None
        self._http_runner: Any = None
        self._scan_task: asyncio.Task[None] | None = None
        self._tcp_sock: socket.socket | None = None
        self._http_sock: socket.socket | None = None
        #: (host, port) actually bound, or the unix path; None when disabled.
        self.tcp_address: tuple[str, int] | str | None = None
        self.http_address: tuple[str, int] | str | None = None

    # --- lifecycle ----------------------------------------------------------------------------

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        assert self._loop is not None, "NSQD is not started"
        return self._loop

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        opts = self.options
        self._tcp_sock = _listen_socket(opts.tcp_address)
        self._tcp_server = await self._loop.create_server(
            lambda: ClientV2(self), sock=self._tcp_sock
        )
        self.tcp_address = self._bound(self._tcp_sock)
        log.info("TCP: listening on %s", self._fmt(self.tcp_address))
        if opts.http_address:
            from .http import start_http

            self._http_sock = _listen_socket(opts.http_address)
            self._http_runner = await start_http(self, self._http_sock)
            self.http_address = self._bound(self._http_sock)
            log.info("HTTP: listening on %s", self._fmt(self.http_address))
        self._scan_task = self._loop.create_task(self._queue_scan_loop())

    @staticmethod
    def _bound(sock: socket.socket) -> tuple[str, int] | str:
        name = sock.getsockname()
        if isinstance(name, tuple):
            return name[0], name[1]
        return str(name)

    @staticmethod
    def _fmt(addr: tuple[str, int] | str | None) -> str:
        if addr is None:
            return ""
        if isinstance(addr, str):
            return addr
        return format_address(*addr)

    @property
    def tcp_port(self) -> int:
        return self.tcp_address[1] if isinstance(self.tcp_address, tuple) else -1

    @property
    def http_port(self) -> int:
        return self.http_address[1] if isinstance(self.http_address, tuple) else -1

    @property
    def tcp_addr_str(self) -> str:
        return self._fmt(self.tcp_address)

    @property
    def http_addr_str(self) -> str:
        return self._fmt(self.http_address)

    async def stop(self) -> None:
        """Stop accepting, close every client, stop the HTTP server."""
        if self.exiting:
            return
        self.exiting = True
        log.info("NSQ: closing TCP listener")
        if self._tcp_server is not None:
            self._tcp_server.close()
        for client in list(self.clients.values()):
            client.close()
        if self._scan_task is not None:
            self._scan_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._scan_task
        if self._http_runner is not None:
            await self._http_runner.cleanup()
        if self._tcp_server is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._tcp_server.wait_closed(), 2)
        for addr in (self.tcp_address, self.http_address):
            if isinstance(addr, str):
                with contextlib.suppress(OSError):
                    os.unlink(addr)
        log.info("NSQ: bye")

    async def __aenter__(self) -> NSQD:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    # --- clients ------------------------------------------------------------------------------

    def next_client_id(self) -> int:
        return next(self._client_ids)

    def add_client(self, client: ClientV2) -> None:
        self.clients[client.id] = client
        if self.exiting:
            client.close()

    def remove_client(self, client: ClientV2) -> None:
        self.clients.pop(client.id, None)

    # --- topics -------------------------------------------------------------------------------

    def now_ns(self) -> int:
        return time.time_ns()

    def get_topic(self, name: str) -> Topic:
        """The topic, created if it does not exist (the caller validated the name)."""
        topic = self.topics.get(name)
        if topic is None:
            if not is_valid_topic_name(name):
                raise ValueError(f"invalid topic name {name!r}")
            topic = self.topics[name] = Topic(name, self)
            log.info("TOPIC(%s): created", name)
            self.on_metadata_changed()
        return topic

    def get_existing_topic(self, name: str) -> Topic | None:
        return self.topics.get(name)

    def delete_topic(self, name: str) -> bool:
        topic = self.topics.pop(name, None)
        if topic is None:
            return False
        log.info("TOPIC(%s): deleting", name)
        topic.close()
        self.on_metadata_changed()
        return True

    # --- hooks (metadata persistence and lookupd registration attach here) -------------------

    def on_channel_created(self, topic: Topic, channel: Any) -> None:
        self.on_metadata_changed()

    def on_channel_deleted(self, topic: Topic, channel: Any) -> None:
        self.on_metadata_changed()

    def on_metadata_changed(self) -> None:
        return None

    # --- periodic scan ------------------------------------------------------------------------

    async def _queue_scan_loop(self) -> None:
        interval = self.options.queue_scan_interval
        loop = self.loop
        while True:
            await asyncio.sleep(interval)
            now = loop.time()
            for topic in list(self.topics.values()):
                for channel in list(topic.channels.values()):
                    if channel.in_flight or channel.deferred:
                        channel.scan(now)

    # --- info ---------------------------------------------------------------------------------

    def is_healthy(self) -> bool:
        return True

    def health(self) -> str:
        return "OK"
