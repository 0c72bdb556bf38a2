"""``nsq_tail --peek N`` as a real console script against real ``nsqd``/``nsqlookupd``
processes: the next N messages of a channel printed as nsq_tail prints them, nothing consumed
(depth unchanged, a consumer afterwards gets the same messages first), several nodes, lookupd
discovery, the admin token, a Go nsqd's 404 and bad command lines."""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from e2e.proc import NsqdProcess, lookupd_and_nsqd, nsqd_fixture, nsqd_process, script
from tools_helpers import channels, collect, free_port, publish_http, run_tool, wait_until

pytestmark = pytest.mark.timeout(60)

TOKEN = "s3cret-peek-token"


@pytest.fixture(scope="module")
def nsqd_proc(tmp_path_factory):
    # two messages per queue in memory, the rest on disk: a peek crosses from one to the other
    yield from nsqd_fixture(tmp_path_factory.mktemp("nsq_tail_peek"), "--mem-queue-size=2")


def make_channel(nsqd: NsqdProcess, topic: str, channel: str, *bodies: bytes, token: str = "") -> None:
    """``topic`` with ``channel`` holding ``bodies`` (the channel exists before the publish);
    ``token``: the nsqd's admin token, which creating them needs."""
    import urllib.request

    for path in (f"/topic/create?topic={topic}", f"/channel/create?topic={topic}&channel={channel}"):
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        req = urllib.request.Request(f"http://{nsqd.http_address}{path}", b"", headers, method="POST")
        with urllib.request.urlopen(req, timeout=10) as r:
            assert r.status == 200
    publish_http(nsqd, topic, *bodies)
    wait_until(lambda: channels(nsqd, topic)[channel]["depth"] == len(bodies), what="the channel's depth")


def counts(nsqd: NsqdProcess, topic: str, channel: str) -> tuple[int, int, int, int, int]:
    """depth, in flight, deferred, requeued, timed out of a channel (/stats)."""
    c = channels(nsqd, topic)[channel]
    return (
        c["depth"],
        c["in_flight_count"],
        c["deferred_count"],
        c["requeue_count"],
        c["timeout_count"],
    )


def peek(nsqd: NsqdProcess, *args: str) -> subprocess.CompletedProcess[bytes]:
    return run_tool("nsq_tail", f"--nsqd-http-address={nsqd.http_address}", *args)


def test_peek_prints_the_next_n_and_consumes_nothing(nsqd_proc):
    bodies = [b"first", b"two words", b"multi\nline", b"\xffbin", b"fifth", b"sixth"]
    make_channel(nsqd_proc, "pk", "c", *bodies)
    before = counts(nsqd_proc, "pk", "c")
    assert before == (6, 0, 0, 0, 0)

    res = peek(nsqd_proc, "--peek", "3", "--topic=pk", "--channel=c")
    assert res.returncode == 0, res.stderr
    assert res.stdout == b"first\ntwo words\nmulti\nline\n"  # bodies as nsq_tail prints them
    assert b"topic pk channel c: 3 of depth 6" in res.stderr
    assert counts(nsqd_proc, "pk", "c") == before

    # --print-topic as when tailing; more than the channel holds: all of it, in order
    res = peek(nsqd_proc, "--peek=10", "--topic=pk", "--channel=c", "--print-topic")
    assert res.returncode == 0, res.stderr
    assert res.stdout == b"".join(b"pk | " + b + b"\n" for b in bodies)
    assert counts(nsqd_proc, "pk", "c") == before

    # peeking changed nothing: a consumer of the channel gets those same messages first
    assert collect(nsqd_proc, "pk", 3, channel="c") == bodies[:3]
    wait_until(lambda: counts(nsqd_proc, "pk", "c")[:3] == (3, 0, 0), what="3 left")
    res = peek(nsqd_proc, "--peek=3", "--topic=pk", "--channel=c")
    assert res.returncode == 0, res.stderr
    assert res.stdout == b"\xffbin\nfifth\nsixth\n"
    assert collect(nsqd_proc, "pk", 3, channel="c") == bodies[3:]

    # an empty channel: nothing printed, not an error
    wait_until(lambda: counts(nsqd_proc, "pk", "c")[0] == 0, what="empty")
    res = peek(nsqd_proc, "--peek=3", "--topic=pk", "--channel=c")
    assert (res.returncode, res.stdout) == (0, b""), res.stderr


def test_peek_several_topics_at_most_n_in_all(nsqd_proc):
    make_channel(nsqd_proc, "pk_a", "c", b"a1", b"a2")
    make_channel(nsqd_proc, "pk_b", "c", b"b1", b"b2", b"b3")
    res = peek(nsqd_proc, "--peek=3", "--topic=pk_a", "--topic=pk_b", "--channel=c", "--print-topic")
    assert res.returncode == 0, res.stderr
    assert res.stdout == b"pk_a | a1\npk_a | a2\npk_b | b1\n"
    assert counts(nsqd_proc, "pk_a", "c")[0] == 2 and counts(nsqd_proc, "pk_b", "c")[0] == 3


