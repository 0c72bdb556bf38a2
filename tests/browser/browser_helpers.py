"""Helpers for nsqadmin's browser tests: headless Chromium through Playwright, and a cluster
(nsqlookupd, two nsqd, nsqadmin instances, consumers) running in-process on an event loop of
its own thread, so that the tests drive the browser with Playwright's sync API.

Chromium is Debian's ``/usr/bin/chromium`` (``NSQPY_CHROMIUM`` overrides), started with the
flags this machine needs (headless, no sandbox, no network services) and a fresh profile.
When it is missing or cannot start, the tests fail; they skip only when it is absent and
``NSQPY_ALLOW_NO_BROWSER=1`` is set.

Screenshots of every page go to ``$NSQPY_BROWSER_ARTIFACTS`` if set, else to
``<pytest basetemp>/nsqadmin-screenshots``.

Fixtures live in this module and are imported by the test modules (no conftest.py under
tests/: a second ``conftest`` module would shadow the root one).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from support import AuthServer
from transport.certs import make_pki

from nsqpy.nsqadmin import NSQAdmin
from nsqpy.nsqadmin import Options as AdminOptions
from nsqpy.nsqd.nsqd import NSQD
from nsqpy.nsqd.options import Options as NsqdOptions
from nsqpy.nsqlookupd import NSQLookupd
from nsqpy.nsqlookupd import Options as LookupdOptions
from nsqpy.protocol import commands
from nsqpy.protocol.client import Answer, ClientProtocol, Ready
from nsqpy.transport import client_tls_context

CHROMIUM = Path(os.environ.get("NSQPY_CHROMIUM", "/usr/bin/chromium"))
NO_BROWSER_OK = os.environ.get("NSQPY_ALLOW_NO_BROWSER") == "1"
MISSING = (
    f"Chromium is not installed at {CHROMIUM} (Debian: apt-get install chromium); "
    "nsqadmin's browser tests need it"
)

try:
    from playwright.sync_api import expect
except ImportError as e:  # pragma: no cover - depends on the machine
    if not CHROMIUM.exists() and NO_BROWSER_OK:
        pytest.skip(MISSING + " (skipped: NSQPY_ALLOW_NO_BROWSER=1)", allow_module_level=True)
    raise ImportError(
        f"Playwright for Python is needed by the browser tests (pip install playwright): {e}"
    ) from e
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
ARTIFACTS_ENV = "NSQPY_BROWSER_ARTIFACTS"
#: how long the browser waits for something to show (ms)
UI_TIMEOUT = 10_000
expect.set_options(timeout=UI_TIMEOUT)

#: what the auth server grants every secret of these tests
GRANT = {
    "ttl": 3600,
    "identity": "ann",
    "identity_url": "http://people.example/ann",
    "authorizations": [{"topic": ".*", "channels": [".*"], "permissions": ["subscribe", "publish"]}],
}


def wait_until(cond: Callable[[], Any], timeout: float = 10.0, what: str = "condition") -> Any:
    """Poll ``cond`` until it returns something truthy (returned); fail after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        v = cond()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {v!r})")
        time.sleep(0.02)


def parse_int(text: str) -> int:
    """A number as the UI prints it ("1,234")."""
    return int(text.replace(",", "").strip())


# --- plain HTTP from the test thread ------------------------------------------------------------


def http(
    method: str,
    url: str,
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    timeout: float = 10.0,
) -> tuple[int, bytes]:
    req = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def get_json(url: str) -> Any:
    status, body = http("GET", url)
    assert status == 200, (url, status, body)
    return json.loads(body)


# --- a consumer connection (ClientProtocol over asyncio streams) --------------------------------


