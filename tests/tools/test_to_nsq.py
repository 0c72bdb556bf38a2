"""``to_nsq`` as a real console script against real ``nsqd`` processes: exact bodies,
delimiters, every nsqd gets every message, --rate, --producer-opt, errors and signals."""

from __future__ import annotations

import signal
import time

import pytest
from e2e.proc import nsqd_fixture, nsqd_process
from tools_helpers import ToolProcess, collect, free_port, message_count, run_tool, wait_until

from nsqpy.tools.to_nsq import Splitter, Throttle

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(scope="module")
def nsqd_proc(tmp_path_factory):
    yield from nsqd_fixture(tmp_path_factory.mktemp("to_nsq"))


def to_nsq(nsqd, topic: str, data: bytes, *args: str, timeout: float = 30.0):
    return run_tool(
        "to_nsq",
        f"--topic={topic}",
        f"--nsqd-tcp-address={nsqd.tcp_address}",
        *args,
        input=data,
        timeout=timeout,
    )


def ok(res) -> None:
    assert res.returncode == 0, res.stderr.decode(errors="replace")


# --- pure parts ---------------------------------------------------------------------------


def test_splitter_keeps_everything_but_empty_pieces():
    s = Splitter(b"\n")
    out = s.feed(b"one\ntw") + s.feed(b"o\n\n") + s.feed(b"th") + s.feed(b"ree\r\nfour")
    assert out == [b"one", b"two", b"three\r"]
    assert s.pending_bytes == 4
    assert s.finish() == [b"four"]
    assert s.finish() == []


def test_throttle_paces_without_idle_credit():
    t = Throttle(10)
    assert t.allowance(100.0) == 1
    t.take(1)
    assert t.allowance(100.05) == 0
    assert t.delay(100.05) == pytest.approx(0.05)
    assert t.allowance(100.1) == 1
    t.take(1)
    # a late timer is caught up…
    assert t.allowance(100.45) == 3
    t.take(3)
    # …but input that was idle for a long time earns no burst
    t.idle(200.0)
    assert t.allowance(200.0) == 1


# --- the console script -------------------------------------------------------------------


def test_publishes_each_piece_exactly(nsqd_proc):
    res = to_nsq(nsqd_proc, "lines", b"one\ntwo\n\nthree\r\n\xff\x00binary\nfour")
    ok(res)
    assert message_count(nsqd_proc, "lines") == 5
    assert collect(nsqd_proc, "lines", 5) == [b"one", b"two", b"three\r", b"\xff\x00binary", b"four"]


def test_empty_input_publishes_nothing(nsqd_proc):
    ok(to_nsq(nsqd_proc, "nothing", b"\n\n\n"))
    assert message_count(nsqd_proc, "nothing") == -1  # not even created


def test_delimiter(nsqd_proc):
    ok(to_nsq(nsqd_proc, "commas", b"a,b,,c d\n", "--delimiter", ","))
    assert message_count(nsqd_proc, "commas") == 3
    assert collect(nsqd_proc, "commas", 3) == [b"a", b"b", b"c d\n"]


def test_many_messages_all_arrive_in_order(nsqd_proc):
    bodies = [b"m%06d" % i + b"x" * (i % 50) for i in range(6000)]
    big = b"B" * 400_000  # bigger than one MPUB batch: goes on its own
    data = b"\n".join([*bodies[:3000], big, *bodies[3000:]]) + b"\n"
    ok(to_nsq(nsqd_proc, "many", data))
    assert message_count(nsqd_proc, "many") == 6001
    got = collect(nsqd_proc, "many", 6001)
    assert got == [*bodies[:3000], big, *bodies[3000:]]


