"""``nsq_to_nsq`` as a real console script between real ``nsqd`` (and ``nsqlookupd``)
processes: byte-exact republishing, Go's JSON rules and bytes, several topics, the three
modes over two destinations, --status-every lines, requeues when a destination is down or
refuses a message, the --*-opt pass-through, lookupd discovery, signals and bad command
lines. Nothing sleeps to synchronise: every wait polls nsqd's /stats with a deadline."""

from __future__ import annotations

import re
import signal

import pytest
from e2e.proc import NsqdProcess, nsqd_fixture, nsqd_process
from tools_helpers import (
    ToolProcess,
    channels,
    collect,
    free_port,
    message_count,
    publish_http,
    registered_topic,
    run_tool,
    stats,
    wait_until,
)

pytestmark = pytest.mark.timeout(90)

CHANNEL = "nsq_to_nsq"


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    yield from nsqd_fixture(tmp_path_factory.mktemp("n2n_src"))


@pytest.fixture(scope="module")
def dst(tmp_path_factory):
    yield from nsqd_fixture(tmp_path_factory.mktemp("n2n_dst"))


def start(src, dests, tmp_path, *args: str) -> ToolProcess:
    """nsq_to_nsq from ``src`` to ``dests`` (nsqd processes or addresses)."""
    addrs = [d if isinstance(d, str) else d.tcp_address for d in dests]
    return ToolProcess(
        "nsq_to_nsq",
        [
            f"--nsqd-tcp-address={src.tcp_address}",
            *(f"--destination-nsqd-tcp-address={a}" for a in addrs),
            *args,
        ],
        tmp_path,
    )


def answered(src, topic: str, deferred: int = 0) -> bool:
    """Every message of ``topic`` was handed to nsq_to_nsq and answered (``deferred`` REQ'd)."""
    ch = channels(src, topic).get(CHANNEL)
    return bool(ch) and ch["depth"] == 0 and ch["in_flight_count"] == 0 and ch["deferred_count"] == deferred


def stop_ok(p: ToolProcess, sig: int = signal.SIGTERM) -> str:
    p.signal(sig)
    assert p.wait() == 0, p.describe()
    err = p.stderr()
    assert "Traceback" not in err, err
    return err


def summary(err: str) -> str:
    lines = [ln for ln in err.splitlines() if "nsq_to_nsq: " in ln and "messages received" in ln]
    assert len(lines) == 1, err
    return lines[0].split("INFO: ", 1)[1]


# --- byte-exact republishing ----------------------------------------------------------------


def test_republishes_every_body_byte_for_byte_in_order(src, dst, tmp_path):
    bodies = [
        b"one",
        b"\xff\x00\x01binary",
        b'{ "a" :  1 }',
        "é<&>".encode(),
        b"x" * 5000,
        *(b"m%04d" % i for i in range(300)),
    ]
    publish_http(src, "pt", *bodies)
    with start(src, [dst], tmp_path, "--topic=pt", "--destination-topic=pt_out") as p:
        wait_until(lambda: message_count(dst, "pt_out") == len(bodies), what="every message")
        wait_until(lambda: answered(src, "pt"), what="every message FINished")
        client = channels(src, "pt")[CHANNEL]["clients"][0]
        assert client["user_agent"].startswith("nsq_to_nsq/1.3.0 ")
        assert client["finish_count"] == len(bodies)
        err = stop_ok(p)
    assert collect(dst, "pt_out", len(bodies)) == bodies
    assert summary(err) == (
        f"nsq_to_nsq: {len(bodies)} messages received, {len(bodies)} published, "
        "0 filtered out, 0 not JSON, 0 requeued, 0 given up"
    )
    # the source channel is empty: nothing left in flight or deferred
    ch = channels(src, "pt")[CHANNEL]
    assert (ch["depth"], ch["in_flight_count"], ch["deferred_count"], ch["requeue_count"]) == (0, 0, 0, 0)


# --- Go's JSON rules and bytes -------------------------------------------------------------