def test_peek_node_by_node(nsqd_proc, tmp_path):
    make_channel(nsqd_proc, "pk_nodes", "c", b"one-1", b"one-2", b"one-3")
    with nsqd_process(tmp_path / "second") as second:
        make_channel(second, "pk_nodes", "c", b"two-1", b"two-2", b"two-3")
        both = [f"--nsqd-http-address={nsqd_proc.http_address}", f"--nsqd-http-address={second.http_address}"]
        res = run_tool("nsq_tail", *both, "--peek=4", "--topic=pk_nodes", "--channel=c")
        assert res.returncode == 0, res.stderr
        assert res.stdout == b"one-1\none-2\none-3\ntwo-1\n"
        # an address given twice is asked once
        res = run_tool("nsq_tail", *both, both[0], "--peek=10", "--topic=pk_nodes", "--channel=c")
        assert res.stdout.count(b"one-1") == 1, res.stderr
        assert counts(second, "pk_nodes", "c")[0] == 3
        # a node without the channel is skipped
        assert second.http_post("/channel/delete?topic=pk_nodes&channel=c")[0] == 200
        res = run_tool("nsq_tail", *both, "--peek=4", "--topic=pk_nodes", "--channel=c")
        assert res.returncode == 0, res.stderr
        assert res.stdout == b"one-1\none-2\none-3\n"


def test_peek_missing_topic_or_channel_fails_clearly(nsqd_proc):
    make_channel(nsqd_proc, "pk_here", "c", b"x")
    res = peek(nsqd_proc, "--peek=1", "--topic=pk_here", "--channel=nope")
    assert res.returncode == 1
    assert b"channel nope of topic pk_here not found on nsqd " in res.stderr
    res = peek(nsqd_proc, "--peek=1", "--topic=pk_nowhere", "--channel=c")
    assert res.returncode == 1
    assert b"channel c of topic pk_nowhere not found on nsqd " in res.stderr
    assert res.stdout == b""
    assert counts(nsqd_proc, "pk_here", "c")[0] == 1


def test_peek_through_lookupd(tmp_path):
    with lookupd_and_nsqd(tmp_path) as (lookupd, nsqd):
        make_channel(nsqd, "pk_found", "c", b"via", b"lookupd", b"three")

        def registered() -> bool:
            status, doc = lookupd.http_get("/lookup?topic=pk_found")
            return status == 200 and bool(json.loads(doc)["producers"])

        wait_until(registered, what="the topic in nsqlookupd")
        res = run_tool(
            "nsq_tail",
            f"--lookupd-http-address={lookupd.http_address}",
            "--topic=pk_found",
            "--channel=c",
            "--peek=2",
        )
        assert res.returncode == 0, res.stderr
        assert res.stdout == b"via\nlookupd\n"
        assert f"nsqd 127.0.0.1:{nsqd.http_port}: topic pk_found".encode() in res.stderr
        assert counts(nsqd, "pk_found", "c")[0] == 3

        res = run_tool(
            "nsq_tail",
            f"--lookupd-http-address={lookupd.http_address}",
            "--topic=pk_unknown",
            "--channel=c",
            "--peek=2",
        )
        assert res.returncode == 1
        assert b"no nsqd has topic pk_unknown (lookupd " in res.stderr


@pytest.fixture(scope="module")
def token_nsqd(tmp_path_factory):
    base = tmp_path_factory.mktemp("nsq_tail_peek_token")
    token_file = base / "tokens"
    token_file.write_text(f"# peek\n{TOKEN}\n")
    token_file.chmod(0o600)
    yield from nsqd_fixture(base, f"--admin-token-file={token_file}")


