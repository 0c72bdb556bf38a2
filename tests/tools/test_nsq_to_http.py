"""``nsq_to_http`` as a real console script against a real ``nsqd`` (and ``nsqlookupd``) and an
aiohttp server that records every request: the exact requests (method, target, headers,
body) for POST and GET, ``--header``/``--content-type``, ``-n``, each ``--mode`` over several
destinations, failures and timeouts requeued with backoff and redelivered, ``max_attempts``,
``--sample``, ``--status-every`` lines and the exit summary, signals, discovery, and Go's
command-line checks and ``--help``."""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from aiohttp import web
from e2e.proc import NsqdProcess, nsqd_fixture
from tools_helpers import (
    ToolProcess,
    channels,
    free_port,
    publish_http,
    registered_topic,
    run_tool,
    wait_until,
)

pytestmark = pytest.mark.timeout(90)

UA = "nsq_to_http v1.3.0"


# --- the destination: an aiohttp server on its own thread that records requests ----------------


@dataclass(frozen=True)
class Seen:
    """One request as it arrived: the raw request target and header lines, the body."""

    method: str
    target: str
    headers: tuple[tuple[str, str], ...]
    body: bytes
    at: float

    def header_map(self) -> dict[str, str]:
        return dict(self.headers)


@dataclass
class Route:
    statuses: list[int] = field(default_factory=list)  # answered first, in order
    status: int = 200  # then this
    delays: list[float] = field(default_factory=list)  # server-side delay of the first requests
    body_delays: list[float] = field(default_factory=list)  # pause in the middle of the answer's body
    hold: bool = False  # wait for release()
    barrier: int = 0  # wait until this many requests of the route are in flight (or release())
    inflight: int = 0
    max_inflight: int = 0