#: (body, what Go's nsq_to_nsq publishes for it with --require-json-field=kind and the
#: whitelist below; None when it does not)
WHITELIST_CASES = [
    (b'{"kind":"a","n":1,"s":"x","extra":true}', b'{"kind":"a","n":1,"s":"x"}'),
    (b'{"kind":null}', b'{"kind":null}'),  # the field exists: null counts
    (b'{"n":2}', None),  # no kind: filtered out
    (b"not json", None),  # not JSON: logged, dropped
    (b"[1,2]", None),  # not an object: Unmarshal fails, dropped
    (b"null", None),  # null is an empty object: no kind
    (
        b'{"kind":"b","n":1.5,"s":"<a href=\\"x\\">&</a>",'
        b'"nested":{"z":1,"a":[1.0,2.5e-7,1e21,"\xc3\xa9\\u2028"]}}',
        b'{"kind":"b","n":1.5,"nested":{"a":[1,2.5e-7,1e+21,"\xc3\xa9\\u2028"],"z":1},'
        b'"s":"\\u003ca href=\\"x\\"\\u003e\\u0026\\u003c/a\\u003e"}',
    ),
    # past int64: a float64 with shortest digits; \b and \f as Go 1.21 writes them; DEL raw
    (
        b'{"kind":"c","n":12345678901234567890,"s":"tab\\there\\u0001\\b\\f\x7f"}',
        b'{"kind":"c","n":12345678901234567000,"s":"tab\\there\\u0001\\u0008\\u000c\x7f"}',
    ),
    # invalid UTF-8: one U+FFFD per byte; -0 is the int64 0
    (
        b'{"kind":"d","n":-0,"s":"\xff\xe2\x82"}',
        b'{"kind":"d","n":0,"s":"\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"}',
    ),
    (b'{"kind":"e","n":1e400}', None),  # overflows float64: Unmarshal fails
    (b'{"kind":"f"} trailing', None),  # not one JSON value
    (b'{"kind":"f","n":NaN}', None),  # not JSON
    (b'  {"kind":"g","n":9007199254740993}\n', b'{"kind":"g","n":9007199254740992}'),  # float64
    (b'{"kind":"h","kind":"i","n":-1.0e2}', b'{"kind":"i","n":-100}'),  # the last key wins
    (b'{"kind":"\\ud83d\\ude00\\ud800"}', b'{"kind":"\xf0\x9f\x98\x80\xef\xbf\xbd"}'),  # lone surrogate
]


def test_require_field_and_whitelist_write_gos_bytes(src, dst, tmp_path):
    publish_http(src, "wl", *(body for body, _ in WHITELIST_CASES))
    expected = [out for _, out in WHITELIST_CASES if out is not None]
    with start(
        src,
        [dst],
        tmp_path,
        "--topic=wl",
        "--destination-topic=wl_out",
        "--require-json-field=kind",
        "--whitelist-json-field=s",
        "--whitelist-json-field",
        "n",
        "--whitelist-json-field=kind",
        "--whitelist-json-field=nested",
        "--whitelist-json-field=absent",
        "--whitelist-json-field=n",
    ) as p:
        wait_until(lambda: message_count(dst, "wl_out") == len(expected), what="the passed messages")
        wait_until(lambda: answered(src, "wl"), what="every message answered")
        err = stop_ok(p)
    assert collect(dst, "wl_out", len(expected)) == expected
    assert summary(err) == (
        "nsq_to_nsq: 15 messages received, 8 published, 2 filtered out, 5 not JSON, 0 requeued, 0 given up"
    )
    for bad in ("not json", "[1,2]", '{"kind":"e","n":1e400}', '{"kind":"f"} trailing'):
        assert f"ERROR: Unable to decode json: {bad}\n" in err
    assert channels(src, "wl")[CHANNEL]["requeue_count"] == 0  # dropped messages are FINished


