"""Helpers for the client tests: nsqd stats over HTTP."""

from __future__ import annotations

from typing import Any

import aiohttp


async def nsqd_stats(http_port: int, topic: str | None = None) -> dict[str, Any]:
    url = f"http://127.0.0.1:{http_port}/stats?format=json"
    if topic:
        url += f"&topic={topic}"
    async with aiohttp.ClientSession() as s, s.get(url) as r:
        data: dict[str, Any] = await r.json()
        return data


async def channel_stats(http_port: int, topic: str, channel: str) -> dict[str, Any] | None:
    stats = await nsqd_stats(http_port)
    for t in stats.get("topics", []):
        if t["topic_name"] == topic:
            for c in t["channels"]:
                if c["channel_name"] == channel:
                    return c  # type: ignore[no-any-return]
    return None


async def topic_depth(http_port: int, topic: str) -> int:
    stats = await nsqd_stats(http_port)
    for t in stats.get("topics", []):
        if t["topic_name"] == topic:
            return int(t["message_count"])
    return -1


def opts(tmp_path: Any, name: str, **kw: Any) -> Any:
    """nsqd Options on port 0 with a fresh data directory ``tmp_path/name``."""
    from conftest import make_options

    d = tmp_path / name
    d.mkdir(exist_ok=True)
    return make_options(d, **kw)