class Recorder:
    """Routes are the first path segment (``/<name>...``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: list[Seen] = []
        self.routes: dict[str, Route] = {}
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._runner: web.AppRunner | None = None
        self._gate: asyncio.Event | None = None
        self._changed: asyncio.Condition | None = None
        self._thread = threading.Thread(target=self._run, name="http-recorder", daemon=True)
        self._ready = threading.Event()

    def start(self) -> Recorder:
        self._thread.start()
        assert self._ready.wait(10), "recorder did not start"
        return self

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        loop.run_until_complete(self._setup())
        self._ready.set()
        loop.run_forever()
        loop.run_until_complete(self._runner.cleanup() if self._runner else asyncio.sleep(0))
        loop.close()

    async def _setup(self) -> None:
        self._gate = asyncio.Event()
        self._changed = asyncio.Condition()

        @web.middleware
        async def every_path(request: web.Request, handler: object) -> web.StreamResponse:
            return await self._handle(request)  # whatever the router thinks of the path

        app = web.Application(middlewares=[every_path])
        self._runner = web.AppRunner(app, shutdown_timeout=0.5, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        body = await request.read()
        seen = Seen(
            request.method,
            request.raw_path,
            tuple((k.decode(), v.decode("latin-1")) for k, v in request.raw_headers),
            body,
            time.monotonic(),
        )
        name = request.raw_path.lstrip("/").split("/", 1)[0].split("?", 1)[0]
        route = self.routes.setdefault(name, Route())
        assert self._gate is not None and self._changed is not None
        with self._lock:
            self._seen.append(seen)
            delay = route.delays.pop(0) if route.delays else 0.0
            body_delay = route.body_delays.pop(0) if route.body_delays else 0.0
            status = route.statuses.pop(0) if route.statuses else route.status
        async with self._changed:
            route.inflight += 1
            route.max_inflight = max(route.max_inflight, route.inflight)
            self._changed.notify_all()
        try:
            if route.hold:
                await self._gate.wait()
            if route.barrier:
                async with self._changed:
                    # a safety net, not a synchronisation: the test checks max_inflight after
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(
                            self._changed.wait_for(
                                lambda: route.inflight >= route.barrier or self._gate.is_set()
                            ),
                            15,
                        )
            if delay:
                await asyncio.sleep(delay)
            if body_delay:
                resp = web.StreamResponse(status=status)
                resp.content_length = 20
                await resp.prepare(request)
                await resp.write(b"first half")
                await asyncio.sleep(body_delay)
                await resp.write(b"other half")
                return resp
            return web.Response(status=status, text="answer body, read and dropped\n")
        finally:
            async with self._changed:
                route.inflight -= 1
                self._changed.notify_all()

    def route(self, name: str, **kw: object) -> str:
        """Set how ``/<name>`` answers; returns its base URL."""
        self.routes[name] = Route(**kw)  # type: ignore[arg-type]
        return self.url(name)

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.port}/{name}"

    def seen(self, name: str | None = None) -> list[Seen]:
        with self._lock:
            items = list(self._seen)
        if name is None:
            return items
        return [s for s in items if re.match(rf"/{re.escape(name)}(?:[/?]|$)", s.target)]

    def release(self) -> None:
        assert self._loop is not None and self._gate is not None
        self._loop.call_soon_threadsafe(self._gate.set)

    def stop(self) -> None:
        if self._loop is not None and self._loop.is_running():
            self.release()
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)


@pytest.fixture
def http() -> Iterator[Recorder]:
    r = Recorder().start()
    try:
        yield r
    finally:
        r.stop()


@pytest.fixture(scope="module")
def nsqd_proc(tmp_path_factory):
    yield from nsqd_fixture(tmp_path_factory.mktemp("nsq_to_http"))


_topic_counter = iter(range(1_000_000))


@pytest.fixture
def topic(request) -> str:
    """A topic of its own for each test."""
    return (
        f"h{next(_topic_counter)}_{request.node.name[:40]}".replace("[", "_")
        .replace("]", "_")
        .replace("-", "_")
        .replace(".", "_")[:64]
    )


def start(nsqd: NsqdProcess, tmp_path, topic: str, *args: str) -> ToolProcess:
    return ToolProcess(
        "nsq_to_http", [f"--nsqd-tcp-address={nsqd.tcp_address}", f"--topic={topic}", *args], tmp_path
    )


def stop_ok(p: ToolProcess, sig: int = signal.SIGTERM) -> str:
    """Signal the tool, expect exit 0 without a traceback; its stderr."""
    p.signal(sig)
    assert p.wait(20) == 0, p.describe()
    err = p.stderr()
    assert "Traceback" not in err, err
    return err


def channel(nsqd: NsqdProcess, topic: str, name: str = "nsq_to_http") -> dict:
    return channels(nsqd, topic).get(name) or {}


def drained(nsqd: NsqdProcess, topic: str, finished: int, name: str = "nsq_to_http") -> dict:
    """Wait until the channel has nothing left (queued, in flight or deferred) and its tool's
    connection FINished ``finished`` messages."""

    def cond() -> dict | None:
        ch = channel(nsqd, topic, name)
        if not ch or ch["depth"] or ch["in_flight_count"] or ch["deferred_count"]:
            return None
        clients = ch["clients"] or []
        return ch if sum(c["finish_count"] for c in clients) == finished else None

    return wait_until(cond, timeout=20, what=f"{finished} messages FINished and the channel empty")


# --- the requests -----------------------------------------------------------------------------


def test_post_requests_are_gos(nsqd_proc, http, tmp_path, topic):
    bodies = [b"first message", b'{"json": [1, 2]}', b"\x00\xffbinary\r\n", b"x" * 70_000]
    publish_http(nsqd_proc, topic, *bodies)
    url = http.route("in") + "/path?q=1&r=a%2Fb"
    with start(
        nsqd_proc,
        tmp_path,
        topic,
        f"--post={url}",
        "-n",
        "1",
        "--max-in-flight=1",
        "--consumer-opt=client_id,to-http-test",
    ) as p:
        wait_until(lambda: len(http.seen("in")) == 4, what="4 requests", timeout=20)
        ch = drained(nsqd_proc, topic, 4)
        client = ch["clients"][0]
        assert client["user_agent"].startswith("nsq_to_http/1.3.0 ")
        assert client["client_id"] == "to-http-test"
        assert client["ready_count"] == 1
        err = stop_ok(p)
    seen = http.seen("in")
    assert [s.body for s in seen] == bodies  # -n 1 and RDY 1: nsqd's order
    for s, body in zip(seen, bodies, strict=True):
        assert s.method == "POST"
        assert s.target == "/in/path?q=1&r=a%2Fb"
        assert s.header_map() == {
            "Host": f"127.0.0.1:{http.port}",
            "User-Agent": UA,
            "Content-Type": "application/octet-stream",
            "Accept-Encoding": "gzip",
            "Content-Length": str(len(body)),
        }
    assert "messages: 4 handled, 4 published, 0 skipped by --sample, 0 requeued" in err
    assert "requests: 4 OK, 0 failed" in err


def test_get_puts_the_query_escaped_message_where_the_url_says(nsqd_proc, http, tmp_path, topic):
    bodies = [b"hello world", b"a/b?c=d&e=f#g", "ça~._-".encode(), b"\xff\x00\n", b"100%+"]
    escaped = ["hello+world", "a%2Fb%3Fc%3Dd%26e%3Df%23g", "%C3%A7a~._-", "%FF%00%0A", "100%25%2B"]
    publish_http(nsqd_proc, topic, *bodies)
    http.route("q")
    http.route("p")
    http.route("f")
    # every destination gets every message with --mode=multicast (Go's ModeAll)
    args = [
        f"--get={http.url('q')}?data=%s&pct=%%25",  # %% is a literal %
        f"--get={http.url('p')}/%s/end",
        f"--get={http.url('f')}?a=%s&b=%d",  # Go's fmt: %d has no argument left
        "--mode=multicast",
        "-n",
        "1",
        "--max-in-flight=1",
    ]
    with start(nsqd_proc, tmp_path, topic, *args) as p:
        wait_until(lambda: len(http.seen()) == 15, what="15 requests", timeout=20)
        drained(nsqd_proc, topic, 5)
        err = stop_ok(p)
    assert (
        f"--get {http.url('f')}?a=%s&b=%d: a % other than %s or %% is a printf verb, as in Go: "
        f"the URL becomes {http.url('f')}?a=<MESSAGE>&b=%!d(MISSING)"
    ) in err
    assert err.count("is a printf verb") == 1
    assert [s.target for s in http.seen("q")] == [f"/q?data={e}&pct=%25" for e in escaped]
    assert [s.target for s in http.seen("p")] == [f"/p/{e}/end" for e in escaped]
    assert [s.target for s in http.seen("f")] == [f"/f?a={e}&b=%!d(MISSING)" for e in escaped]
    # in multicast mode each message goes to the destinations in their order
    assert [s.target.split("/")[1][0] for s in http.seen()] == ["q", "p", "f"] * 5
    for s in http.seen():
        assert s.method == "GET"
        assert s.body == b""
        assert s.header_map() == {
            "Host": f"127.0.0.1:{http.port}",
            "User-Agent": UA,
            "Accept-Encoding": "gzip",
        }


def test_headers_and_content_type(nsqd_proc, http, tmp_path, topic):
    publish_http(nsqd_proc, topic, b'{"a":1}')
    with start(
        nsqd_proc,
        tmp_path,
        topic,
        f"--post={http.route('h')}",
        "--header",
        "X-Trace-Id: abc 123",
        "--header=x-lower-case:v:with:colons",
        "--header= Authorization :  Bearer t0k3n ",
        "--header=user-agent: custom-agent/2",
        "--header=Host: ignored.example",
        "--content-type=application/json",
    ) as p:
        wait_until(lambda: http.seen("h"), what="the request")
        drained(nsqd_proc, topic, 1)
        err = stop_ok(p)
    (s,) = http.seen("h")
    assert s.header_map() == {
        "Host": f"127.0.0.1:{http.port}",
        "User-Agent": "custom-agent/2",
        "Content-Type": "application/json",
        "X-Trace-Id": "abc 123",
        "X-Lower-Case": "v:with:colons",
        "Authorization": "Bearer t0k3n",
        "Accept-Encoding": "gzip",
        "Content-Length": "7",
    }
    assert "t0k3n" not in err


def test_http_proxy_from_the_environment(nsqd_proc, http, tmp_path, topic):
    """HTTP_PROXY is used as Go's ProxyFromEnvironment does (here the recorder is the proxy)."""
    publish_http(nsqd_proc, topic, b"via proxy")
    http.route("proxied")
    env = {**os.environ, "HTTP_PROXY": f"127.0.0.1:{http.port}", "NO_PROXY": "skip.invalid"}
    args = [
        f"--nsqd-tcp-address={nsqd_proc.tcp_address}",
        f"--topic={topic}",
        "--post=http://destination.invalid/proxied?x=1",
        "--mode=multicast",
        f"--post={http.url('direct')}",
        "--post=http://skip.invalid/x",
        "--max-in-flight=1",
        "--consumer-opt=default_requeue_delay,1m",
    ]
    with ToolProcess("nsq_to_http", args, tmp_path, env=env) as p:
        wait_until(lambda: "Handler returned error" in p.stderr(), what="the third destination to fail")
        err = stop_ok(p)
    seen = http.seen()
    assert [(s.method, s.target, s.body) for s in seen] == [
        ("POST", "http://destination.invalid/proxied?x=1", b"via proxy"),  # through the proxy
        ("POST", "/direct", b"via proxy"),  # a loopback destination: never proxied
    ]
    assert seen[0].header_map()["Host"] == "destination.invalid"
    assert 'Post "http://skip.invalid/x": dial tcp: lookup skip.invalid: ' in err  # NO_PROXY: direct