class Subscriber:
    """One consumer connection: the handshake (snappy, deflate, TLS, AUTH as asked), SUB, and
    commands; a reader task answers heartbeats and collects messages."""

    def __init__(self, proto: ClientProtocol, r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        self.p = proto
        self.r = r
        self.w = w
        self.messages: list[Any] = []
        self.answers: list[Answer] = []
        self.ready = asyncio.Event()
        self.changed = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    @classmethod
    async def open(
        cls,
        port: int,
        topic: str,
        channel: str,
        *,
        tls_context: Any = None,
        secret: str | None = None,
        **identify: Any,
    ) -> Subscriber:
        fields = {"heartbeat_interval": 1000, **identify}
        if tls_context is not None:
            fields["tls_v1"] = True
        proto: ClientProtocol = ClientProtocol(
            fields, tls_context=tls_context, server_hostname="127.0.0.1", auth_secret=secret
        )
        r, w = await asyncio.open_connection("127.0.0.1", port)
        sub = cls(proto, r, w)
        proto.start()
        sub.flush()
        sub.task = asyncio.get_running_loop().create_task(sub._read())
        await asyncio.wait_for(sub.ready.wait(), 10)
        await sub.request(commands.sub(topic, channel))
        return sub

    def flush(self) -> None:
        out = self.p.data_to_send()
        if out:
            self.w.write(out)

    async def _read(self) -> None:
        while True:
            data = await self.r.read(65536)
            if not data:
                return
            for e in self.p.receive(data):
                if isinstance(e, Ready):
                    self.ready.set()
                elif isinstance(e, Answer):
                    self.answers.append(e)
                elif isinstance(e, list):
                    self.messages += e
            self.flush()
            self.changed.set()

    async def _until(self, cond: Callable[[], Any], timeout: float = 10.0) -> Any:
        async def loop() -> Any:
            while True:
                v = cond()
                if v:
                    return v
                self.changed.clear()
                await self.changed.wait()

        return await asyncio.wait_for(loop(), timeout)

    async def request(self, cmd: bytes) -> bytes:
        n = len(self.answers)
        self.p.send_request(cmd)
        self.flush()
        await self._until(lambda: len(self.answers) > n)
        answer = self.answers[n]
        assert answer.error is None, answer.error
        return answer.data or b""

    def send(self, cmd: bytes) -> None:
        self.p.send(cmd)
        self.flush()

    async def wait_messages(self, n: int) -> list[Any]:
        await self._until(lambda: len(self.messages) >= n)
        return self.messages[:n]

    async def close(self) -> None:
        if self.task is not None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self.task
        self.w.close()
        with contextlib.suppress(ConnectionError, OSError):
            await self.w.wait_closed()


class FakeGraphite:
    """Graphite's /render: JSON datapoints for ``format=json`` (the rate), else a small SVG
    (the graph images); every request's query is recorded."""

    def __init__(self, value: float = 120.0) -> None:
        self.value = value
        self.queries: list[str] = []
        self.runner: web.AppRunner | None = None
        self.port = 0

    async def handle(self, request: web.Request) -> web.Response:
        self.queries.append(request.rel_url.raw_query_string)
        if request.query.get("format") == "json":
            return web.json_response([{"target": "x", "datapoints": [[self.value, 1700000000]]}])
        svg = (
            '<svg xmlns="http://www.w3.org/2000/svg" width="120" height="20">'
            '<path d="M0 18L40 8L80 12L120 2" stroke="blue" fill="none"/></svg>'
        )
        return web.Response(body=svg.encode(), content_type="image/svg+xml")

    async def start(self) -> FakeGraphite:
        app = web.Application()
        app.router.add_route("GET", "/render", self.handle)
        self.runner = web.AppRunner(app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        return self

    async def stop(self) -> None:
        assert self.runner is not None
        await self.runner.cleanup()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


class Cluster:
    """nsqlookupd, two nsqd (127.0.0.1, e2e percentiles on) and named nsqadmin instances, on
    an event loop of a thread of their own. ``run(coro)`` runs a coroutine there.

    With ``secure=True`` the second nsqd offers TLS and requires AUTH (an auth server granting
    the secret "good" as identity "ann"); :meth:`tls_context` is a client context for it."""

    def __init__(self, tmp: Path, *, secure: bool = False) -> None:
        self.tmp = tmp
        self.secure = secure
        self.pki: Any = None
        self.auth: AuthServer | None = None
        self.graphite: FakeGraphite | None = None
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="browser-cluster", daemon=True)
        self.stack = contextlib.AsyncExitStack()
        self.lookupd: NSQLookupd | None = None
        self.nsqds: list[NSQD] = []
        self.admins: dict[str, NSQAdmin] = {}
        self.subscribers: list[Subscriber] = []

    def run(self, coro: Coroutine[Any, Any, Any], timeout: float = 30.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def start(self) -> Cluster:
        self.thread.start()
        try:
            self.run(self._start())
        except BaseException:
            self.stop()
            raise
        return self

    async def _start(self) -> None:
        self.lookupd = await self.stack.enter_async_context(
            NSQLookupd(LookupdOptions(tcp_address="127.0.0.1:0", http_address="127.0.0.1:0"))
        )
        options: list[dict[str, Any]] = [{}, {}]
        if self.secure:
            self.pki = make_pki(self.tmp / "pki")
            self.auth = await AuthServer().start()
            self.auth.answers["good"] = GRANT
            self.stack.push_async_callback(self.auth.stop)
            options[1] = dict(
                tls_cert=self.pki.server_cert,
                tls_key=self.pki.server_key,
                auth_http_addresses=[self.auth.address],
            )
        for i, extra in enumerate(options):
            data = self.tmp / f"nsqd{i}"
            data.mkdir(parents=True, exist_ok=True)
            opts = NsqdOptions(
                tcp_address="127.0.0.1:0",
                http_address="127.0.0.1:0",
                data_path=str(data),
                broadcast_address="127.0.0.1",
                nsqlookupd_tcp_addresses=[self.lookupd.tcp_addr_str],
                e2e_processing_latency_percentiles=[0.5, 0.99],
                **extra,
            )
            self.nsqds.append(await self.stack.enter_async_context(NSQD(opts)))

    def tls_context(self) -> Any:
        return client_tls_context(root_ca_file=self.pki.ca_cert)

    def start_graphite(self) -> FakeGraphite:
        async def start() -> FakeGraphite:
            g = await FakeGraphite().start()
            self.stack.push_async_callback(g.stop)
            return g

        self.graphite = self.run(start())
        return self.graphite

    def add_admin(self, name: str, **kw: Any) -> NSQAdmin:
        """Start an nsqadmin over this cluster's nsqlookupd (``kw``: its options)."""
        assert self.lookupd is not None
        opts: dict[str, Any] = dict(
            http_address="127.0.0.1:0",
            nsqlookupd_http_addresses=[self.lookupd.http_addr_str],
            stats_sample_interval=0.25,
            stats_retention=600.0,
        )
        opts.update(kw)

        async def start() -> NSQAdmin:
            return await self.stack.enter_async_context(NSQAdmin(AdminOptions(**opts)))

        admin = self.run(start())
        self.admins[name] = admin
        return admin

    def stop(self) -> None:
        async def stop() -> None:
            for s in self.subscribers:
                await s.close()
            await self.stack.aclose()

        if self.thread.is_alive():
            with contextlib.suppress(Exception):
                self.run(stop(), timeout=30)
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(10)
        self.loop.close()

    # --- addresses and reads -----------------------------------------------------------------

    def url(self, admin: str, path: str = "/") -> str:
        return f"http://{self.admins[admin].http_addr_str}{path}"

    def nsqd_http(self, i: int) -> str:
        return self.nsqds[i].http_addr_str

    @property
    def lookupd_http(self) -> str:
        assert self.lookupd is not None
        return self.lookupd.http_addr_str

    def stats(self, i: int, topic: str = "") -> dict[str, Any]:
        q = f"&topic={topic}" if topic else ""
        return get_json(f"http://{self.nsqd_http(i)}/stats?format=json{q}")

    def topic_stats(self, i: int, topic: str) -> dict[str, Any] | None:
        for t in self.stats(i)["topics"]:
            if t["topic_name"] == topic:
                return t
        return None

    def channel_stats(self, i: int, topic: str, channel: str) -> dict[str, Any] | None:
        t = self.topic_stats(i, topic)
        for c in (t or {}).get("channels") or ():
            if c["channel_name"] == channel:
                return c
        return None

    def lookupd_get(self, path: str) -> Any:
        return get_json(f"http://{self.lookupd_http}{path}")

    # --- writes --------------------------------------------------------------------------------

    def publish(self, i: int, topic: str, n: int, body: bytes = b"message") -> None:
        status, text = http("POST", f"http://{self.nsqd_http(i)}/mpub?topic={topic}", b"\n".join([body] * n))
        assert status == 200, text

    def nsqd_post(self, i: int, path: str) -> None:
        status, text = http("POST", f"http://{self.nsqd_http(i)}{path}", b"")
        assert status == 200, (path, text)

    def lookupd_post(self, path: str) -> None:
        status, text = http("POST", f"http://{self.lookupd_http}{path}", b"")
        assert status == 200, (path, text)

    def registered(self, topic: str, producers: int) -> None:
        """Wait until nsqlookupd lists ``producers`` producers of ``topic``."""

        def ok() -> bool:
            status, body = http("GET", f"http://{self.lookupd_http}/lookup?topic={topic}")
            return status == 200 and len(json.loads(body)["producers"]) == producers

        wait_until(ok, what=f"{producers} producers of {topic} in nsqlookupd")

    def subscribe(self, i: int, topic: str, channel: str, **kw: Any) -> Subscriber:
        sub = self.run(Subscriber.open(self.nsqds[i].tcp_port, topic, channel, **kw))
        self.subscribers.append(sub)
        return sub

    def call(self, fn: Callable[[], Any]) -> Any:
        """Run a plain function on the cluster's loop (for Subscriber.send)."""

        async def wrap() -> Any:
            return fn()

        return self.run(wrap())


# --- the browser ------------------------------------------------------------------------------------


def _browser_unavailable() -> str | None:
    if CHROMIUM.exists():
        return None
    if NO_BROWSER_OK:
        pytest.skip(MISSING + " (skipped: NSQPY_ALLOW_NO_BROWSER=1)")
    return MISSING


class Browser:
    """A Chromium profile (one persistent context) opening pages that record their console
    errors, and the folder of the screenshots."""

    def __init__(self, context: Any, shots: Path) -> None:
        self.context = context
        self.shots = shots
        self.errors: list[str] = []

    def page(self, user: str | None = None) -> Any:
        """A new tab; ``user`` is sent as X-Forwarded-User (the ACL header)."""
        page = self.context.new_page()
        page.set_default_timeout(UI_TIMEOUT)
        if user is not None:
            page.set_extra_http_headers({"X-Forwarded-User": user})
        page.on("pageerror", lambda e: self.errors.append(f"{page.url}: {e}"))
        page.on(
            "console",
            lambda m: (
                self.errors.append(f"{page.url}: console.{m.type}: {m.text}")
                if m.type == "error" and not _expected_console_error(m.text)
                else None
            ),
        )
        return page

    def shot(self, page: Any, name: str) -> Path:
        path = self.shots / f"{name}.png"
        page.screenshot(path=str(path), full_page=True)
        return path

    def assert_no_errors(self) -> None:
        errors, self.errors[:] = list(self.errors), []
        assert not errors, "JavaScript errors:\n" + "\n".join(errors)


def _expected_console_error(text: str) -> bool:
    # a failed HTTP answer the page shows itself (4xx/5xx of an API call or a graph image)
    return bool(re.search(r"Failed to load resource: the server responded with a status of", text))


class BrokenBrowser:
    """Stands for a Chromium that could not be started: every test using it fails with why."""

    def __init__(self, problem: str) -> None:
        self.problem = problem

    def __getattr__(self, name: str) -> Any:
        pytest.fail(self.problem, pytrace=False)


@contextlib.contextmanager
def launch_browser(tmp: Path, shots: Path) -> Iterator[Any]:
    """A :class:`Browser` on a fresh profile, or a :class:`BrokenBrowser` saying why Chromium
    could not be started (skips instead only when it is absent and NSQPY_ALLOW_NO_BROWSER=1)."""
    problem = _browser_unavailable()
    if problem:
        yield BrokenBrowser(problem)
        return
    from playwright.sync_api import sync_playwright

    profile = tmp / "chromium-profile"
    profile.mkdir(parents=True, exist_ok=True)
    pw = sync_playwright().start()
    try:
        try:
            context = pw.chromium.launch_persistent_context(
                str(profile),
                executable_path=str(CHROMIUM),
                headless=True,
                args=CHROMIUM_ARGS,
                viewport={"width": 1360, "height": 900},
                timeout=60_000,
            )
        except Exception as e:
            yield BrokenBrowser(f"Chromium ({CHROMIUM}) could not be started: {e}")
            return
        try:
            yield Browser(context, shots)
        finally:
            context.close()
    finally:
        pw.stop()


def screenshot_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    env = os.environ.get(ARTIFACTS_ENV)
    path = Path(env) if env else tmp_path_factory.getbasetemp() / "nsqadmin-screenshots"
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(name="browser", scope="module")
def browser_fixture(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browser]:
    with launch_browser(tmp_path_factory.mktemp("browser"), screenshot_dir(tmp_path_factory)) as b:
        yield b
