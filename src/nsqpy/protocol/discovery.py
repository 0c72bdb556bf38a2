"""nsqlookupd discovery, the I/O-free part shared by every consumer (the asyncio library,
the Spark source, the tools): go-nsq's URL rule and its reading of ``/lookup``.

Each caller does the HTTP GET with its own I/O (aiohttp, urllib) and hands the decoded JSON
to :func:`producers`. go-nsq sends ``Authorization: Bearer <auth_secret>`` with the query
when an auth secret is configured (:func:`lookup_headers`).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode, urlsplit

from .address import format_address

__all__ = ["Producer", "lookup_headers", "lookup_url", "producers"]


def lookup_url(address: str, topic: str) -> str:
    """go-nsq's rule: ``host:port`` → ``http://host:port/lookup?topic=``; a full URL keeps its
    scheme and path (``/lookup`` when it has none)."""
    if "://" not in address:
        address = "http://" + address
    parts = urlsplit(address)
    path = parts.path if parts.path not in ("", "/") else "/lookup"
    return f"{parts.scheme}://{parts.netloc}{path}?{urlencode({'topic': topic})}"


def lookup_headers(auth_secret: str | bytes | None) -> dict[str, str]:
    """The headers go-nsq sends to nsqlookupd (``Accept`` for the V1 API, and the bearer
    token when an auth secret is configured)."""
    headers = {"Accept": "application/vnd.nsq; version=1.0"}
    if auth_secret:
        secret = auth_secret.decode() if isinstance(auth_secret, bytes) else auth_secret
        headers["Authorization"] = f"Bearer {secret}"
    return headers


class Producer:
    """One nsqd of a ``/lookup`` answer: ``tcp`` and ``http`` as ``host:port``."""

    __slots__ = ("http", "tcp")

    def __init__(self, tcp: str, http: str) -> None:
        self.tcp = tcp
        self.http = http

    def __repr__(self) -> str:
        return f"Producer({self.tcp!r}, {self.http!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Producer) and (self.tcp, self.http) == (other.tcp, other.http)

    def __hash__(self) -> int:
        return hash((self.tcp, self.http))


def producers(doc: Any) -> list[Producer]:
    """The producers of a ``/lookup`` JSON answer (a pre-1.0 ``{"data": …}`` envelope too),
    addressed by ``broadcast_address`` as go-nsq does; entries without one or without a TCP
    port are skipped. Order kept, duplicates dropped."""
    if isinstance(doc, dict) and isinstance(doc.get("data"), dict):
        doc = doc["data"]
    if not isinstance(doc, dict):
        return []
    out: list[Producer] = []
    for p in doc.get("producers") or []:
        if not isinstance(p, dict):
            continue
        host = p.get("broadcast_address")
        tcp_port = p.get("tcp_port")
        if not isinstance(host, str) or not host or not isinstance(tcp_port, int) or not tcp_port:
            continue
        http_port = p.get("http_port")
        prod = Producer(
            format_address(host, tcp_port),
            format_address(host, http_port) if isinstance(http_port, int) else "",
        )
        if prod not in out:
            out.append(prod)
    return out
