"""The pure parts of ``nsq_to_http``, checked against what the Go code does: Go's ``fmt`` for the
GET URL, ``url.QueryEscape``, ``--header`` parsing and header canonicalization, the URL
checks, the proxy rule, go-hostpool's choices (with a fake clock and random source) and
timer_metrics' lines."""

from __future__ import annotations

import logging
import random

import pytest
import yarl

from nsqpy.tools.hostpool import (
    EpsilonGreedyHostPool,
    HostPool,
    RoundRobin,
    new_selector,
)
from nsqpy.tools.nsq_to_http_client import (
    PublishError,
    _parse_url,
    canonical_header_key,
    env_proxy,
    get_endpoint,
    go_sprintf,
    parse_custom_headers,
    query_escape,
)
from nsqpy.tools.timer_metrics import TimerMetrics, percentile

pytestmark = pytest.mark.timeout(30)


# --- fmt.Sprintf(address, url.QueryEscape(body)) ------------------------------------------------


@pytest.mark.parametrize(
    "fmt, arg, expected",
    [
        ("http://h/?d=%s", "x", "http://h/?d=x"),
        ("http://h/%s/end", "a%2Fb", "http://h/a%2Fb/end"),
        ("%%s=%s", "x", "%s=x"),
        ("%d", "x", "%!d(string=x)"),
        ("%s %s", "x", "x %!s(MISSING)"),
        ("a%s%d", "x", "ax%!d(MISSING)"),
        ("a%", "x", "a%!(NOVERB)%!(EXTRA string=x)"),
        ("plain", "x", "plain%!(EXTRA string=x)"),
        ("[%5s]", "ab", "[   ab]"),
        ("[%-5s]", "ab", "[ab   ]"),
        ("[%05s]", "ab", "[000ab]"),
        ("[%.1s]", "ab", "[a]"),
        ("[%v]", "ab", "[ab]"),
        ("%q", "ab", '"ab"'),
        ("%#q", "ab", "`ab`"),
        ("%x", "ab", "6162"),
        ("% X", "ab", "61 62"),
        ("%#x", "ab", "0x6162"),
        ("%.1x", "ab", "61"),
        ("%[1]s-%[1]s", "a", "a-a"),
        ("%[2]s", "a", "%!s(BADINDEX)"),
        ("%*s", "a", "%!(BADWIDTH)%!s(MISSING)"),
        ("%.*s", "a", "%!(BADPREC)%!s(MISSING)"),
        # a %20 in the URL is a width before a verb: Go's fmt does not know it is a URL
        ("http://h/?q=a%20b&m=%s", "x", "http://h/?q=a%!b(string=                   x)&m=%!s(MISSING)"),
        ("a=%20%s", "x", "a=%s%!(EXTRA string=x)"),
    ],
)
def test_go_sprintf(fmt, arg, expected):
    assert go_sprintf(fmt, arg) == expected


def test_query_escape_is_gos():
    assert query_escape(b"a b+c/~._-") == "a+b%2Bc%2F~._-"
    assert query_escape(b"\x00\xff\n") == "%00%FF%0A"
    assert query_escape("é&=?#%".encode()) == "%C3%A9%26%3D%3F%23%25"
    assert query_escape(bytes(range(48, 58)) + b"AZaz") == "0123456789AZaz"
    assert get_endpoint("http://h/q?m=%s&x=1", b"hello world") == "http://h/q?m=hello+world&x=1"


# --- headers --------------------------------------------------------------------------------------


def test_parse_custom_headers_as_go():
    # Go's TestParseCustomHeaders
    valid = ["header1: value1", "header2:value2", "header3:value3", "header4:value4"]
    assert parse_custom_headers(valid) == {
        "header1": "value1",
        "header2": "value2",
        "header3": "value3",
        "header4": "value4",
    }
    for bad in (["header1:", "header2:value2"], ["header1: value1", ": value2"], [":"], ["no colon"]):
        with pytest.raises(ValueError):
            parse_custom_headers(bad)
    assert parse_custom_headers([" k : a:b ", "k:c"]) == {"k": "c"}


@pytest.mark.parametrize(
    "key, canonical",
    [
        ("x-foo-bar", "X-Foo-Bar"),
        ("CONTENT-type", "Content-Type"),
        ("x_y", "X_y"),
        ("user-agent", "User-Agent"),
        ("bad key", "bad key"),
        ("", ""),
    ],
)
def test_canonical_header_key(key, canonical):
    assert canonical_header_key(key) == canonical