def test_require_json_value_compares_like_go(src, dst, tmp_path):
    bodies = [
        b'{ "kind" : "1", "x": [] }',  # a string equal to it (bytes unchanged: no whitelist)
        b'{"kind":1}',  # a number equal to it as a float64
        b'{"kind":1.0e0}',
        b'{"kind":"1.0"}',  # a different string
        b'{"kind":true}',
        b'{"kind":[1]}',
        b'{"kind":null}',
        b'{"other":1}',  # no field to check the value of: an error, requeued with backoff
        b'{"kind":2}',
    ]
    publish_http(src, "rv", *bodies)
    with start(
        src,
        [dst],
        tmp_path,
        "--topic=rv",
        "--destination-topic=rv_out",
        "--require-json-field=kind",
        "--require-json-value=1",
    ) as p:
        wait_until(lambda: message_count(dst, "rv_out") == 3, what="the matching messages")
        wait_until(lambda: answered(src, "rv", deferred=1), what="every message answered")
        err = stop_ok(p)
    assert collect(dst, "rv_out", 3) == bodies[:3]
    assert "ERROR: missing field to check required value" in err
    assert summary(err) == (
        "nsq_to_nsq: 9 messages received, 3 published, 5 filtered out, 0 not JSON, 1 requeued, 0 given up"
    )
    ch = channels(src, "rv")[CHANNEL]
    assert (ch["requeue_count"], ch["deferred_count"]) == (1, 1)  # REQ'd with go-nsq's delay


def test_require_json_value_alone_changes_nothing(src, dst, tmp_path):
    # as in Go, the JSON path needs --require-json-field or --whitelist-json-field
    bodies = [b"not json", b'{"kind":2}']
    publish_http(src, "rvonly", *bodies)
    with start(
        src, [dst], tmp_path, "--topic=rvonly", "--destination-topic=rvonly_out", "--require-json-value=1"
    ) as p:
        wait_until(lambda: message_count(dst, "rvonly_out") == 2, what="both messages")
        wait_until(lambda: answered(src, "rvonly"), what="every message answered")
        stop_ok(p)
    assert collect(dst, "rvonly_out", 2) == bodies


# --- topics --------------------------------------------------------------------------------


def test_several_topics_keep_their_names_or_merge(src, dst, tmp_path):
    publish_http(src, "multi_a", b"a1", b"a2")
    publish_http(src, "multi_b", b"b1")
    with start(src, [dst], tmp_path, "--topic=multi_a", "--topic", "multi_b", "--channel=copy") as p:
        wait_until(
            lambda: message_count(dst, "multi_a") == 2 and message_count(dst, "multi_b") == 1,
            what="both topics",
        )
        assert set(channels(src, "multi_a")) == {"copy"} and set(channels(src, "multi_b")) == {"copy"}
        stop_ok(p)
    assert collect(dst, "multi_a", 2) == [b"a1", b"a2"]
    assert collect(dst, "multi_b", 1) == [b"b1"]

    publish_http(src, "merge_a", b"a")
    publish_http(src, "merge_b", b"b")
    with start(src, [dst], tmp_path, "--topic=merge_a", "--topic=merge_b", "--destination-topic=merged") as p:
        wait_until(lambda: message_count(dst, "merged") == 2, what="both messages in one topic")
        stop_ok(p, signal.SIGINT)
    assert sorted(collect(dst, "merged", 2)) == [b"a", b"b"]


# --- destinations and modes ----------------------------------------------------------------


@pytest.fixture
def dst2(tmp_path):
    with nsqd_process(tmp_path / "dst2") as d:
        yield d


STATUS = r"\d+\.\d\dms"


@pytest.mark.parametrize("mode, first", [("round-robin", 1), ("hostpool", 0), ("", 0)])
def test_modes_spread_messages_like_go(src, dst, dst2, tmp_path, mode, first):
    """round-robin: Go's counter is incremented before use, so message 1 goes to the second
    address; hostpool (the default): go-hostpool's round robin starts with the first."""
    topic = f"mode_{mode.replace('-', '_') or 'default'}"
    bodies = [b"%s-%d" % (topic.encode(), i) for i in range(10)]
    publish_http(src, topic, *bodies)
    mode_args = [f"--mode={mode}"] if mode else []
    with start(src, [dst, dst2], tmp_path, f"--topic={topic}", *mode_args, "--status-every=4") as p:
        wait_until(lambda: message_count(dst, topic) + message_count(dst2, topic) == 10, what="every message")
        wait_until(lambda: answered(src, topic), what="every message answered")
        err = stop_ok(p)
    dests = [dst, dst2]
    assert collect(dests[first], topic, 5) == bodies[0::2]
    assert collect(dests[1 - first], topic, 5) == bodies[1::2]
    # timer_metrics: a warning per ring, a line each time a ring wraps (the 5th and 9th
    # publishes overall; the 5th to each destination)
    assert (
        err.count(
            "INFO: Warning: use more than 100 status values for accurate percentiles (configured with 4)"
        )
        == 3
    )
    assert (
        len(
            re.findall(
                rf"INFO: \[aggregate\]: finished 4 - 99th: {STATUS} - 95th: {STATUS} "
                rf"- avg: {STATUS}\n",
                err,
            )
        )
        == 2
    )
    for d in dests:
        assert (
            len(re.findall(rf"INFO: \[{re.escape(d.tcp_address)}\]: finished 4 - 99th: {STATUS}", err)) == 1
        )