def run_with_env(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[bytes]:
    full = {k: v for k, v in os.environ.items() if k != "NSQ_ADMIN_TOKEN"}
    full.update(env)
    return subprocess.run([script("nsq_tail"), *args], capture_output=True, timeout=30, env=full)


def test_peek_with_the_admin_token(token_nsqd):
    make_channel(token_nsqd, "pk_tok", "c", b"secret body", token=TOKEN)
    args = [f"--nsqd-http-address={token_nsqd.http_address}", "--topic=pk_tok", "--channel=c", "--peek=1"]

    res = run_with_env(args, {})
    assert res.returncode == 1
    want = b"401 UNAUTHORIZED - peek needs this nsqd's admin token (--admin-token or $NSQ_ADMIN_TOKEN)"
    assert want in res.stderr
    assert res.stdout == b""

    res = run_with_env([*args, "--admin-token=wrong"], {})
    assert res.returncode == 1
    assert b"403 FORBIDDEN - the admin token was refused" in res.stderr

    res = run_with_env([*args, f"--admin-token={TOKEN}"], {})
    assert (res.returncode, res.stdout) == (0, b"secret body\n"), res.stderr

    res = run_with_env(args, {"NSQ_ADMIN_TOKEN": TOKEN})
    assert (res.returncode, res.stdout) == (0, b"secret body\n"), res.stderr
    # the flag wins over the environment
    res = run_with_env([*args, "--admin-token=wrong"], {"NSQ_ADMIN_TOKEN": TOKEN})
    assert res.returncode == 1 and b"403 FORBIDDEN" in res.stderr
    assert counts(token_nsqd, "pk_tok", "c")[0] == 1


@contextlib.contextmanager
def go_nsqd_http() -> Iterator[str]:
    """An HTTP server answering every request as a Go nsqd answers a path it has not:
    404 ``{"message":"NOT_FOUND"}``."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = b'{"message":"NOT_FOUND"}'
            self.send_response(404)
            self.send_header("Content-Type", "application/json; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_peek_on_a_go_nsqd_fails_clearly():
    with go_nsqd_http() as address:
        res = run_tool("nsq_tail", f"--nsqd-http-address={address}", "--topic=t", "--channel=c", "--peek=3")
    assert res.returncode == 1
    assert f"nsqd {address}: this nsqd has no peek (not nsqpy?) - 404 NOT_FOUND".encode() in res.stderr
    assert res.stdout == b""


def test_peek_unreachable_nsqd_fails_clearly():
    address = f"127.0.0.1:{free_port()}"
    res = run_tool("nsq_tail", f"--nsqd-http-address={address}", "--topic=t", "--channel=c", "--peek=3")
    assert res.returncode == 1
    assert f"nsqd {address}: GET /channel/peek failed".encode() in res.stderr


H = "--nsqd-http-address=127.0.0.1:4151"


@pytest.mark.parametrize(
    "args, code, expected",
    [
        (["--peek=3", "--topic=t", H], 1, "--channel required with --peek"),
        (["--peek=0", "--topic=t", "--channel=c", H], 1, "--peek must be between 1 and 1000 (got 0)"),
        (["--peek=-1", "--topic=t", "--channel=c", H], 1, "--peek must be between 1 and 1000 (got -1)"),
        (["--peek=1001", "--topic=t", "--channel=c", H], 1, "--peek must be between 1 and 1000 (got 1001)"),
        (["--peek=x", "--topic=t", "--channel=c", H], 2, 'invalid value "x" for flag -peek: parse error'),
        (["--peek=3", "--channel=c", H], 1, "--topic required"),
        (
            ["--peek=3", "--topic=t", "--channel=c"],
            1,
            "--nsqd-http-address or --lookupd-http-address required",
        ),
        (
            ["--peek=3", "--topic=t", "--channel=c", H, "--lookupd-http-address=127.0.0.1:4161"],
            1,
            "use --nsqd-http-address or --lookupd-http-address not both",
        ),
        (
            ["--peek=3", "--topic=t", "--channel=c", "--nsqd-tcp-address=127.0.0.1:4150"],
            1,
            "use --nsqd-http-address or --lookupd-http-address, not --nsqd-tcp-address",
        ),
        (["--peek=3", "-n", "3", "--topic=t", "--channel=c", H], 1, "use --peek or -n not both"),
        (["--peek=3", "--topic=bad topic", "--channel=c", H], 1, "invalid topic name"),
        (["--peek=3", "--topic=t", "--channel=bad channel", H], 1, "invalid channel name"),
        (["--topic=t", H], 1, "--nsqd-http-address is for --peek"),
        (
            ["--topic=t", "--nsqd-tcp-address=127.0.0.1:4150", "--admin-token=x"],
            1,
            "--admin-token is for --peek",
        ),
    ],
)
def test_bad_peek_command_lines(args, code, expected):
    res = run_tool("nsq_tail", *args)
    err = res.stderr.decode()
    assert res.returncode == code, err
    assert expected in err
    assert res.stdout == b""
    if code == 2:
        assert "Usage of nsq_tail:" in err


def test_help_lists_the_peek_flags():
    res = run_tool("nsq_tail", "-h")
    assert res.returncode == 0
    err = res.stderr.decode()
    for flag in ("-peek int", "-nsqd-http-address value", "-admin-token string"):
        assert f"  {flag}\n" in err
    assert "without consuming them" in err
    assert "$NSQ_ADMIN_TOKEN" in err


def test_readme_describes_peek():
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    assert "nsq_tail --peek" in readme