# --- URL checks and proxies -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "url, error",
    [
        ("localhost:8080/x", 'Post "localhost:8080/x": unsupported protocol scheme "localhost"'),
        ("ftp://h/x", 'Post "ftp://h/x": unsupported protocol scheme "ftp"'),
        ("http:///x", 'Post "http:///x": http: no Host in request URL'),
        ("http://h/a%zzb", 'parse "http://h/a%zzb": invalid URL escape "%zz"'),
        ("http://h/a\nb", 'parse "http://h/a\\nb": net/url: invalid control character in URL'),
    ],
)
def test_urls_go_refuses(url, error):
    with pytest.raises(PublishError) as e:
        _parse_url("POST", url)
    assert str(e.value) == error


def test_urls_are_kept_as_written():
    u = _parse_url("GET", "http://h:81/p/a%2Fb+c?x=%zz&y=%!d(MISSING)#frag")
    assert u.raw_path_qs == "/p/a%2Fb+c?x=%zz&y=%!d(MISSING)"
    assert (u.host, u.port) == ("h", 81)


def test_env_proxy(monkeypatch):
    for name in (
        "HTTP_PROXY",
        "http_proxy",
        "HTTPS_PROXY",
        "https_proxy",
        "NO_PROXY",
        "no_proxy",
        "REQUEST_METHOD",
    ):
        monkeypatch.delenv(name, raising=False)
    assert env_proxy(yarl.URL("http://example.com/")) is None
    monkeypatch.setenv("HTTP_PROXY", "proxy.local:3128")
    monkeypatch.setenv("NO_PROXY", "skip.example")
    assert env_proxy(yarl.URL("http://example.com/")) == "http://proxy.local:3128"
    assert env_proxy(yarl.URL("https://example.com/")) is None
    assert env_proxy(yarl.URL("http://skip.example/")) is None
    # Go never proxies loopback destinations
    for host in ("127.0.0.1", "localhost", "[::1]", "127.3.2.1"):
        assert env_proxy(yarl.URL(f"http://{host}:4151/")) is None


# --- go-hostpool --------------------------------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class Rand(random.Random):
    """random() answers from a script."""

    def __init__(self, values: list[float]) -> None:
        super().__init__(0)
        self.values = list(values)

    def random(self) -> float:
        return self.values.pop(0)


def picks(pool, n: int, fail: set[str] = frozenset()) -> list[str]:
    out = []
    for _ in range(n):
        r = pool.get()
        out.append(r.host)
        r.mark(RuntimeError("down") if r.host in fail else None)
    return out


def test_round_robin_starts_at_the_second_host():
    rr = new_selector("round-robin", ["a", "b", "c"])
    assert isinstance(rr, RoundRobin)
    assert picks(rr, 7, fail={"a", "b", "c"}) == ["b", "c", "a", "b", "c", "a", "b"]


def test_hostpool_skips_dead_hosts_and_retries_with_doubling_delays():
    clock = Clock()
    pool = HostPool(["a", "b", "c"], clock=clock)
    assert picks(pool, 4) == ["a", "b", "c", "a"]
    assert picks(pool, 1, fail={"b"}) == ["b"]
    assert pool.is_dead("b")
    assert picks(pool, 4) == ["c", "a", "c", "a"]
    clock.t += 30.5  # the first retry is due after 30 s
    assert picks(pool, 3, fail={"b"}) == ["b", "c", "a"]
    # still dead: the next try is 60 s after that retry
    clock.t += 59
    assert "b" not in picks(pool, 4)
    clock.t += 2
    assert "b" in picks(pool, 3)  # retried, and it works again
    assert not pool.is_dead("b")
    assert sorted(picks(pool, 3)) == ["a", "b", "c"]


def test_hostpool_retry_delay_is_capped():
    clock = Clock()
    pool = HostPool(["a", "b"], clock=clock)
    picks(pool, 2, fail={"b"})
    delay = 30.0
    for _ in range(8):
        clock.t += delay + 0.1
        assert "b" in picks(pool, 2, fail={"b"})
        delay = min(delay * 2, 900.0)
    assert delay == 900.0
    clock.t += 899
    assert "b" not in picks(pool, 2, fail={"b"})
    clock.t += 2
    assert "b" in picks(pool, 2, fail={"b"})


