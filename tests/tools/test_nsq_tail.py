"""``nsq_tail`` as a real console script against real ``nsqd``/``nsqlookupd`` processes:
exact output, -n, several topics with --print-topic, lookupd discovery, the ephemeral default
channel, FIN after writing, signals and bad command lines."""

from __future__ import annotations

import re
import signal

import pytest
from e2e.proc import nsqd_fixture
from tools_helpers import (
    ToolProcess,
    channels,
    free_port,
    publish_http,
    registered_topic,
    run_tool,
    wait_until,
)

from nsqpy.tools.nsq_tail import default_channel

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def nsqd_proc(tmp_path_factory):
    yield from nsqd_fixture(tmp_path_factory.mktemp("nsq_tail"))


def tail(nsqd, *args: str, timeout: float = 30.0):
    return run_tool("nsq_tail", f"--nsqd-tcp-address={nsqd.tcp_address}", *args, timeout=timeout)


def test_prints_each_body_and_exits_after_n(nsqd_proc):
    # published before any channel exists: the first channel (nsq_tail's) gets them all
    publish_http(nsqd_proc, "basic", b"one", b"two words", b"multi\nline", b"\xffbin")
    res = tail(nsqd_proc, "--topic=basic", "-n", "4")
    assert res.returncode == 0, res.stderr
    assert res.stdout == b"one\ntwo words\nmulti\nline\n\xffbin\n"
    assert b"Adding consumer for topic: basic" in res.stderr


def test_n_stops_early_and_leaves_the_rest(nsqd_proc):
    publish_http(nsqd_proc, "early", *(b"e%d" % i for i in range(10)))
    res = tail(nsqd_proc, "--topic=early", "--channel=keep", "-n", "3")
    assert res.returncode == 0, res.stderr
    assert res.stdout == b"e0\ne1\ne2\n"
    # shown messages were FINed; nothing printed was left in flight or requeued as unseen
    ch = wait_until(
        lambda: (c := channels(nsqd_proc, "early").get("keep")) and c["client_count"] == 0 and c,
        what="nsq_tail to leave",
    )
    assert ch["depth"] == 7
    assert ch["in_flight_count"] == 0
    res = tail(nsqd_proc, "--topic=early", "--channel=keep", "-n", "7")
    assert sorted(res.stdout.splitlines()) == [b"e%d" % i for i in range(3, 10)]


def test_several_topics_with_print_topic(nsqd_proc):
    publish_http(nsqd_proc, "alpha", b"a1", b"a2")
    publish_http(nsqd_proc, "beta", b"b1")
    res = tail(nsqd_proc, "--topic=alpha", "--topic", "beta", "--print-topic", "-n", "3")
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert sorted(lines) == [b"alpha | a1", b"alpha | a2", b"beta | b1"]
    assert lines.index(b"alpha | a1") < lines.index(b"alpha | a2")


def test_default_channel_is_ephemeral_and_messages_are_fined(nsqd_proc, tmp_path):
    with ToolProcess(
        "nsq_tail", [f"--nsqd-tcp-address={nsqd_proc.tcp_address}", "--topic=live"], tmp_path
    ) as p:
        chans = wait_until(lambda: channels(nsqd_proc, "live"), what="nsq_tail's channel")
        (name,) = chans
        assert re.fullmatch(r"tail\d{6}#ephemeral", name), name
        publish_http(nsqd_proc, "live", b"hello", b"world")
        wait_until(lambda: p.stdout() == b"hello\nworld\n", what="two lines")
        # written, then FINed
        wait_until(lambda: channels(nsqd_proc, "live")[name]["in_flight_count"] == 0, what="FIN")
        client = channels(nsqd_proc, "live")[name]["clients"][0]
        assert client["finish_count"] == 2
        assert client["user_agent"].startswith("nsq_tail/1.3.0 ")
        p.signal(signal.SIGTERM)
        assert p.wait() == 0, p.describe()
    # ephemeral: gone with its last client
    wait_until(lambda: not channels(nsqd_proc, "live"), what="the ephemeral channel to vanish")