# --- modes over several destinations ----------------------------------------------------------


def test_round_robin_starts_with_the_second_destination(nsqd_proc, http, tmp_path, topic):
    bodies = [b"m%d" % i for i in range(7)]
    publish_http(nsqd_proc, topic, *bodies)
    urls = [http.route(n) for n in ("a", "b", "c")]
    with start(
        nsqd_proc,
        tmp_path,
        topic,
        *(f"--post={u}" for u in urls),
        "--mode=round-robin",
        "-n",
        "1",
        "--max-in-flight=1",
    ) as p:
        wait_until(lambda: len(http.seen()) == 7, what="7 requests")
        drained(nsqd_proc, topic, 7)
        stop_ok(p)
    # Go: counter incremented first, then counter % len
    assert [(s.target, s.body) for s in http.seen()] == [
        (f"/{'bca'[i % 3]}", b) for i, b in enumerate(bodies)
    ]


@pytest.mark.parametrize("mode", ["hostpool", "epsilon-greedy"])
def test_pools_skip_a_failing_destination(nsqd_proc, http, tmp_path, topic, mode):
    """A destination that failed is left alone for 30 s (go-hostpool); its message is
    requeued and delivered through the others; a refused connection counts as a failure."""
    bodies = [b"p%d" % i for i in range(12)]
    publish_http(nsqd_proc, topic, *bodies)
    refused = f"http://127.0.0.1:{free_port()}/down"
    urls = [http.route("ok1"), http.route("bad", status=500), refused, http.route("ok2")]
    with start(
        nsqd_proc,
        tmp_path,
        topic,
        *(f"--post={u}" for u in urls),
        f"--mode={mode}",
        "-n",
        "1",
        "--max-in-flight=1",
        "--consumer-opt=default_requeue_delay,0",
        "--consumer-opt=backoff_multiplier,10ms",
    ) as p:
        drained(nsqd_proc, topic, 12)
        err = stop_ok(p)
    ok = http.seen("ok1") + http.seen("ok2")
    assert sorted(s.body for s in ok) == sorted(bodies)  # each delivered once
    assert len(http.seen("bad")) <= 1  # tried at most once: then dead for 30 s
    assert err.count("connect: connection refused") <= 1
    failures = len(http.seen("bad")) + err.count("connect: connection refused")
    assert err.count("Handler returned error (") == failures
    summary = f"messages: {12 + failures} handled, 12 published, 0 skipped by --sample, {failures} requeued"
    assert summary in err
    if mode == "hostpool":
        # round robin from the first destination: both bad ones are met in the first round
        assert failures == 2
        assert [s.body for s in http.seen("ok1")][:1] == [b"p0"]