def test_every_message_goes_to_every_nsqd(nsqd_proc, tmp_path):
    with nsqd_process(tmp_path / "second") as second:
        res = run_tool(
            "to_nsq",
            "--topic=both",
            "--nsqd-tcp-address",
            nsqd_proc.tcp_address,
            "--nsqd-tcp-address",
            second.tcp_address,
            "--nsqd-tcp-address",
            second.tcp_address,  # a repeat is one destination
            input=b"x\ny\nz\n",
        )
        ok(res)
        for d in (nsqd_proc, second):
            assert message_count(d, "both") == 3
            assert collect(d, "both", 3) == [b"x", b"y", b"z"]


def test_rate_limits_messages_per_second(nsqd_proc):
    data = b"".join(b"r%d\n" % i for i in range(20))
    t0 = time.monotonic()
    res = to_nsq(nsqd_proc, "rated", data, "--rate", "10")
    elapsed = time.monotonic() - t0
    ok(res)
    assert message_count(nsqd_proc, "rated") == 20
    # 20 messages at 10/s: the last one may leave 1.9 s after the first
    assert elapsed >= 1.5, elapsed
    assert b"Throttling messages rate to max:10/second" in res.stderr


def test_producer_opt_is_passed_through(nsqd_proc):
    res = to_nsq(
        nsqd_proc,
        "opts",
        b"hello\n",
        "--producer-opt=client_id,to-nsq-test",
        "--producer-opt",
        "write_timeout,2s",
        "--producer-opt=heartbeat_interval,5s",
    )
    ok(res)
    assert collect(nsqd_proc, "opts", 1) == [b"hello"]


@pytest.mark.parametrize(
    "args, code, expected",
    [
        (["--topic=t", "--bogus"], 2, "flag provided but not defined: -bogus"),
        (["--topic=t", "--rate=fast"], 2, 'invalid value "fast" for flag -rate: parse error'),
        (
            ["--topic=t", "--producer-opt=no_such_option,1"],
            2,
            'invalid value "no_such_option,1" for flag -producer-opt: invalid option no_such_option',
        ),
        (["--topic=t", "--producer-opt=dial_timeout,5"], 2, "missing unit in duration"),
        (["--topic=t", "--producer-opt=max_attempts,70000"], 2, "out of range"),
        (["--nsqd-tcp-address=127.0.0.1:4150"], 1, "--topic required"),
        (["--topic=t"], 1, "--nsqd-tcp-address required"),
        (
            ["--topic=t", "--delimiter=ab", "--nsqd-tcp-address=127.0.0.1:4150"],
            1,
            "--delimiter must be a single byte",
        ),
        (["--topic=bad topic!", "--nsqd-tcp-address=127.0.0.1:4150"], 1, "invalid topic name"),
        (
            ["--topic=t", "--producer-opt=tls_root_ca_file,/nonexistent/ca.pem"],
            2,
            'invalid value "tls_root_ca_file,/nonexistent/ca.pem" for flag -producer-opt: '
            "open /nonexistent/ca.pem: no such file or directory",
        ),
        (["--topic=t", "--producer-opt=tls_min_version,ssl3.0"], 2, "invalid tls_min_version"),
        (
            [
                "--topic=t",
                "--nsqd-tcp-address=127.0.0.1:4150",
                "--producer-opt=tls_v1",
                "--producer-opt=tls_cert,client.crt",
            ],
            1,
            "failed to create nsq.Producer - tls_cert and tls_key must be given together",
        ),
        (
            ["--topic=t", "--nsqd-tcp-address=127.0.0.1:4150", "--producer-opt=heartbeat_interval,2m"],
            1,
            "failed to create nsq.Producer - heartbeat_interval",
        ),
    ],
)
def test_bad_command_lines(args, code, expected):
    res = run_tool("to_nsq", *args, input=b"lost\n")
    err = res.stderr.decode()
    assert res.returncode == code, err
    assert expected in err
    if code == 2:
        assert "Usage of to_nsq:" in err


def test_help_and_version():
    res = run_tool("to_nsq", "--help")
    assert res.returncode == 0
    err = res.stderr.decode()
    for flag in (
        "-topic string",
        "-delimiter string",
        "-nsqd-tcp-address value",
        "-producer-opt value",
        "-rate int",
        "-version",
    ):
        assert f"  {flag}\n" in err
    assert '(default "\\n")' in err
    res = run_tool("to_nsq", "-version")
    assert res.returncode == 0
    assert res.stdout == b"to_nsq v1.3.0\n"


