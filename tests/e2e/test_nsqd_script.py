"""End to end: the ``nsqd`` console script as a real process, on ports picked by the OS.

Each test starts its own nsqd (the bad-input cases share one per module), stopped by PID
in teardown, which also asserts that it is still alive, exits 0 on SIGTERM and logged no
traceback; tests talk to it over real sockets.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import socket
import struct
import time

import pytest
from e2e.proc import NsqdProcess, nsqd_fixture, run_script, split_host_port, tcp_alive
from support import RawClient, wait_for

from nsqpy.protocol import commands
from nsqpy.protocol.frames import FRAME_TYPE_ERROR, FRAME_TYPE_RESPONSE

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def nsqd_proc(tmp_path):
    yield from nsqd_fixture(tmp_path)


@pytest.fixture(scope="module")
def shared_nsqd(tmp_path_factory):
    """One nsqd for the bad-input cases: each case must leave it healthy for the next."""
    yield from nsqd_fixture(tmp_path_factory.mktemp("shared"))


async def consumer(port: int, topic: str, channel: str, rdy: int | None = None, **identify) -> RawClient:
    c = await RawClient.connect(port)
    if identify:
        await c.identify(**identify)
    await c.sub(topic, channel, rdy)
    return c


async def assert_healthy(p: NsqdProcess, tag: str) -> None:
    """The daemon still runs, answers /ping, and moves a message from a new producer to a
    new consumer."""
    assert p.is_running(), p.describe()
    status, body = await asyncio.to_thread(p.http_get, "/ping")
    assert (status, body) == (200, b"OK")
    topic = f"health_{tag}"
    c = await consumer(p.tcp_port, topic, "ch", rdy=1)
    prod = await RawClient.connect(p.tcp_port)
    assert await prod.pub(topic, f"alive {tag}".encode()) == (FRAME_TYPE_RESPONSE, b"OK")
    msg = await c.read_message()
    assert msg.body == f"alive {tag}".encode()
    c.send(commands.fin(msg.id))
    await prod.close()
    await c.close()


# --- command line ------------------------------------------------------------------------------


def test_prints_addresses_first(nsqd_proc):
    lines = nsqd_proc.stdout().splitlines()
    assert re.fullmatch(r"nsqd TCP address: 127\.0\.0\.1:\d+", lines[0]), lines
    assert re.fullmatch(r"nsqd HTTP address: 127\.0\.0\.1:\d+", lines[1]), lines
    tcp = split_host_port(nsqd_proc.tcp_address)
    http = split_host_port(nsqd_proc.http_address)
    assert tcp[1] != 0 and http[1] != 0 and tcp[1] != http[1]
    assert tcp_alive(*tcp)
    assert nsqd_proc.http_get("/ping") == (200, b"OK")


@pytest.mark.parametrize("flag", ["--version", "-version", "--version=true"])
def test_version(flag, tmp_path):
    res = run_script("nsqd", flag, cwd=str(tmp_path))
    assert res.returncode == 0, res
    assert re.match(r"nsqd v1\.3\.0\b", res.stdout), res.stdout
    assert "address" not in res.stdout  # printed the version and did not start


@pytest.mark.parametrize("flag", ["--no-such-flag", "-no-such-flag", "--no-such-flag=1"])
def test_unknown_flag_exits_2(flag, tmp_path):
    res = run_script("nsqd", flag, cwd=str(tmp_path))
    assert res.returncode == 2, res
    # Go's flag package: "flag provided but not defined: -no-such-flag" (single dash)
    assert "flag provided but not defined: -no-such-flag" in res.stderr, res.stderr


def test_bad_flag_value_exits_2(tmp_path):
    res = run_script("nsqd", "--mem-queue-size=lots", cwd=str(tmp_path))
    assert res.returncode == 2, res
    assert 'invalid value "lots" for flag -mem-queue-size' in res.stderr, res.stderr


def test_unbuilt_feature_flag_refuses_to_start(tmp_path):
    res = run_script(
        "nsqd",
        "--tcp-address=127.0.0.1:0",
        "--http-address=127.0.0.1:0",
        f"--data-path={tmp_path}",
        "--enable-experiment=topology-aware-consumption",
    )
    assert res.returncode != 0, res
    assert "--enable-experiment" in res.stderr, res.stderr
    assert "address:" not in res.stdout, "it started anyway"


@pytest.mark.parametrize(
    "args,expect",
    [
        (["--tls-cert=missing.pem", "--tls-key=missing.key"], "failed to build TLS config - "),
        (["--tls-cert=missing.pem"], "failed to build TLS config - "),
        (["--tls-required"], "cannot require TLS client connections without TLS key and cert"),
        (["--max-deflate-level=10"], "--max-deflate-level must be [1,9]"),
        (["--auth-http-request-method=put"], "--auth-http-request-method must be post or get"),
    ],
    ids=["missing-cert", "cert-without-key", "required-without-cert", "deflate-level", "auth-method"],
)
def test_bad_tls_and_auth_settings_refuse_to_start(args, expect, tmp_path):
    res = run_script(
        "nsqd",
        "--tcp-address=127.0.0.1:0",
        "--http-address=127.0.0.1:0",
        f"--data-path={tmp_path}",
        *args,
        cwd=str(tmp_path),
    )
    assert res.returncode == 1, res
    assert expect in res.stderr, res.stderr
    assert "address:" not in res.stdout, "it started anyway"


async def test_config_file_is_honoured_and_flags_win(tmp_path):
    cfg = tmp_path / "nsqd.toml"
    cfg.write_text(
        "# NSQ's TOML key names\n"
        "max_rdy_count = 123\n"
        'msg_timeout = "7s"\n'
        "max_msg_size = 100\n"
        'tcp_address = "127.0.0.1:1"  # the command-line flag wins\n'
        "unknown_key = 5              # ignored, as the Go daemon does\n"
    )
    p = NsqdProcess(tmp_path / "a", f"--config={cfg}")
    try:
        p.start()
        c = await RawClient.connect(p.tcp_port)
        ident = await c.identify(feature_negotiation=True)
        assert ident["max_rdy_count"] == 123 and ident["msg_timeout"] == 7000, ident
        assert await c.pub("cfg", b"x" * 100) == (FRAME_TYPE_RESPONSE, b"OK")
        too_big = (FRAME_TYPE_ERROR, b"E_BAD_MESSAGE PUB message too big 101 > 100")
        assert await c.pub("cfg", b"x" * 101) == too_big
        await c.close()
        c = await consumer(p.tcp_port, "cfg", "ch")
        c.send(commands.rdy(124))
        assert await c.read_error() == "E_INVALID RDY count 124 out of range 0-123"
        await c.close()
    finally:
        assert p.stop() == 0, p.describe()

    p = NsqdProcess(tmp_path / "b", f"--config={cfg}", "--max-rdy-count=77")
    try:
        p.start()
        c = await RawClient.connect(p.tcp_port)
        ident = await c.identify(feature_negotiation=True)
        assert ident["max_rdy_count"] == 77 and ident["msg_timeout"] == 7000, ident
        await c.close()
    finally:
        assert p.stop() == 0, p.describe()


def test_missing_config_file_fails(tmp_path):
    res = run_script(
        "nsqd", f"--config={tmp_path / 'nope.toml'}", "--tcp-address=127.0.0.1:0", cwd=str(tmp_path)
    )
    assert res.returncode != 0
    assert "nope.toml" in res.stderr, res.stderr


def test_listen_address_in_use_fails(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for args in (
            [f"--tcp-address=127.0.0.1:{port}", "--http-address=127.0.0.1:0"],
            ["--tcp-address=127.0.0.1:0", f"--http-address=127.0.0.1:{port}"],
        ):
            res = run_script("nsqd", *args, f"--data-path={tmp_path}")
            assert res.returncode == 1, res
            assert "in use" in res.stderr and "Traceback" not in res.stderr, res.stderr


@pytest.mark.parametrize("addr", ["127.0.0.1:abc", "127.0.0.1:99999"])
def test_bad_listen_address_fails_cleanly(addr, tmp_path):
    res = run_script("nsqd", f"--tcp-address={addr}", "--http-address=127.0.0.1:0", f"--data-path={tmp_path}")
    assert res.returncode == 1, res
    assert "Traceback" not in res.stderr, res.stderr
    assert addr in res.stderr, res.stderr


def test_data_path_is_locked(nsqd_proc):
    res = run_script(
        "nsqd",
        "--tcp-address=127.0.0.1:0",
        "--http-address=127.0.0.1:0",
        f"--data-path={nsqd_proc.data_path}",
        timeout=3,
    )
    assert res.returncode == 1, res
    assert "failed to lock data-path" in res.stderr, res.stderr
    assert "possibly in use by another instance of nsqd" in res.stderr, res.stderr


def test_missing_data_path_fails_cleanly(tmp_path):
    res = run_script(
        "nsqd",
        "--tcp-address=127.0.0.1:0",
        "--http-address=127.0.0.1:0",
        f"--data-path={tmp_path / 'nope'}",
        timeout=3,
    )
    assert res.returncode == 1, res
    assert "failed to lock data-path" in res.stderr, res.stderr
    assert "Traceback" not in res.stderr


# --- messages over TCP -------------------------------------------------------------------------


async def test_publish_and_consume_n(nsqd_proc):
    """2200 messages by MPUB and PUB come out of one channel exactly once, byte-exact, and
    a second channel created before publishing gets its own copy of each."""
    port = nsqd_proc.tcp_port
    bodies = [f"m{i:05d}".encode() + bytes([i % 256, 0, 10, 255]) for i in range(2200)]
    c1 = await consumer(port, "e2e_n", "one", rdy=200)
    c2 = await consumer(port, "e2e_n", "two", rdy=200)
    prod = await RawClient.connect(port)
    for i in range(0, 2000, 200):
        prod.send(commands.mpub("e2e_n", bodies[i : i + 200]))
        assert await prod.read_frame() == (FRAME_TYPE_RESPONSE, b"OK")
    for b in bodies[2000:]:
        prod.send(commands.pub("e2e_n", b))
    for _ in bodies[2000:]:
        assert await prod.read_frame() == (FRAME_TYPE_RESPONSE, b"OK")

    async def drain(c: RawClient) -> list[bytes]:
        got = []
        while len(got) < len(bodies):
            msg = await c.read_message(timeout=10)
            assert msg.attempts == 1
            got.append(msg.body)
            c.send(commands.fin(msg.id))
        return got

    got1, got2 = await asyncio.gather(drain(c1), drain(c2))
    assert sorted(got1) == sorted(bodies) and len(set(got1)) == len(bodies)
    assert sorted(got2) == sorted(bodies)
    await c1.expect_silence(0.2)
    for c in (c1, c2, prod):
        await c.close()


async def test_consumers_of_one_channel_share_its_messages(nsqd_proc):
    """Two consumers on one channel: each message goes to exactly one of them, both get
    some."""
    port = nsqd_proc.tcp_port
    a = await consumer(port, "shared", "ch", rdy=50)
    b = await consumer(port, "shared", "ch", rdy=50)
    prod = await RawClient.connect(port)
    bodies = [b"s%04d" % i for i in range(1000)]
    for i in range(0, 1000, 250):
        prod.send(commands.mpub("shared", bodies[i : i + 250]))
        assert await prod.read_frame() == (FRAME_TYPE_RESPONSE, b"OK")
    got: dict[str, list[bytes]] = {"a": [], "b": []}

    async def drain(name: str, c: RawClient) -> None:
        while len(got["a"]) + len(got["b"]) < len(bodies):
            try:
                msg = await c.read_message(timeout=0.5)
            except TimeoutError:
                continue  # the other consumer may be taking the rest
            got[name].append(msg.body)
            c.send(commands.fin(msg.id))

    await asyncio.wait_for(asyncio.gather(drain("a", a), drain("b", b)), 15)
    assert sorted(got["a"] + got["b"]) == bodies
    assert got["a"] and got["b"], {k: len(v) for k, v in got.items()}
    for c in (a, b, prod):
        await c.close()


# --- signals ----------------------------------------------------------------------------------


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
async def test_signal_exits_0_with_clients_connected(sig, tmp_path):
    p = NsqdProcess(tmp_path / "nsqd")
    try:
        p.start()
        port = p.tcp_port
        # a consumer with messages in flight, a producer, a half-sent command, a client
        # that never reads and has a full socket buffer
        c = await consumer(port, "sig", "ch", rdy=5, heartbeat_interval=1000)
        prod = await RawClient.connect(port)
        for i in range(20):
            assert await prod.pub("sig", b"in flight %d" % i) == (FRAME_TYPE_RESPONSE, b"OK")
        await c.read_messages(5)
        half = await RawClient.connect(port)
        half.send(b"PUB sig\n" + struct.pack(">i", 100) + b"0123456789")
        stuck = stuck_reader(port, "sig_stuck")
        try:
            big = os.urandom(512 * 1024)
            assert await prod.pub("sig_stuck", big) == (FRAME_TYPE_RESPONSE, b"OK")
            t0 = time.monotonic()
            p.send_signal(sig)
            code = await asyncio.to_thread(p.wait, 8)
            elapsed = time.monotonic() - t0
        finally:
            stuck.close()
        assert code == 0, p.describe()
        assert elapsed < 5, f"took {elapsed:.1f}s to exit"
        assert "Traceback" not in p.stderr(), p.describe(20000)
        for cl in (c, prod, half):
            await cl.expect_closed()
            await cl.close()
        assert not tcp_alive("127.0.0.1", port)
    finally:
        p.kill()


# --- bad input --------------------------------------------------------------------------------


def stuck_reader(port: int, topic: str) -> socket.socket:
    """A blocking-socket consumer that subscribes with RDY 2500 and then never reads."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.settimeout(5)
    s.connect(("127.0.0.1", port))
    s.sendall(b"  V2" + commands.sub(topic, "ch") + commands.rdy(2500))
    return s