def test_unknown_mode_sends_to_every_destination_in_turn(nsqd_proc, http, tmp_path, topic):
    """Go's mode switch leaves ModeAll (the old multicast) for any other value; the first
    failure ends the turn and requeues the message, which then goes to all of them again."""
    publish_http(nsqd_proc, topic, b"one", b"two")
    urls = [http.route("x"), http.route("y", statuses=[503]), http.route("z")]
    with start(
        nsqd_proc,
        tmp_path,
        topic,
        *(f"--post={u}" for u in urls),
        "--mode=everything",
        "-n",
        "1",
        "--max-in-flight=1",
        "--consumer-opt=default_requeue_delay,0",
        "--consumer-opt=backoff_multiplier,10ms",
    ) as p:
        drained(nsqd_proc, topic, 2)
        stop_ok(p)
    assert [s.body for s in http.seen("z")].count(b"one") == 1
    assert [s.body for s in http.seen("z")].count(b"two") == 1
    assert [s.body for s in http.seen("y")].count(b"one") == 2  # 503 first, then OK
    assert [s.body for s in http.seen("x")].count(b"one") == 2  # before y each time
    assert [s.body for s in http.seen("x")].count(b"two") == 1


# --- failures, timeouts, backoff, max_attempts --------------------------------------------------


