"""Helpers for the nsqadmin tests: an in-process cluster (one nsqlookupd, two nsqd that
register with it as 127.0.0.1), nsqadmin over it, a small HTTP client and a recording HTTP
server (notifications, fake graphite).

Fixtures live here and are imported by the test modules (no conftest.py under tests/: a
second ``conftest`` module would shadow the root one).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import aiohttp
import pytest_asyncio
import yarl
from aiohttp import web
from support import wait_for

from nsqpy.nsqadmin import NSQAdmin, Options
from nsqpy.nsqd.nsqd import NSQD
from nsqpy.nsqd.options import Options as NsqdOptions
from nsqpy.nsqlookupd import NSQLookupd
from nsqpy.nsqlookupd import Options as LookupdOptions

V1 = "nsq; version=1.0"
JSON_CT = "application/json; charset=utf-8"


class HTTP:
    """``await http.get("/api/topics")`` → (status, headers, body); no redirects followed."""

    def __init__(self, session: aiohttp.ClientSession, address: str) -> None:
        self.session = session
        self.base = f"http://{address}"

    async def request(self, method: str, path: str, data: Any = None, **kw: Any):
        url = yarl.URL(self.base + path, encoded=True)
        async with self.session.request(method, url, data=data, allow_redirects=False, **kw) as r:
            return r.status, r.headers, await r.read()

    async def get(self, path: str, **kw: Any):
        return await self.request("GET", path, **kw)

    async def post(self, path: str, data: Any = b"", **kw: Any):
        return await self.request("POST", path, data=data, **kw)

    async def put(self, path: str, data: Any = b"", **kw: Any):
        return await self.request("PUT", path, data=data, **kw)

    async def delete(self, path: str, data: Any = None, **kw: Any):
        return await self.request("DELETE", path, data=data, **kw)

    async def json(self, path: str, status: int = 200) -> Any:
        got, _headers, body = await self.get(path)
        assert got == status, (got, body)
        return json.loads(body)

    async def post_json(self, path: str, doc: Any, **kw: Any):
        status, _, body = await self.post(path, json.dumps(doc).encode(), **kw)
        return status, json.loads(body) if body else None

    async def delete_json(self, path: str, doc: Any = None, **kw: Any):
        data = None if doc is None else json.dumps(doc).encode()
        status, _, body = await self.delete(path, data, **kw)
        return status, json.loads(body) if body else None


class Cluster:
    """One nsqlookupd and ``n`` nsqd registered with it (broadcast address 127.0.0.1)."""

    def __init__(self, tmp_path: Path, n: int = 2, **nsqd_options: Any) -> None:
        self.tmp_path = tmp_path
        self.n = n
        self.nsqd_options = nsqd_options
        self.lookupd: NSQLookupd | None = None
        self.nsqds: list[NSQD] = []
        self._stack = contextlib.AsyncExitStack()

    async def __aenter__(self) -> Cluster:
        self.lookupd = await self._stack.enter_async_context(
            NSQLookupd(LookupdOptions(tcp_address="127.0.0.1:0", http_address="127.0.0.1:0"))
        )
        for i in range(self.n):
            await self.add_nsqd(i)
        return self

    async def add_nsqd(self, i: int) -> NSQD:
        assert self.lookupd is not None
        data = self.tmp_path / f"nsqd{i}"
        data.mkdir(parents=True, exist_ok=True)
        opts = NsqdOptions(
            tcp_address="127.0.0.1:0",
            http_address="127.0.0.1:0",
            data_path=str(data),
            broadcast_address="127.0.0.1",
            nsqlookupd_tcp_addresses=[self.lookupd.tcp_addr_str],
            **self.nsqd_options,
        )
        nsqd = await self._stack.enter_async_context(NSQD(opts))
        self.nsqds.append(nsqd)
        return nsqd

    async def __aexit__(self, *exc: object) -> None:
        await self._stack.aclose()

    @property
    def lookupd_http(self) -> str:
        assert self.lookupd is not None
        return self.lookupd.http_addr_str

    async def registered(self, topic: str, producers: int, http: HTTP | None = None) -> None:
        """Wait until nsqlookupd lists ``producers`` producers of ``topic``."""
        assert self.lookupd is not None
        async with aiohttp.ClientSession() as s:
            url = f"http://{self.lookupd_http}/lookup?topic={topic}"

            async def ready() -> bool:
                async with s.get(url) as r:
                    if r.status != 200:
                        return False
                    doc = await r.json()
                return len(doc["producers"]) == producers

            await wait_for(ready, timeout=10)

    async def publish(self, nsqd: NSQD, topic: str, bodies: list[bytes]) -> None:
        async with (
            aiohttp.ClientSession() as s,
            s.post(f"http://{nsqd.http_addr_str}/mpub?topic={topic}", data=b"\n".join(bodies)) as r,
        ):
            assert r.status == 200, await r.text()

    async def nsqd_stats(self, nsqd: NSQD, topic: str = "") -> dict[str, Any]:
        async with aiohttp.ClientSession() as s:
            q = f"&topic={topic}" if topic else ""
            async with s.get(f"http://{nsqd.http_addr_str}/stats?format=json{q}") as r:
                return await r.json()


def admin_options(**kw: Any) -> Options:
    base: dict[str, Any] = dict(http_address="127.0.0.1:0", stats_sample_interval=0.0)
    base.update(kw)
    return Options(**base)


@contextlib.asynccontextmanager
async def running_admin(**kw: Any) -> AsyncIterator[tuple[NSQAdmin, HTTP]]:
    """nsqadmin in-process with ``kw`` options and an HTTP client on it."""
    async with NSQAdmin(admin_options(**kw)) as admin, aiohttp.ClientSession() as s:
        yield admin, HTTP(s, admin.http_addr_str)


class Recorder:
    """An HTTP server recording every request (method, path, query, headers, body) and
    answering with ``self.answer(request)`` (default 200 ``OK``)."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.answer: Callable[[web.Request], web.Response] = lambda r: web.Response(text="OK")
        self.runner: web.AppRunner | None = None
        self.port = 0

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        self.requests.append(
            {
                "method": request.method,
                "path": request.path,
                "query": request.rel_url.raw_query_string,
                "headers": dict(request.headers),
                "body": body,
            }
        )
        return self.answer(request)

    async def __aenter__(self) -> Recorder:
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self.handle)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.runner is not None
        await self.runner.cleanup()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def wait_requests(self, n: int, timeout: float = 5.0) -> list[dict[str, Any]]:
        await wait_for(lambda: len(self.requests) >= n, timeout=timeout)
        return self.requests


@pytest_asyncio.fixture(name="cluster")
async def cluster_fixture(tmp_path):
    async with Cluster(tmp_path) as c:
        yield c