def test_epsilon_greedy_delivers_everything(src, dst, dst2, tmp_path):
    bodies = [b"eg%d" % i for i in range(40)]
    publish_http(src, "eps", *bodies)
    with start(src, [dst, dst2], tmp_path, "--topic=eps", "--mode=epsilon-greedy", "--status-every=0") as p:
        wait_until(lambda: message_count(dst, "eps") + message_count(dst2, "eps") == 40, what="every message")
        err = stop_ok(p)
    got = []
    for d in (dst, dst2):
        n = message_count(d, "eps")
        if n > 0:
            got += collect(d, "eps", n)
    assert sorted(got) == sorted(bodies)
    assert "finished" not in err and "status values" not in err  # --status-every=0 disables


def test_single_destination_logs_only_the_aggregate(src, dst, tmp_path):
    publish_http(src, "st1", *(b"%d" % i for i in range(3)))
    with start(src, [dst], tmp_path, "--topic=st1", "--status-every=-1") as p:
        wait_until(lambda: message_count(dst, "st1") == 3, what="every message")
        wait_until(lambda: answered(src, "st1"), what="every message answered")
        err = stop_ok(p)
    # timer_metrics with a negative size logs every publish, with a count of 1
    lines = re.findall(rf"INFO: \[(.*?)\]: finished (\d+) - 99th: {STATUS}", err)
    assert lines == [("aggregate", "1")] * 3


def test_destination_down_requeues_then_delivers(src, tmp_path):
    port = free_port()
    bodies = [b"late%d" % i for i in range(5)]
    publish_http(src, "down", *bodies)
    with start(
        src,
        [f"127.0.0.1:{port}"],
        tmp_path,
        "--topic=down",
        "--consumer-opt=default_requeue_delay,100ms",
        "--consumer-opt=max_backoff_duration,200ms",
        "--consumer-opt=max_attempts,0",
        "--producer-opt=dial_timeout,200ms",
    ) as p:
        # every message failed to publish at least once, and none is lost: all back in nsqd
        wait_until(
            lambda: channels(src, "down").get(CHANNEL, {}).get("requeue_count", 0) >= 5,
            what="the messages to be requeued",
        )
        assert "failed to publish" in p.stderr()
        late = NsqdProcess(tmp_path / "late", f"--tcp-address=127.0.0.1:{port}").start()
        try:
            wait_until(lambda: message_count(late, "down") == 5, timeout=30, what="delivery once it is up")
            wait_until(lambda: answered(src, "down"), what="every message FINished")
            err = stop_ok(p)
            assert sorted(collect(late, "down", 5)) == bodies
        finally:
            late.stop()
    assert re.search(
        r"nsq_to_nsq: \d+ messages received, 5 published, 0 filtered out, 0 not JSON, "
        r"\d+ requeued, 0 given up",
        summary(err),
    )


def test_hostpool_avoids_a_dead_destination(src, dst, tmp_path):
    """The first message goes to the dead host (go-hostpool starts with the first); its
    failure marks the host dead for 30 s, so the requeued messages go to the live one."""
    down = f"127.0.0.1:{free_port()}"
    bodies = [b"hp%d" % i for i in range(6)]
    publish_http(src, "hp", *bodies)
    with start(
        src,
        [down, dst],
        tmp_path,
        "--topic=hp",
        "--mode=hostpool",
        "--consumer-opt=default_requeue_delay,50ms",
        "--consumer-opt=max_backoff_duration,100ms",
        "--producer-opt=dial_timeout,200ms",
    ) as p:
        wait_until(lambda: message_count(dst, "hp") == 6, timeout=30, what="every message on the live host")
        wait_until(lambda: answered(src, "hp"), what="every message FINished")
        assert channels(src, "hp")[CHANNEL]["requeue_count"] >= 1
        stop_ok(p)
    assert sorted(collect(dst, "hp", 6)) == bodies


