"""What every nsqpy daemon process shares: listen addresses (``host:port`` or a unix socket
path), NSQ-shaped logging, the version line, and running an event loop until SIGTERM/SIGINT.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import platform
import signal
import socket
import sys
from collections.abc import Coroutine
from typing import Any

from . import NSQ_VERSION, __version__
from .protocol.address import format_address, split_listen_address

__all__ = [
    "LEVELS",
    "address_str",
    "bound_address",
    "format_address",
    "listen_socket",
    "open_stream",
    "run_event_loop",
    "setup_logging",
    "split_address",
    "stop_on_signals",
    "version_string",
]

#: ``--log-level`` names → :mod:`logging` levels.
LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warn": logging.WARNING,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "fatal": logging.CRITICAL,
}

Address = tuple[str, int] | str


def version_string(app: str) -> str:
    """The ``--version`` line (Go's ``version.String(app)`` plus what runs it)."""
    return f"{app} v{NSQ_VERSION} (nsqpy {__version__}, python {platform.python_version()})"


def setup_logging(prefix: str, level: str) -> None:
    """Log to stderr in NSQ's shape: ``[nsqd] 2006/01/02 15:04:05.000000 INFO: ...``."""
    handler = logging.StreamHandler(sys.stderr)
    fmt = logging.Formatter(
        prefix.replace("%", "%%") + "%(asctime)s.%(msecs)03d000 %(levelname)s: %(message)s",
        datefmt="%Y/%m/%d %H:%M:%S",
    )
    handler.setFormatter(fmt)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(LEVELS.get(level.lower(), logging.INFO))
    logging.addLevelName(logging.WARNING, "WARN")
    logging.addLevelName(logging.CRITICAL, "FATAL")
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)


#: a daemon's listen address: (host, port), or a unix socket path
split_address = split_listen_address

#: every listener's accept queue: asyncio's create_server and aiohttp's SockSite listen()
#: again with their own default (100, 128) unless given this, and a burst of connects
#: beyond the queue waits for a SYN retransmit (1 s and more)
LISTEN_BACKLOG = 1024


def listen_socket(addr: str) -> socket.socket:
    """A listening socket for ``host:port`` (port 0 picks one) or a unix socket path."""
    target = split_address(addr)
    if isinstance(target, str):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(target)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(target)
        sock.listen(LISTEN_BACKLOG)
        return sock
    host, port = target
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server(
        (host or "0.0.0.0", port), family=family, backlog=LISTEN_BACKLOG, reuse_port=False
    )


async def open_stream(host: str, port: int, **kw: Any) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """``asyncio.open_connection`` to the first of ``host``'s addresses that answers, the
    name resolved as bytes: uvloop encodes a str with the ``idna`` codec, whose import
    (stringprep, unicodedata) costs 0.6 MiB (an IP address it takes as it is)."""
    loop = asyncio.get_running_loop()
    name: str | bytes = host.encode() if host.isascii() else host
    infos = await loop.getaddrinfo(name, port, type=socket.SOCK_STREAM)
    error: OSError = OSError(f"no address for {host}")
    for *_, addr in infos:
        try:
            return await asyncio.open_connection(str(addr[0]), int(addr[1]), **kw)
        except OSError as e:
            error = e
    raise error


def bound_address(sock: socket.socket) -> Address:
    """(host, port) a socket is bound to, or its unix path."""
    name = sock.getsockname()
    if isinstance(name, tuple):
        return name[0], name[1]
    return str(name)


def bound_port(addr: Address | None) -> int:
    """The port a listener is bound to; -1 for a unix socket or none (Go's /info)."""
    return addr[1] if isinstance(addr, tuple) else -1


def address_str(addr: Address | None) -> str:
    """``host:port`` (``[v6]:port``), the unix path, or "" for no address."""
    if addr is None:
        return ""
    if isinstance(addr, str):
        return addr
    return format_address(*addr)


def stop_on_signals() -> asyncio.Event:
    """An event that SIGINT or SIGTERM sets (install it before announcing the addresses, so
    a signal sent right after them is not fatal)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    return stop


def run_event_loop(main: Coroutine[Any, Any, None]) -> None:
    """Run ``main`` to completion on uvloop when available."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        asyncio.run(main)
        return
    uvloop.run(main)