def test_unreachable_nsqd_fails_clearly():
    t0 = time.monotonic()
    res = run_tool(
        "to_nsq",
        "--topic=t",
        f"--nsqd-tcp-address=127.0.0.1:{free_port()}",
        "--producer-opt=dial_timeout,200ms",
        input=b"a\nb\n",
    )
    assert res.returncode == 1
    err = res.stderr.decode()
    assert "failed to connect to nsqd 127.0.0.1:" in err
    assert "(2 of 2 messages read from stdin were not published)" in err
    assert time.monotonic() - t0 < 10


def test_refused_message_fails_and_says_so(tmp_path):
    with nsqd_process(tmp_path / "small", "--max-msg-size=100") as small:
        data = b"ok1\nok2\n" + b"X" * 200 + b"\nok3\n"
        res = run_tool("to_nsq", "--topic=refused", f"--nsqd-tcp-address={small.tcp_address}", input=data)
        err = res.stderr.decode()
        assert res.returncode == 1, err
        assert "failed to publish to" in err and "E_BAD_MESSAGE" in err
        assert "(2 of 4 messages read from stdin were not published)" in err
        # the messages before the refused one are in: MPUB's all-or-nothing is undone
        assert collect(small, "refused", 2) == [b"ok1", b"ok2"]
        assert message_count(small, "refused") == 2


def test_sigterm_while_reading(nsqd_proc, tmp_path):
    with ToolProcess(
        "to_nsq", ["--topic=live", f"--nsqd-tcp-address={nsqd_proc.tcp_address}"], tmp_path, stdin_pipe=True
    ) as p:
        p.write(b"a\nb\n")
        wait_until(lambda: message_count(nsqd_proc, "live") == 2, what="2 messages")
        p.signal(signal.SIGTERM)
        assert p.wait() == 0, p.describe()
    with ToolProcess(
        "to_nsq", ["--topic=live", f"--nsqd-tcp-address={nsqd_proc.tcp_address}"], tmp_path, stdin_pipe=True
    ) as p:
        p.write(b"c\nunterminated")
        wait_until(lambda: message_count(nsqd_proc, "live") == 3, what="3 messages")
        p.signal(signal.SIGINT)
        assert p.wait() == 1, p.describe()
        assert "12 bytes of an unterminated one, read from stdin, were not published" in p.stderr()
    assert collect(nsqd_proc, "live", 3) == [b"a", b"b", b"c"]


def test_eof_after_pipe_closes(nsqd_proc, tmp_path):
    with ToolProcess(
        "to_nsq", ["--topic=piped", f"--nsqd-tcp-address={nsqd_proc.tcp_address}"], tmp_path, stdin_pipe=True
    ) as p:
        for i in range(5):
            p.write(b"p%d\n" % i)
        p.write(b"last")
        p.close_stdin()
        assert p.wait() == 0, p.describe()
    assert collect(nsqd_proc, "piped", 6) == [b"p0", b"p1", b"p2", b"p3", b"p4", b"last"]


def test_mpub_too_big_for_nsqd_falls_back_to_pub(tmp_path):
    # an nsqd whose --max-body-size refuses our MPUB batches (E_BAD_BODY, fatal to the
    # connection): every message still gets in, one PUB each
    with nsqd_process(tmp_path / "tiny", "--max-body-size=1000") as tiny:
        bodies = [b"%04d" % i for i in range(600)]
        res = run_tool(
            "to_nsq", "--topic=tiny", f"--nsqd-tcp-address={tiny.tcp_address}", input=b"\n".join(bodies)
        )
        assert res.returncode == 0, res.stderr.decode()
        assert message_count(tiny, "tiny") == 600
        assert sorted(collect(tiny, "tiny", 600)) == bodies