def test_a_refused_message_is_requeued_alone(src, tmp_path):
    with nsqd_process(tmp_path / "small", "--max-msg-size=100") as small:
        bodies = [b"ok1", b"B" * 200, b"ok2"]
        publish_http(src, "refused", *bodies)
        with start(src, [small], tmp_path, "--topic=refused") as p:
            wait_until(lambda: message_count(small, "refused") == 2, what="the two small messages")
            wait_until(lambda: answered(src, "refused", deferred=1), what="the big one REQ'd")
            err = stop_ok(p)
        assert collect(small, "refused", 2) == [b"ok1", b"ok2"]
    assert re.search(
        r"WARN: 127\.0\.0\.1:\d+ refused an MPUB of 3 messages \(E_BAD_MESSAGE.*\); "
        r"publishing them one by one\n",
        err,
    ), err
    assert summary(err) == (
        "nsq_to_nsq: 3 messages received, 2 published, 0 filtered out, 0 not JSON, 1 requeued, 0 given up"
    )


# --- options, discovery, signals --------------------------------------------------------------


def test_consumer_and_producer_options_are_passed_through(src, dst, tmp_path):
    with start(
        src,
        [dst],
        tmp_path,
        "--topic=opts",
        "--max-in-flight=7",
        "--consumer-opt=client_id,n2n-sub",
        "--consumer-opt",
        "max_in_flight,99",
        "--producer-opt=client_id,n2n-pub",
    ) as p:
        ch = wait_until(
            lambda: (c := channels(src, "opts").get(CHANNEL)) and c["clients"] and c, what="the subscription"
        )
        client = ch["clients"][0]
        assert client["client_id"] == "n2n-sub"
        # --max-in-flight wins over a max_in_flight consumer option, as in Go
        wait_until(lambda: channels(src, "opts")[CHANNEL]["clients"][0]["ready_count"] == 7, what="RDY 7")
        publish_http(src, "opts", b"hello")
        wait_until(lambda: message_count(dst, "opts") == 1, what="the message")
        producers = stats(dst)["producers"] or []
        mine = [pr for pr in producers if pr["client_id"] == "n2n-pub"]
        assert mine and mine[0]["user_agent"].startswith("nsq_to_nsq/1.3.0 ")
        stop_ok(p)
    assert collect(dst, "opts", 1) == [b"hello"]


def test_lookupd_discovery(dst, tmp_path):
    with registered_topic(tmp_path, "found", b"via lookupd") as lookupd:
        with ToolProcess(
            "nsq_to_nsq",
            [
                f"--lookupd-http-address={lookupd.http_address}",
                "--topic=found",
                f"--destination-nsqd-tcp-address={dst.tcp_address}",
                "--destination-topic=found_out",
            ],
            tmp_path,
        ) as p:
            wait_until(lambda: message_count(dst, "found_out") == 1, what="the message")
            stop_ok(p)
        assert collect(dst, "found_out", 1) == [b"via lookupd"]


def test_sigterm_waits_for_publishes_in_flight(src, dst, tmp_path):
    bodies = [b"f%05d" % i for i in range(3000)]
    for i in range(0, len(bodies), 500):
        status, resp = src.http_post("/mpub?topic=flight", b"\n".join(bodies[i : i + 500]))
        assert status == 200, resp
    with start(src, [dst], tmp_path, "--topic=flight", "--max-in-flight=2500") as p:
        wait_until(lambda: message_count(dst, "flight") > 0, what="publishing to start")
        err = stop_ok(p)
    # every message is either published (and FINished) or back in the source, none twice
    published = message_count(dst, "flight")
    ch = wait_until(
        lambda: (c := channels(src, "flight")[CHANNEL]) and c["client_count"] == 0 and c,
        what="nsq_to_nsq to leave",
    )
    assert ch["in_flight_count"] == 0
    assert published + ch["depth"] + ch["deferred_count"] == len(bodies)
    assert f"{published} published" in summary(err)


def test_unreachable_source_nsqd_fails_clearly(dst):
    res = run_tool(
        "nsq_to_nsq",
        "--topic=t",
        f"--nsqd-tcp-address=127.0.0.1:{free_port()}",
        f"--destination-nsqd-tcp-address={dst.tcp_address}",
        "--consumer-opt=dial_timeout,200ms",
    )
    assert res.returncode == 1
    assert b"failed to connect to nsqd 127.0.0.1:" in res.stderr


