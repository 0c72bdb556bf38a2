"""``nsq_stat`` as a real console script against two real ``nsqd`` registered with a real
``nsqlookupd``: Go's header and columns byte for byte, the channel summed over the nodes
(found through lookupd or given as nsqd addresses), --count, the header every 25 polls,
the rates, the failures Go ends with ``log.Fatalf``, signals and bad command lines."""

from __future__ import annotations

import json
import signal

import pytest
from e2e.proc import NsqdProcess, NsqlookupdProcess
from tools_helpers import ToolProcess, channels, free_port, run_tool, wait_until

from nsqpy.client import SyncConsumer
from nsqpy.nsqadmin.types import ChannelStats
from nsqpy.tools.nsq_stat import HEADER, report_line

pytestmark = pytest.mark.timeout(60)

HEADER_TEXT = (
    "------rate------+----------------depth----------------+--------------metadata---------------\n"
    "ingress  egress |   total     mem    disk inflt   def |     req     t-o         msgs clients\n"
)

#: The cluster below, summed: 9 queued (8 in memory on A, 1 on disk on B), 3 in flight
#: (1 on A, 2 on B), 3 deferred on A (2 DPUB, 1 REQ), 1 requeue, 15 messages, 2 clients.
LINE = "      0       0 |       9       8       1     3     3 |       1       0           15       2\n"


class Cluster:
    def __init__(self, tmp) -> None:
        self.lookupd = NsqlookupdProcess(tmp / "lookupd").start()
        common = [f"--lookupd-tcp-address={self.lookupd.tcp_address}", "--broadcast-address=127.0.0.1"]
        self.a = NsqdProcess(tmp / "a", *common).start()
        self.b = NsqdProcess(tmp / "b", *common, "--mem-queue-size=0").start()  # all on disk
        self.consumers: list[SyncConsumer] = []

    def consumer(self, nsqd, max_in_flight: int) -> SyncConsumer:
        c = SyncConsumer("st", "ch", nsqd_tcp_addresses=[nsqd.tcp_address], max_in_flight=max_in_flight)
        self.consumers.append(c)
        return c

    def stop(self) -> None:
        for c in self.consumers:
            c.close(drain_timeout=0)
        for p in (self.a, self.b, self.lookupd):
            p.stop()


def post(nsqd, path: str, body: bytes = b"") -> None:
    status, resp = nsqd.http_post(path, body)
    assert status == 200, resp


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    cl = Cluster(tmp_path_factory.mktemp("nsq_stat"))
    try:
        a, b = cl.a, cl.b
        for d in (a, b):
            post(d, "/topic/create?topic=st")
            post(d, "/channel/create?topic=st&channel=ch")
        post(a, "/mpub?topic=st", b"\n".join(b"a%d" % i for i in range(10)))
        post(a, "/pub?topic=st&defer=600000", b"later1")
        post(a, "/pub?topic=st&defer=600000", b"later2")
        post(b, "/mpub?topic=st", b"b0\nb1\nb2")
        ca = cl.consumer(a, 1)
        first = ca.next(timeout=10)
        first.req(600, backoff=False)  # deferred for 10 minutes, counted as a requeue
        ca.next(timeout=10)  # held in flight
        cb = cl.consumer(b, 2)
        cb.next(timeout=10)
        cb.next(timeout=10)
        wait_until(
            lambda: (c := channels(a, "st")["ch"])["in_flight_count"] == 1 and c["deferred_count"] == 3,
            what="A's channel to settle",
        )
        wait_until(lambda: channels(b, "st")["ch"]["in_flight_count"] == 2, what="B's channel to settle")

        def registered() -> bool:
            status, body = cl.lookupd.http_get("/lookup?topic=st")
            return status == 200 and len(json.loads(body)["producers"]) == 2

        wait_until(registered, what="both nsqd in nsqlookupd")
        yield cl
    finally:
        cl.stop()


def stat(*args: str, timeout: float = 30.0):
    return run_tool("nsq_stat", "--topic=st", "--channel=ch", *args, timeout=timeout)