def test_sigint_stops_cleanly(nsqd_proc, tmp_path):
    with ToolProcess(
        "nsq_tail",
        [
            f"--nsqd-tcp-address={nsqd_proc.tcp_address}",
            "--topic=intr",
            "--channel=c1",
            "--consumer-opt=client_id,tail-test",
            "--max-in-flight=7",
        ],
        tmp_path,
    ) as p:
        ch = wait_until(lambda: channels(nsqd_proc, "intr").get("c1"), what="the channel")
        assert ch["clients"][0]["client_id"] == "tail-test"
        wait_until(lambda: channels(nsqd_proc, "intr")["c1"]["clients"][0]["ready_count"] == 7, what="RDY 7")
        p.signal(signal.SIGINT)
        assert p.wait() == 0, p.describe()
        assert "Traceback" not in p.stderr()
    assert channels(nsqd_proc, "intr")["c1"]["client_count"] == 0


def test_lookupd_discovery(tmp_path):
    with registered_topic(tmp_path, "found", b"via lookupd") as lookupd:
        res = run_tool(
            "nsq_tail", f"--lookupd-http-address={lookupd.http_address}", "--topic=found", "-n", "1"
        )
        assert res.returncode == 0, res.stderr
        assert res.stdout == b"via lookupd\n"


def test_unreachable_nsqd_fails_clearly():
    res = run_tool(
        "nsq_tail",
        f"--nsqd-tcp-address=127.0.0.1:{free_port()}",
        "--topic=t",
        "--consumer-opt=dial_timeout,200ms",
    )
    assert res.returncode == 1
    assert b"failed to connect to nsqd 127.0.0.1:" in res.stderr


@pytest.mark.parametrize(
    "args, code, expected",
    [
        (
            ["--topic=t", "--nsqd-tcp-address=127.0.0.1:4150", "--bogus"],
            2,
            "flag provided but not defined: -bogus",
        ),
        (["--topic=t", "-n", "x"], 2, 'invalid value "x" for flag -n: parse error'),
        (
            ["--topic=t", "--nsqd-tcp-address=127.0.0.1:4150", "--consumer-opt=nope,1"],
            2,
            'invalid value "nope,1" for flag -consumer-opt: invalid option nope',
        ),
        (["--topic=t"], 1, "--nsqd-tcp-address or --lookupd-http-address required"),
        (
            ["--topic=t", "--nsqd-tcp-address=127.0.0.1:4150", "--lookupd-http-address=127.0.0.1:4161"],
            1,
            "use --nsqd-tcp-address or --lookupd-http-address not both",
        ),
        (["--nsqd-tcp-address=127.0.0.1:4150"], 1, "--topic required"),
        (["--topic=bad topic", "--nsqd-tcp-address=127.0.0.1:4150"], 1, "invalid topic name"),
        (
            ["--topic=t", "--channel=bad channel", "--nsqd-tcp-address=127.0.0.1:4150"],
            1,
            "invalid channel name",
        ),
        (["--topic=t", "--nsqd-tcp-address=127.0.0.1:4150", "--max-in-flight=-1"], 1, "max_in_flight"),
    ],
)
def test_bad_command_lines(args, code, expected):
    res = run_tool("nsq_tail", *args)
    err = res.stderr.decode()
    assert res.returncode == code, err
    assert expected in err
    assert res.stdout == b""
    if code == 2:
        assert "Usage of nsq_tail:" in err


def test_help_and_version():
    res = run_tool("nsq_tail", "-h")
    assert res.returncode == 0
    err = res.stderr.decode()
    for flag in (
        "-topic value",
        "-channel string",
        "-max-in-flight int",
        "-n int",
        "-print-topic",
        "-nsqd-tcp-address value",
        "-lookupd-http-address value",
        "-consumer-opt value",
        "-version",
    ):
        assert f"  {flag}\n" in err
    assert "(default 200)" in err
    res = run_tool("nsq_tail", "--version")
    assert (res.returncode, res.stdout) == (0, b"nsq_tail v1.3.0\n")


def test_default_channel_shape():
    import random

    names = {default_channel(random.Random(i)) for i in range(50)}
    assert all(re.fullmatch(r"tail\d{6}#ephemeral", n) for n in names)
    assert len(names) > 40