SRC = "--nsqd-tcp-address=127.0.0.1:4150"
DST = "--destination-nsqd-tcp-address=127.0.0.1:4150"


@pytest.mark.parametrize(
    "args, code, expected",
    [
        (["--topic=t", SRC, DST, "--bogus"], 2, "flag provided but not defined: -bogus"),
        (["--topic=t", "--max-in-flight=x"], 2, 'invalid value "x" for flag -max-in-flight: parse error'),
        (["--topic=t", "--status-every=1.5"], 2, 'invalid value "1.5" for flag -status-every: parse error'),
        (
            ["--topic=t", "--consumer-opt=nope,1"],
            2,
            'invalid value "nope,1" for flag -consumer-opt: invalid option nope',
        ),
        (["--topic=t", "--producer-opt=dial_timeout,5"], 2, "missing unit in duration"),
        ([SRC, DST], 1, "--topic and --channel are required"),
        (["--topic=t", "--channel=", SRC, DST], 1, "--topic and --channel are required"),
        (["--topic=t", "--topic=bad topic", SRC, DST], 1, "--topic is invalid"),
        (["--topic=t", "--destination-topic=bad!", SRC, DST], 1, "--destination-topic is invalid"),
        (["--topic=t", "--channel=bad channel", SRC, DST], 1, "--channel is invalid"),
        (["--topic=t", DST], 1, "--nsqd-tcp-address or --lookupd-http-address required"),
        (
            ["--topic=t", SRC, "--lookupd-http-address=127.0.0.1:4161", DST],
            1,
            "use --nsqd-tcp-address or --lookupd-http-address not both",
        ),
        (["--topic=t", SRC], 1, "--destination-nsqd-tcp-address required"),
        (["--topic=t", SRC, DST, "--max-in-flight=-1"], 1, "max_in_flight"),
        (
            ["--topic=t", SRC, DST, "--producer-opt=heartbeat_interval,2m"],
            1,
            "failed creating producer heartbeat_interval",
        ),
    ],
)
def test_bad_command_lines(args, code, expected):
    res = run_tool("nsq_to_nsq", *args)
    err = res.stderr.decode()
    assert res.returncode == code, err
    assert expected in err
    assert res.stdout == b""
    if code == 2:
        assert "Usage of nsq_to_nsq:" in err


HELP = """\
Usage of nsq_to_nsq:
  -channel string
    \tnsq channel (default "nsq_to_nsq")
  -consumer-opt value
    \toption to passthrough to nsq.Consumer (may be given multiple times, see http://godoc.org/github.com/nsqio/go-nsq#Config)
  -destination-nsqd-tcp-address value
    \tdestination nsqd TCP address (may be given multiple times)
  -destination-topic string
    \tuse this destination topic for all consumed topics (default is consumed topic name)
  -lookupd-http-address value
    \tlookupd HTTP address (may be given multiple times)
  -max-in-flight int
    \tmax number of messages to allow in flight (default 200)
  -mode string
    \tthe upstream request mode options: round-robin, hostpool (default), epsilon-greedy (default "hostpool")
  -nsqd-tcp-address value
    \tnsqd TCP address (may be given multiple times)
  -producer-opt value
    \toption to passthrough to nsq.Producer (may be given multiple times, see http://godoc.org/github.com/nsqio/go-nsq#Config)
  -require-json-field string
    \tfor JSON messages: only pass messages that contain this field
  -require-json-value string
    \tfor JSON messages: only pass messages in which the required field has this value
  -status-every int
    \tthe # of requests between logging status (per destination), 0 disables (default 250)
  -topic value
    \tnsq topic (may be given multiple times)
  -version
    \tprint version string
  -whitelist-json-field value
    \tfor JSON messages: pass this field (may be given multiple times)
"""


def test_help_and_version():
    res = run_tool("nsq_to_nsq", "-help")
    assert (res.returncode, res.stdout, res.stderr.decode()) == (0, b"", HELP)
    res = run_tool("nsq_to_nsq", "--version")
    assert (res.returncode, res.stdout) == (0, b"nsq_to_nsq v1.3.0\n")