def test_failed_requests_are_requeued_with_go_delays_and_redelivered(nsqd_proc, http, tmp_path, topic):
    publish_http(nsqd_proc, topic, b"retry me")
    url = http.route("flaky", statuses=[500, 404])
    with start(
        nsqd_proc,
        tmp_path,
        topic,
        f"--post={url}",
        "--consumer-opt=default_requeue_delay,300ms",
        "--consumer-opt=backoff_multiplier,10ms",
    ) as p:
        wait_until(lambda: len(http.seen("flaky")) == 3, what="3 requests", timeout=20)
        ch = drained(nsqd_proc, topic, 1)
        assert ch["requeue_count"] == 2
        err = stop_ok(p)
    t = [s.at for s in http.seen("flaky")]
    assert [s.body for s in http.seen("flaky")] == [b"retry me"] * 3
    # REQ delay: default_requeue_delay × attempts (go-nsq's Requeue(-1))
    assert t[1] - t[0] >= 0.29
    assert t[2] - t[1] >= 0.59
    assert re.search(r"Handler returned error \(got status code 500\) for msg [0-9a-f]{16}", err)
    assert "Handler returned error (got status code 404)" in err
    assert "messages: 3 handled, 1 published, 0 skipped by --sample, 2 requeued" in err


def test_get_needs_200_and_post_any_2xx(nsqd_proc, http, tmp_path, topic):
    publish_http(nsqd_proc, topic, b"g")
    with start(
        nsqd_proc,
        tmp_path,
        topic,
        f"--get={http.route('g', statuses=[204])}?m=%s",
        "--consumer-opt=default_requeue_delay,0",
        "--consumer-opt=backoff_multiplier,10ms",
    ) as p:
        drained(nsqd_proc, topic, 1)
        err = stop_ok(p)
    assert len(http.seen("g")) == 2
    assert "Handler returned error (got status code 204)" in err
    topic2 = topic[:50] + "_post"
    publish_http(nsqd_proc, topic2, b"p")
    with start(nsqd_proc, tmp_path, topic2, f"--post={http.route('p2', status=204)}") as p:
        drained(nsqd_proc, topic2, 1)
        stop_ok(p)
    assert len(http.seen("p2")) == 1


def test_gives_up_after_max_attempts(nsqd_proc, http, tmp_path, topic):
    publish_http(nsqd_proc, topic, b"doomed")
    with start(
        nsqd_proc,
        tmp_path,
        topic,
        f"--post={http.route('dead', status=502)}",
        "--consumer-opt=max_attempts,3",
        "--consumer-opt=default_requeue_delay,0",
        "--consumer-opt=backoff_multiplier,10ms",
    ) as p:
        wait_until(lambda: len(http.seen("dead")) == 3, what="3 attempts")
        drained(nsqd_proc, topic, 1)  # the 4th delivery is given up: FINished, no request
        err = stop_ok(p)
    assert len(http.seen("dead")) == 3
    assert "giving up" in err
    assert "3 requeued after a failed request, 1 given up after max_attempts" in err


def test_request_timeout_requeues(nsqd_proc, http, tmp_path, topic):
    publish_http(nsqd_proc, topic, b"slow")
    url = http.route("slow", delays=[3.0])
    with start(
        nsqd_proc,
        tmp_path,
        topic,
        f"--post={url}",
        "--http-client-request-timeout=300ms",
        "--consumer-opt=default_requeue_delay,0",
        "--consumer-opt=backoff_multiplier,10ms",
    ) as p:
        drained(nsqd_proc, topic, 1)
        err = stop_ok(p)
    seen = http.seen("slow")
    assert [s.body for s in seen] == [b"slow", b"slow"]
    assert seen[1].at - seen[0].at < 2.5  # not waiting for the slow answer
    assert "context deadline exceeded (Client.Timeout exceeded while awaiting headers)" in err


def test_request_timeout_while_reading_the_answer_requeues(nsqd_proc, http, tmp_path, topic):
    """1.3 checks the reading of the body: a 200 whose body does not arrive in time fails."""
    publish_http(nsqd_proc, topic, b"slow body")
    url = http.route("slowbody", body_delays=[3.0])
    with start(
        nsqd_proc,
        tmp_path,
        topic,
        f"--post={url}",
        "--http-client-request-timeout=500ms",
        "--consumer-opt=default_requeue_delay,0",
        "--consumer-opt=backoff_multiplier,10ms",
    ) as p:
        drained(nsqd_proc, topic, 1)
        err = stop_ok(p)
    assert [s.body for s in http.seen("slowbody")] == [b"slow body", b"slow body"]
    assert (
        "Handler returned error (context deadline exceeded (Client.Timeout or context "
        "cancellation while reading body))"
    ) in err