async def raw_exchange(port: int, data: bytes, timeout: float = 5.0) -> tuple[list[tuple[int, bytes]], bool]:
    """Send ``data`` on a fresh connection; return the frames received and whether the
    server closed the connection."""
    c = await RawClient.connect(port, magic=False)
    c.send(data)
    frames: list[tuple[int, bytes]] = []
    closed = False
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            try:
                frames.append(await c.read_frame(timeout=deadline - time.monotonic()))
            except (ConnectionError, TimeoutError):
                closed = True
                break
    finally:
        await c.close()
    return frames, closed


def _i32(*values: int) -> bytes:
    return struct.pack(f">{len(values)}i", *values)


BIG = 0x7FFFFFFF
BAD_INPUT = [
    # (id, bytes sent on a fresh connection, expected start of the error frame)
    ("http-request", b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", b"E_BAD_PROTOCOL"),
    ("binary-garbage", b"\x00\x01\x02\x03" * 1000, b"E_BAD_PROTOCOL"),
    ("unknown-command", b"  V2HELLO WORLD\n", b"E_INVALID invalid command HELLO"),
    (
        "pub-huge-size",
        b"  V2PUB big\n" + _i32(BIG),
        b"E_BAD_MESSAGE PUB message too big 2147483647 > 1048576",
    ),
    ("pub-negative-size", b"  V2PUB neg\n" + _i32(-1), b"E_BAD_MESSAGE PUB invalid message body size -1"),
    ("mpub-huge-size", b"  V2MPUB big\n" + _i32(BIG), b"E_BAD_BODY MPUB body too big 2147483647 > 5242880"),
    (
        "mpub-huge-count",
        b"  V2MPUB t\n" + _i32(8, BIG, 5),
        b"E_BAD_BODY MPUB invalid message count 2147483647",
    ),
    (
        "mpub-huge-message",
        b"  V2MPUB t\n" + _i32(12, 1, BIG, 0),
        b"E_BAD_MESSAGE MPUB message too big 2147483647 > 1048576",
    ),
    (
        "identify-huge-size",
        b"  V2IDENTIFY\n" + _i32(BIG),
        b"E_BAD_BODY IDENTIFY body too big 2147483647 > 5242880",
    ),
    (
        "identify-bad-json",
        b"  V2IDENTIFY\n" + _i32(9) + b"not json!",
        b"E_BAD_BODY IDENTIFY failed to decode JSON body",
    ),
    ("rdy-before-sub", b"  V2RDY 10\n", b"E_INVALID cannot RDY in current state"),
    ("fin-before-sub", b"  V2FIN 0123456789abcdef\n", b"E_INVALID cannot FIN in current state"),
]


@pytest.mark.parametrize("data,expect", [pytest.param(d, e, id=i) for i, d, e in BAD_INPUT])
async def test_bad_input_gets_fatal_error_and_daemon_survives(shared_nsqd, data, expect):
    frames, closed = await raw_exchange(shared_nsqd.tcp_port, data)
    assert frames and frames[0][0] == FRAME_TYPE_ERROR, frames
    assert frames[0][1].startswith(expect), frames
    assert closed, "a fatal error must close the connection"
    await assert_healthy(shared_nsqd, "bad")


async def test_overlong_line_and_random_streams_do_not_hurt(shared_nsqd):
    port = shared_nsqd.tcp_port
    # a command line that never ends: the connection is dropped, nothing is buffered forever
    frames, closed = await raw_exchange(port, b"  V2" + b"A" * (1024 * 1024))
    assert closed
    # random bytes after the magic, several seeds
    for seed in range(5):
        rnd = bytes((seed * 7919 + i * 104729) % 251 for i in range(64 * 1024))
        frames, closed = await raw_exchange(port, b"  V2" + rnd, timeout=3)
        assert closed or frames, seed
    # connections that connect and vanish (with RST), some after the magic
    socks = []
    for i in range(100):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.connect(("127.0.0.1", port))
        if i % 2:
            s.sendall(b"  V2IDENTIFY\n")
        socks.append(s)
    for s in socks:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()
    await assert_healthy(shared_nsqd, "noise")


async def test_client_that_never_reads_is_dropped(nsqd_proc):
    """A consumer with heartbeat_interval 1 s that never reads (so never answers a
    heartbeat, and its socket fills up) is disconnected within a few intervals, as nsqd's
    read/write deadlines do; its messages go back to the channel for others."""
    port = nsqd_proc.tcp_port
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.settimeout(10)
    s.connect(("127.0.0.1", port))
    try:
        s.sendall(
            b"  V2"
            + commands.identify({"heartbeat_interval": 1000})
            + commands.sub("deaf", "ch")
            + commands.rdy(100)
        )
        prod = await RawClient.connect(port)
        bodies = [b"%05d" % i + b"x" * 20000 for i in range(100)]
        prod.send(commands.mpub("deaf", bodies))
        assert await prod.read_frame() == (FRAME_TYPE_RESPONSE, b"OK")
        await prod.close()

        def deaf_clients() -> int | None:
            status, raw = nsqd_proc.http_get("/stats?format=json&topic=deaf")
            if status != 200:
                return None
            (topic,) = json.loads(raw)["topics"]
            return sum(len(ch["clients"]) for ch in topic["channels"])

        if await asyncio.to_thread(deaf_clients) is not None:
            # without reading a byte: nsqd lists it, then drops it
            await wait_for(lambda: asyncio.to_thread(deaf_clients), timeout=2)
            gone = lambda: asyncio.to_thread(lambda: deaf_clients() == 0)  # noqa: E731
            await wait_for(gone, timeout=10, interval=0.1)

        def wait_closed() -> None:
            # drains what nsqd wrote before it gave up, then EOF/RST; the socket timeout
            # (10 s) fails the test if nsqd never closes it
            try:
                while s.recv(1 << 20):
                    pass
            except ConnectionResetError:
                pass

        await asyncio.to_thread(wait_closed)
        # the 100 messages were in flight to the deaf client; a new consumer gets them all
        c = await consumer(port, "deaf", "ch", rdy=100)
        got = {m.body[:5] for m in await c.read_messages(100, timeout=10)}
        assert got == {b[:5] for b in bodies}
        await c.close()
    finally:
        s.close()


async def test_stalled_and_non_reading_clients_do_not_block_others(nsqd_proc):
    """A client stuck in the middle of a PUB body, and a consumer with RDY 2500 that never
    reads while megabytes are published to its channel, leave other clients unaffected."""
    port = nsqd_proc.tcp_port
    half = await RawClient.connect(port)
    half.send(b"PUB stall\n" + struct.pack(">i", 1000) + b"only ten b")
    stuck = stuck_reader(port, "never_read")
    prod = await RawClient.connect(port)
    try:
        body = bytes(range(256)) * 16  # 4 KiB
        for _ in range(0, 3000, 100):
            prod.send(commands.mpub("never_read", [body] * 100))
            assert await prod.read_frame() == (FRAME_TYPE_RESPONSE, b"OK")
        await assert_healthy(nsqd_proc, "stuck")
        # the producer on the stuck topic is not blocked either
        assert await prod.pub("never_read", b"one more") == (FRAME_TYPE_RESPONSE, b"OK")
        stats_path = "/stats?format=json&topic=never_read"
        status, raw = await asyncio.to_thread(nsqd_proc.http_get, stats_path)
        if status == 200:
            stats = json.loads(raw)
            (topic,) = stats["topics"]
            assert topic["message_count"] == 3001
    finally:
        stuck.close()
        await half.close()
        await prod.close()
    await assert_healthy(nsqd_proc, "after")