def test_hostpool_revives_every_host_when_all_are_dead():
    pool = HostPool(["a", "b"], clock=Clock())
    assert picks(pool, 2, fail={"a", "b"}) == ["a", "b"]
    assert pool.get().host == "a"  # all dead: all revived, the first one
    assert not pool.is_dead("b")


def timed(pool, clock: Clock, ms: float) -> str:
    r = pool.get()
    clock.t += ms / 1000
    r.mark(None)
    return r.host


def test_epsilon_greedy_weights_by_response_time():
    clock = Clock()
    # three explorations (below epsilon): round robin, which measures a, b and c
    pool = EpsilonGreedyHostPool(["a", "b", "c"], clock=clock, rng=Rand([0.0, 0.0, 0.0, 0.1]))
    assert [timed(pool, clock, ms) for ms in (10.5, 40.5, 0.5)] == ["a", "b", "c"]
    assert pool.epsilon == pytest.approx(0.3 * 0.9**3)
    assert pool.get().host == "a"  # 0.1 < epsilon: exploring, round robin again
    assert pool.epsilon == pytest.approx(0.3 * 0.9**4)
    # exploiting: c's 0.5 ms counts as 0 (whole ms) so it is no candidate; a weighs 1/10 and
    # b 1/40: 80 % and 20 %
    pool.rng = Rand([0.9, 0.5, 0.9, 0.79, 0.9, 0.81, 0.9, 0.99])
    assert [pool.get().host for _ in range(4)] == ["a", "a", "b", "b"]


def test_epsilon_greedy_leaves_dead_hosts_and_forgets_old_times():
    clock = Clock()
    pool = EpsilonGreedyHostPool(["a", "b"], clock=clock, rng=Rand([0.0, 0.0, 0.0]))
    assert [timed(pool, clock, 5.5) for _ in range(2)] == ["a", "b"]
    r = pool.get()
    assert r.host == "a"
    r.mark(RuntimeError("down"))
    pool.rng = Rand([0.9, 0.1, 0.9, 0.99])
    assert [pool.get().host for _ in range(2)] == ["b", "b"]  # a is dead: not a candidate
    clock.t += 301  # 5 minutes later the measurements are gone
    pool.rng = Rand([0.9])  # exploiting without candidates draws nothing more: round robin
    assert pool.get().host in ("a", "b")
    assert all(sum(e.counts) == 0 for e in pool._list)


def test_epsilon_never_goes_below_one_percent():
    pool = EpsilonGreedyHostPool(["a"], clock=Clock(), rng=Rand([0.0] * 100))
    for _ in range(100):
        pool.get()
    assert pool.epsilon == pytest.approx(0.01)


def test_new_selector_refuses_other_modes():
    assert type(new_selector("hostpool", ["a"])) is HostPool
    assert type(new_selector("epsilon-greedy", ["a"])) is EpsilonGreedyHostPool
    with pytest.raises(ValueError):
        new_selector("multicast", ["a"])


# --- timer_metrics ------------------------------------------------------------------------------


def test_timer_metrics_as_go(caplog):
    log = logging.getLogger("test.timer_metrics")
    with caplog.at_level(logging.INFO, logger="test.timer_metrics"):
        m = TimerMetrics(5, "prefix", log)
        for n in range(1, 12):
            m.status_duration(float(n))
    stats = m.stats()
    # timer_metrics' own test: the ring holds 7..11 at the end
    assert stats.avg == 9.0
    assert stats.p99 == 11.0
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "Warning: use more than 100 status values for accurate percentiles (configured with 5)",
        "prefix finished 5 - 99th: 6000.00ms - 95th: 6000.00ms - avg: 4000.00ms",  # 6,2,3,4,5
        "prefix finished 5 - 99th: 11000.00ms - 95th: 11000.00ms - avg: 9000.00ms",
    ]


def test_timer_metrics_disabled_and_percentile():
    m = TimerMetrics(0, "")
    m.status(0.0, 5.0)
    assert m.timings == []
    assert percentile(95.0, []) == 0.0
    assert percentile(50.0, [1.0, 2.0, 3.0, 4.0]) == 4.0  # index ceil(2 + 0.5) = 3
