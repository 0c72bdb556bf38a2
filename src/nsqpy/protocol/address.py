"""``host:port`` addresses, one implementation for daemons, clients, tools and Spark.

Go's ``net.SplitHostPort``/``JoinHostPort`` rules: IPv6 hosts are bracketed (``[::1]:4150``);
a daemon's listen address without a port (or starting with ``/``) is a unix socket path.
"""

from __future__ import annotations

__all__ = [
    "format_address",
    "parse_address",
    "parse_address_list",
    "split_address",
    "split_listen_address",
]


def format_address(host: str, port: int) -> str:
    """Go's JoinHostPort: ``host:port``, ``[v6]:port``."""
    return f"[{host}]:{port}" if ":" in host and not host.startswith("[") else f"{host}:{port}"


def split_address(address: str, default_port: int | None = None) -> tuple[str, int]:
    """``host:port`` or ``[v6]:port`` → ``(host, port)``; a bare host takes ``default_port``
    (ValueError if there is none, or the port is not a number in 1..65535)."""
    address = address.strip()
    host, sep, port = address.rpartition(":")
    if not sep or "]" in port or (":" in host and not host.startswith("[")):
        # no port (a bare host, or a bare IPv6 address)
        if default_port is None:
            raise ValueError(f"{address!r} is not a host:port address")
        return address.strip("[]"), default_port
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{address!r}: bad port {port!r}")
    return host.strip("[]"), int(port)


def split_listen_address(address: str) -> tuple[str, int] | str:
    """A daemon's listen address: ``(host, port)`` (port 0 picks one), or a unix socket
    path (anything starting with ``/`` or without a ``:``)."""
    if address.startswith("/") or ":" not in address:
        return address
    host, _, port = address.rpartition(":")
    if not port.isdigit() or int(port) > 65535:
        raise ValueError(f"invalid address {address!r}: bad port {port!r}")
    return host.strip("[]"), int(port)


def parse_address(address: str, option: str) -> tuple[str, int]:
    """``host:port`` of a user option; a ValueError naming ``option`` otherwise."""
    try:
        host, port = split_address(address)
    except ValueError:
        raise ValueError(f"option {option!r}: {address.strip()!r} is not a host:port address") from None
    if not host:
        raise ValueError(f"option {option!r}: {address.strip()!r} is not a host:port address")
    return host, port


def parse_address_list(value: str | None, option: str) -> list[str]:
    """A comma-separated ``host:port`` list, validated, normalised and de-duplicated (order
    kept)."""
    if value is None:
        return []
    out: list[str] = []
    for part in value.split(","):
        if not part.strip():
            continue
        addr = format_address(*parse_address(part, option))
        if addr not in out:
            out.append(addr)
    return out
