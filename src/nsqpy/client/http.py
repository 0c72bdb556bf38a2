"""Async HTTP clients for nsqd and nsqlookupd (aiohttp), with gnsq's method names."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from datetime import timedelta
from typing import Any, Self
from urllib.parse import urlsplit

import aiohttp

from nsqpy.protocol.commands import encode_mpub_body

from .errors import NSQHTTPError

#: What NSQ 1.x clients send to get the un-enveloped (v1) JSON responses.
ACCEPT_V1 = "application/vnd.nsq; version=1.0"


class _HTTPClient:
    def __init__(
        self,
        address: str,
        *,
        session: aiohttp.ClientSession | None = None,
        timeout: float = 5.0,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        if "://" not in address:
            address = "http://" + address
        parts = urlsplit(address)
        self.base = f"{parts.scheme}://{parts.netloc}"
        self.timeout = timeout
        self._session = session
        self._own_session = session is None
        self._headers = {"Accept": ACCEPT_V1, **(headers or {})}

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.base}>"

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._own_session and self._session is not None:
            await self._session.close()
            self._session = None

    def _get_session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=self.timeout), headers=self._headers
            )
            self._own_session = True
        return self._session

    async def _request(
        self, method: str, path: str, params: Mapping[str, Any] | None = None, data: bytes | None = None
    ) -> Any:
        q = {k: _param(v) for k, v in (params or {}).items() if v is not None}
        async with self._get_session().request(
            method, self.base + path, params=q, data=data, headers=self._headers
        ) as resp:
            body = await resp.read()
            if resp.status >= 400:
                raise NSQHTTPError(resp.status, _message(body))
        text = body.decode("utf-8", "replace")
        if resp.content_type == "application/json" or text[:1] in ("{", "["):
            try:
                return json.loads(text)
            except (ValueError, RecursionError):  # RecursionError: nested too deep
                pass
        return text

    async def ping(self) -> str:
        """``GET /ping`` (``OK`` when healthy; raises NSQHTTPError otherwise)."""
        return str(await self._request("GET", "/ping"))

    async def info(self) -> dict[str, Any]:
        return dict(await self._request("GET", "/info"))


def _param(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def _message(body: bytes) -> str:
    try:
        data = json.loads(body)
        if isinstance(data, dict):
            return str(data.get("message") or data.get("status_txt") or data)
    except (ValueError, RecursionError):  # RecursionError: nested too deep
        pass
    return body.decode("utf-8", "replace").strip()


class NsqdHTTPClient(_HTTPClient):
    """nsqd's HTTP API: publish, topic/channel admin, stats, config."""

    async def publish(self, topic: str, data: bytes, defer: float | timedelta | None = None) -> str:
        """``POST /pub`` (``defer`` in seconds → ``defer`` ms)."""
        params: dict[str, Any] = {"topic": topic}
        if defer is not None:
            seconds = defer.total_seconds() if isinstance(defer, timedelta) else float(defer)
            params["defer"] = round(seconds * 1000)
        return str(await self._request("POST", "/pub", params, data))

    async def multipublish(self, topic: str, messages: Iterable[bytes], binary: bool = True) -> str:
        """``POST /mpub``: binary framing by default, else newline-separated bodies."""
        items = list(messages)
        if binary:
            return str(
                await self._request(
                    "POST", "/mpub", {"topic": topic, "binary": True}, encode_mpub_body(items)
                )
            )
        if any(b"\n" in m for m in items):
            raise ValueError("newline-separated MPUB cannot carry bodies containing newlines")
        return str(await self._request("POST", "/mpub", {"topic": topic}, b"\n".join(items)))

    publish_many = multipublish

    async def create_topic(self, topic: str) -> None:
        await self._request("POST", "/topic/create", {"topic": topic})

    async def delete_topic(self, topic: str) -> None:
        await self._request("POST", "/topic/delete", {"topic": topic})

    async def empty_topic(self, topic: str) -> None:
        await self._request("POST", "/topic/empty", {"topic": topic})

    async def pause_topic(self, topic: str) -> None:
        await self._request("POST", "/topic/pause", {"topic": topic})

    async def unpause_topic(self, topic: str) -> None:
        await self._request("POST", "/topic/unpause", {"topic": topic})

    async def create_channel(self, topic: str, channel: str) -> None:
        await self._request("POST", "/channel/create", {"topic": topic, "channel": channel})

    async def delete_channel(self, topic: str, channel: str) -> None:
        await self._request("POST", "/channel/delete", {"topic": topic, "channel": channel})

    async def empty_channel(self, topic: str, channel: str) -> None:
        await self._request("POST", "/channel/empty", {"topic": topic, "channel": channel})

    async def pause_channel(self, topic: str, channel: str) -> None:
        await self._request("POST", "/channel/pause", {"topic": topic, "channel": channel})

    async def unpause_channel(self, topic: str, channel: str) -> None:
        await self._request("POST", "/channel/unpause", {"topic": topic, "channel": channel})

    async def stats(
        self,
        topic: str | None = None,
        channel: str | None = None,
        include_clients: bool | None = None,
        include_mem: bool | None = None,
    ) -> dict[str, Any]:
        """``GET /stats?format=json`` with the optional filters."""
        return dict(
            await self._request(
                "GET",
                "/stats",
                {
                    "format": "json",
                    "topic": topic,
                    "channel": channel,
                    "include_clients": include_clients,
                    "include_mem": include_mem,
                },
            )
        )

    async def get_config(self, opt: str) -> Any:
        return await self._request("GET", f"/config/{opt}")

    async def set_config(self, opt: str, value: Any) -> None:
        await self._request("PUT", f"/config/{opt}", data=json.dumps(value).encode())


class LookupdHTTPClient(_HTTPClient):
    """nsqlookupd's HTTP API: lookup, topics, channels, nodes, admin actions."""

    async def lookup(self, topic: str) -> dict[str, Any]:
        """``GET /lookup``: ``{"channels": [...], "producers": [...]}``."""
        return dict(await self._request("GET", "/lookup", {"topic": topic}))

    async def topics(self) -> list[str]:
        return list((await self._request("GET", "/topics"))["topics"])

    async def channels(self, topic: str) -> list[str]:
        return list((await self._request("GET", "/channels", {"topic": topic}))["channels"])

    async def nodes(self) -> list[dict[str, Any]]:
        return list((await self._request("GET", "/nodes"))["producers"])

    async def create_topic(self, topic: str) -> None:
        await self._request("POST", "/topic/create", {"topic": topic})

    async def delete_topic(self, topic: str) -> None:
        await self._request("POST", "/topic/delete", {"topic": topic})

    async def create_channel(self, topic: str, channel: str) -> None:
        await self._request("POST", "/channel/create", {"topic": topic, "channel": channel})

    async def delete_channel(self, topic: str, channel: str) -> None:
        await self._request("POST", "/channel/delete", {"topic": topic, "channel": channel})

    async def tombstone_topic(self, topic: str, node: str) -> None:
        """``POST /topic/tombstone``; ``node`` is ``broadcast_address:http_port``."""
        await self._request("POST", "/topic/tombstone", {"topic": topic, "node": node})