def summed_line(cl: Cluster) -> str:
    """The line computed from the nodes' own /stats (no traffic: the rates are 0)."""
    total = ChannelStats()
    for d in (cl.a, cl.b):
        c = ChannelStats.from_json(channels(d, "st")["ch"])
        c.memory_depth = c.depth - c.backend_depth
        total.add(c)
    return report_line(total, total, 1.0)


def test_header_and_columns_through_lookupd(cluster):
    res = stat(
        f"--lookupd-http-address={cluster.lookupd.http_address}",
        "--count=2",
        "--interval=50ms",
        "--http-client-connect-timeout=1s",
        "--http-client-request-timeout=3s",
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.decode() == HEADER_TEXT + LINE + LINE
    assert summed_line(cluster) == LINE
    assert b"CI: querying" not in res.stderr  # Go's nsq_stat gives clusterinfo no logger


def test_nsqd_addresses_give_the_same_sums(cluster):
    res = stat(
        f"--nsqd-http-address={cluster.a.http_address}",
        "--nsqd-http-address",
        cluster.b.http_address,
        "--count=1",
        "--interval=10ms",
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.decode() == HEADER_TEXT + LINE
    # one node alone
    res = stat(f"--nsqd-http-address={cluster.b.http_address}", "--count=1", "--interval=10ms")
    assert res.stdout.decode() == HEADER_TEXT + (
        "      0       0 |       1       0       1     2     0 |       0       0            3       1\n"
    )


def test_header_again_every_25_polls(cluster):
    res = stat(f"--lookupd-http-address={cluster.lookupd.http_address}", "--count=26", "--interval=1ms")
    assert res.returncode == 0, res.stderr
    assert res.stdout.decode() == HEADER_TEXT + LINE * 24 + HEADER_TEXT + LINE * 2


def test_runs_until_a_signal(cluster, tmp_path):
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        with ToolProcess(
            "nsq_stat",
            [
                "--topic=st",
                "--channel=ch",
                "--interval=20ms",
                f"--lookupd-http-address={cluster.lookupd.http_address}",
            ],
            tmp_path,
        ) as p:
            wait_until(lambda: p.stdout().count(b"\n") >= 4, what="two report lines")
            p.signal(sig)
            assert p.wait() == 0, p.describe()
            out = p.stdout().decode()
            lines = out.splitlines(keepends=True)
            assert "".join(lines[:2]) == HEADER_TEXT
            assert set(lines[2:]) == {LINE}
            assert "Traceback" not in p.stderr()


def test_rates_are_per_second_of_the_interval():
    prev, cur = ChannelStats(), ChannelStats()
    prev.message_count, prev.depth = 100, 50
    cur.message_count, cur.depth, cur.memory_depth, cur.backend_depth = 160, 40, 30, 10
    cur.in_flight_count, cur.deferred_count, cur.requeue_count, cur.timeout_count = 12345, 6, 7, 8
    cur.client_count = 3
    # 60 messages in, 70 out (10 more than came in: the depth fell by 10), over 2 s
    assert report_line(prev, cur, 2.0) == (
        "     30      35 |      40      30      10 12345     6 |       7       8          160       3\n"
    )
    # Go's int64() truncates toward zero; a counter that went back (a restarted nsqd) is negative
    cur.message_count, cur.depth = 95, 50
    assert report_line(prev, cur, 2.0).startswith("     -2      -2 |")
    assert HEADER == HEADER_TEXT


def test_missing_channel_or_topic_is_fatal(cluster):
    res = run_tool(
        "nsq_stat",
        "--topic=st",
        "--channel=nope",
        "--count=1",
        f"--lookupd-http-address={cluster.lookupd.http_address}",
    )
    assert res.returncode == 1
    assert b"FATAL: failed to find channel(nope) in stats metadata for topic(st)\n" in res.stderr
    assert res.stdout == b""
    res = run_tool(
        "nsq_stat",
        "--topic=nowhere",
        "--channel=ch",
        "--count=1",
        f"--nsqd-http-address={cluster.a.http_address}",
    )
    assert res.returncode == 1
    assert b"FATAL: failed to get nsqd stats - failed to query any nsqd" in res.stderr


def test_unreachable_nsqd_is_fatal():
    port = free_port()
    res = run_tool("nsq_stat", "--topic=st", "--channel=ch", f"--nsqd-http-address=127.0.0.1:{port}")
    assert res.returncode == 1
    assert (
        f"FATAL: failed to get topic producers - failed to query any nsqd: Get "
        f'"http://127.0.0.1:{port}/stats?format=json&topic=st&include_clients=false": dial tcp '
        f"127.0.0.1:{port}: connect: connection refused"
    ).encode() in res.stderr


def test_a_partial_failure_is_fatal_too(cluster):
    # Go's nsq_stat stops on any error, the partial ones (a node that did not answer) included
    res = stat(
        f"--nsqd-http-address={cluster.a.http_address}",
        f"--nsqd-http-address=127.0.0.1:{free_port()}",
        "--count=1",
    )
    assert res.returncode == 1
    assert b"FATAL: failed to get topic producers - Get " in res.stderr


@pytest.mark.parametrize(
    "args, code, expected",
    [
        (["--bogus"], 2, "flag provided but not defined: -bogus"),
        (
            ["--count=x"],
            2,
            'invalid value "x" for flag -count: strconv.ParseInt: parsing "x": invalid syntax',
        ),
        (["--count=3000000000"], 2, 'strconv.ParseInt: parsing "3000000000": value out of range'),
        (["--interval=2"], 2, 'invalid value "2" for flag -interval: parse error'),
        (["--channel=ch"], 1, "--topic and --channel are required"),
        (["--topic=st"], 1, "--topic and --channel are required"),
        (["--topic=st", "--channel=ch", "--interval=0s"], 1, "--interval should be positive"),
        (["--topic=st", "--channel=ch", "--interval=-1s"], 1, "--interval should be positive"),
        (
            ["--topic=st", "--channel=ch", "--http-client-connect-timeout=0"],
            1,
            "--http-client-connect-timeout should be positive",
        ),
        (
            ["--topic=st", "--channel=ch", "--http-client-request-timeout=0"],
            1,
            "--http-client-request-timeout should be positive",
        ),
        (["--topic=st", "--channel=ch", "--count=0"], 1, "--count should be positive"),
        (["--topic=st", "--channel=ch"], 1, "--nsqd-http-address or --lookupd-http-address required"),
        (
            ["--topic=st", "--channel=ch", "--nsqd-http-address=a:1", "--lookupd-http-address=b:2"],
            1,
            "use --nsqd-http-address or --lookupd-http-address not both",
        ),
        (
            ["--topic=st", "--channel=ch", "--nsqd-http-address=http://a:1"],
            1,
            "--nsqd-http-address error - address should not contain scheme",
        ),
        (
            ["--topic=st", "--channel=ch", "--lookupd-http-address=https://b:2"],
            1,
            "--lookupd-http-address error - address should not contain scheme",
        ),
    ],
)
def test_bad_command_lines(args, code, expected):
    res = run_tool("nsq_stat", *args)
    err = res.stderr.decode()
    assert res.returncode == code, err
    assert expected in err
    assert res.stdout == b""
    if code == 2:
        assert "Usage of nsq_stat:" in err


HELP = """\
Usage of nsq_stat:
  -channel string
    \tNSQ channel
  -count value
    \tnumber of reports
  -http-client-connect-timeout duration
    \ttimeout for HTTP connect (default 2s)
  -http-client-request-timeout duration
    \ttimeout for HTTP request (default 5s)
  -interval duration
    \tduration of time between polling/printing output (default 2s)
  -lookupd-http-address value
    \tlookupd HTTP address (may be given multiple times)
  -nsqd-http-address value
    \tnsqd HTTP address (may be given multiple times)
  -topic string
    \tNSQ topic
  -version
    \tprint version
"""


def test_help_and_version():
    res = run_tool("nsq_stat", "--help")
    assert (res.returncode, res.stdout, res.stderr.decode()) == (0, b"", HELP)
    res = run_tool("nsq_stat", "-version")
    assert (res.returncode, res.stdout) == (0, b"nsq_stat v1.3.0\n")