def test_connect_timeout_requeues(nsqd_proc, http, tmp_path, topic):
    """A destination whose listen queue is full never completes the TCP handshake."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(0)
    port = srv.getsockname()[1]
    fillers = []
    for _ in range(8):
        c = socket.socket()
        c.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            c.connect(("127.0.0.1", port))
        fillers.append(c)
    try:
        publish_http(nsqd_proc, topic, b"unreachable")
        with start(
            nsqd_proc,
            tmp_path,
            topic,
            f"--post=http://127.0.0.1:{port}/x",
            "--http-client-connect-timeout=200ms",
            "--http-client-request-timeout=60s",
            "--consumer-opt=default_requeue_delay,30s",
        ) as p:
            started = time.monotonic()
            wait_until(
                lambda: channel(nsqd_proc, topic).get("deferred_count") == 1,
                what="the message requeued with a delay",
                timeout=15,
            )
            assert time.monotonic() - started < 10  # the 60s request timeout did not apply
            err = stop_ok(p)
        assert f'Post "http://127.0.0.1:{port}/x": dial tcp 127.0.0.1:{port}: i/o timeout' in err
    finally:
        for c in fillers:
            c.close()
        srv.close()


# --- -n, --sample, --status-every ---------------------------------------------------------------


def test_n_concurrent_requests(nsqd_proc, http, tmp_path, topic):
    publish_http(nsqd_proc, topic, *(b"c%d" % i for i in range(12)))
    url = http.route("conc", barrier=3)
    with start(nsqd_proc, tmp_path, topic, f"--post={url}", "-n", "3", "--max-in-flight=12") as p:
        drained(nsqd_proc, topic, 12)
        stop_ok(p)
    assert len(http.seen("conc")) == 12
    assert http.routes["conc"].max_inflight == 3


def test_sample_zero_finishes_everything_without_requests(nsqd_proc, http, tmp_path, topic):
    publish_http(nsqd_proc, topic, *(b"s%d" % i for i in range(20)))
    with start(nsqd_proc, tmp_path, topic, f"--post={http.route('never')}", "--sample=0") as p:
        drained(nsqd_proc, topic, 20)
        err = stop_ok(p)
    assert http.seen() == []
    assert "messages: 20 handled, 0 published, 20 skipped by --sample" in err


def test_sample_half(nsqd_proc, http, tmp_path, topic):
    n = 400
    publish_http(nsqd_proc, topic, *(b"h%d" % i for i in range(n)))
    with start(nsqd_proc, tmp_path, topic, f"--post={http.route('half')}", "--sample=0.5") as p:
        drained(nsqd_proc, topic, n)
        err = stop_ok(p)
    sent = len(http.seen("half"))
    assert n * 0.3 < sent < n * 0.7  # binomial(400, 0.5): 200 ± 10 (σ)
    assert f"messages: {n} handled, {sent} published, {n - sent} skipped by --sample" in err


def test_status_every_lines(nsqd_proc, http, tmp_path, topic):
    publish_http(nsqd_proc, topic, *(b"st%d" % i for i in range(8)))
    a, b = http.route("sa"), http.route("sb")
    with start(
        nsqd_proc,
        tmp_path,
        topic,
        f"--post={a}",
        f"--post={b}",
        "--mode=round-robin",
        "--status-every=3",
        "-n",
        "1",
        "--max-in-flight=1",
    ) as p:
        drained(nsqd_proc, topic, 8)
        err = stop_ok(p)
    stat = r"finished 3 - 99th: \d+\.\d\dms - 95th: \d+\.\d\dms - avg: \d+\.\d\dms"
    # timer_metrics logs when its ring of 3 wraps: records 4 and 7 (aggregate), 4 (each address)
    assert len(re.findall(rf"\[aggregate\]: {stat}", err)) == 2
    assert len(re.findall(rf"\[{re.escape(a)}\]: {stat}", err)) == 1
    assert len(re.findall(rf"\[{re.escape(b)}\]: {stat}", err)) == 1
    assert (
        err.count("Warning: use more than 100 status values for accurate percentiles (configured with 3)")
        == 3
    )


def test_status_every_single_destination_has_no_per_address_line(nsqd_proc, http, tmp_path, topic):
    publish_http(nsqd_proc, topic, *(b"s%d" % i for i in range(5)))
    a = http.route("one")
    with start(nsqd_proc, tmp_path, topic, f"--post={a}", "--status-every=2", "-n", "1") as p:
        drained(nsqd_proc, topic, 5)
        err = stop_ok(p)
    assert len(re.findall(r"\[aggregate\]: finished 2 - ", err)) == 2  # records 3 and 5
    assert f"[{a}]:" not in err


# --- stopping -------------------------------------------------------------------------------------


def test_sigterm_finishes_the_requests_in_flight(nsqd_proc, http, tmp_path, topic):
    publish_http(nsqd_proc, topic, *(b"t%d" % i for i in range(5)))
    url = http.route("held", hold=True)
    with start(nsqd_proc, tmp_path, topic, f"--post={url}", "-n", "2", "--max-in-flight=5") as p:
        wait_until(lambda: http.routes["held"].inflight == 2, what="2 requests in flight")
        p.signal(signal.SIGTERM)
        wait_until(lambda: "stopping: waiting for the requests in flight" in p.stderr(), what="stopping")
        assert p.proc.poll() is None  # still waiting for the answers
        http.release()
        assert p.wait(20) == 0, p.describe()
        err = p.stderr()
    assert "Traceback" not in err
    ch = wait_until(
        lambda: (c := channel(nsqd_proc, topic)) and c["client_count"] == 0 and c, what="the tool gone"
    )
    # the two in flight were answered (FIN), the three waiting were requeued, none lost
    assert len(http.seen("held")) == 2
    assert ch["depth"] == 3 and ch["in_flight_count"] == 0
    assert "messages: 2 handled, 2 published" in err


def test_second_signal_requeues_the_requests_in_flight(nsqd_proc, http, tmp_path, topic):
    publish_http(nsqd_proc, topic, b"stuck")
    url = http.route("stuck", hold=True)
    with start(nsqd_proc, tmp_path, topic, f"--post={url}") as p:
        wait_until(lambda: http.routes["stuck"].inflight == 1, what="the request in flight")
        p.signal(signal.SIGTERM)
        wait_until(lambda: "stopping: waiting" in p.stderr(), what="stopping")
        p.signal(signal.SIGINT)
        assert p.wait(20) == 0, p.describe()
        err = p.stderr()
    assert "Traceback" not in err
    assert "requeueing the messages whose requests are in flight" in err
    ch = wait_until(
        lambda: (c := channel(nsqd_proc, topic)) and c["client_count"] == 0 and c, what="the tool gone"
    )
    assert ch["depth"] == 1  # back in the queue, ready for the next consumer


# --- discovery, failures to start, the command line ------------------------------------------------


def test_lookupd_discovery(tmp_path, http):
    with registered_topic(tmp_path, "found", b"via lookupd") as lookupd:
        with ToolProcess(
            "nsq_to_http",
            [
                f"--lookupd-http-address={lookupd.http_address}",
                "--topic=found",
                f"--post={http.route('found')}",
            ],
            tmp_path,
        ) as p:
            wait_until(lambda: http.seen("found"), what="the request", timeout=20)
            stop_ok(p)
        assert [s.body for s in http.seen("found")] == [b"via lookupd"]


def test_unreachable_nsqd_fails_clearly():
    res = run_tool(
        "nsq_to_http",
        f"--nsqd-tcp-address=127.0.0.1:{free_port()}",
        "--topic=t",
        "--post=http://127.0.0.1:1/",
        "--consumer-opt=dial_timeout,200ms",
    )
    assert res.returncode == 1
    assert b"failed to connect to nsqd 127.0.0.1:" in res.stderr


NSQD = "--nsqd-tcp-address=127.0.0.1:4150"
POST = "--post=http://127.0.0.1:1/"


@pytest.mark.parametrize(
    "args, code, expected",
    [
        (["--bogus"], 2, "flag provided but not defined: -bogus"),
        (["-n", "x"], 2, 'invalid value "x" for flag -n: parse error'),
        (["--sample=half"], 2, 'invalid value "half" for flag -sample: parse error'),
        (
            ["--http-client-request-timeout=5"],
            2,
            'invalid value "5" for flag -http-client-request-timeout: parse error',
        ),
        (["--consumer-opt=nope,1"], 2, 'invalid value "nope,1" for flag -consumer-opt: invalid option nope'),
        # Go's order of checks: --header comes first
        (["--header=no-colon"], 1, "--header value format should be 'key=value'"),
        (["--topic=t", "--header=X-Empty:  "], 1, "--header value format should be 'key=value'"),
        ([NSQD, POST], 1, "--topic and --channel are required"),
        (["--topic=t", "--channel=", NSQD, POST], 1, "--topic and --channel are required"),
        (
            ["--topic=t", NSQD, "--get=http://h/%s", "--content-type=text/plain"],
            1,
            "--content-type only used with --post",
        ),
        (["--topic=t", NSQD, POST, "--content-type="], 1, "--content-type requires a value when used"),
        (["--topic=t", POST], 1, "--nsqd-tcp-address or --lookupd-http-address required"),
        (
            ["--topic=t", POST, NSQD, "--lookupd-http-address=127.0.0.1:4161"],
            1,
            "use --nsqd-tcp-address or --lookupd-http-address not both",
        ),
        (["--topic=t", NSQD], 1, "--get or --post required"),
        (["--topic=t", NSQD, POST, "--get=http://h/%s"], 1, "use --get or --post not both"),
        (["--topic=t", NSQD, "--get=http://h/"], 1, "invalid GET address - must be a printf string"),
        (
            ["--topic=t", NSQD, "--get=http://h/%s", "--get=http://h/%s/%s"],
            1,
            "invalid GET address - must be a printf string",
        ),
        (["--topic=t", NSQD, POST, "--sample=1.5"], 1, "ERROR: --sample must be between 0.0 and 1.0"),
        (["--topic=t", NSQD, POST, "--sample=-0.1"], 1, "ERROR: --sample must be between 0.0 and 1.0"),
        (["--topic=bad topic", NSQD, POST], 1, "invalid topic name"),
        (["--topic=t", "--channel=bad channel", NSQD, POST], 1, "invalid channel name"),
        (["--topic=t", NSQD, POST, "--max-in-flight=-1"], 1, "max_in_flight"),
        (["--topic=t", NSQD, POST, "-n", "0"], 1, "no handlers"),
    ],
)
def test_bad_command_lines(args, code, expected):
    res = run_tool("nsq_to_http", *args)
    err = res.stderr.decode()
    assert res.returncode == code, err
    assert expected in err
    assert res.stdout == b""
    if code == 2:
        assert "Usage of nsq_to_http:" in err


#: NSQ 1.3's ``nsq_to_http -help`` (Go's flag.PrintDefaults, flags sorted by name)
HELP = """\
Usage of nsq_to_http:
  -channel string
    \tnsq channel (default "nsq_to_http")
  -consumer-opt value
    \toption to passthrough to nsq.Consumer (may be given multiple times, \
http://godoc.org/github.com/nsqio/go-nsq#Config)
  -content-type string
    \tthe Content-Type used for POST requests (default "application/octet-stream")
  -get value
    \tHTTP address to make a GET request to. '%s' will be printf replaced with data \
(may be given multiple times)
  -header value
    \tCustom header for HTTP requests (may be given multiple times)
  -http-client-connect-timeout duration
    \ttimeout for HTTP connect (default 2s)
  -http-client-request-timeout duration
    \ttimeout for HTTP request (default 20s)
  -lookupd-http-address value
    \tlookupd HTTP address (may be given multiple times)
  -max-in-flight int
    \tmax number of messages to allow in flight (default 200)
  -mode string
    \tthe upstream request mode options: round-robin, hostpool (default), epsilon-greedy \
(default "hostpool")
  -n int
    \tnumber of concurrent publishers (default 100)
  -nsqd-tcp-address value
    \tnsqd TCP address (may be given multiple times)
  -post value
    \tHTTP address to make a POST request to.  data will be in the body (may be given multiple times)
  -sample float
    \t% of messages to publish (float b/w 0 -> 1) (default 1)
  -status-every int
    \tthe # of requests between logging status (per handler), 0 disables (default 250)
  -topic string
    \tnsq topic
  -version
    \tprint version string
"""


def test_help_and_version():
    res = run_tool("nsq_to_http", "-h")
    assert (res.returncode, res.stdout, res.stderr.decode()) == (0, b"", HELP)
    res = run_tool("nsq_to_http", "--help")
    assert res.stderr.decode() == HELP
    res = run_tool("nsq_to_http", "--version")
    assert (res.returncode, res.stdout) == (0, b"nsq_to_http v1.3.0\n")
