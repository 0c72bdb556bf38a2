"""End to end: a cluster of real processes, two ``nsqlookupd`` and three ``nsqd`` (each nsqd
given both lookupds), started from the console scripts on 127.0.0.1 and ports picked by
the OS, checked over HTTP on both lookupds.

The cluster is shared by the module's tests: each test works on topics of its own, a test
that kills an nsqd kills an extra one it started, and the lookupd restart test leaves the
cluster as it found it. Every wait polls a condition with a deadline.
"""

from __future__ import annotations

import json
import signal
import socket
import struct
import time
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from e2e.proc import DaemonProcess, NsqdProcess, NsqlookupdProcess, run_driver
from support import wait_until

pytestmark = pytest.mark.timeout(60)

#: --tombstone-lifetime of both lookupds (Go's default is 45 s)
TOMBSTONE_LIFETIME = 3.0
#: nsqd PINGs each lookupd this often (nsqd/lookup.py, as Go)
PING_PERIOD = 15.0
BROADCAST = "127.0.0.1"
PYNSQ_DRIVER = Path(__file__).parent.parent / "interop" / "pynsq_lookupd_driver.py"

T = TypeVar("T")


def poll(cond: Callable[[], T], what: str, timeout: float = 10.0) -> T:
    """The first truthy value of ``cond()``, polled until ``timeout`` s have passed."""
    return wait_until(cond, timeout, what, interval=0.05)  # type: ignore[no-any-return]


def get_json(p: NsqdProcess | NsqlookupdProcess, path: str) -> Any:
    status, body = p.http_get(path)
    assert status == 200, (path, status, body)
    return json.loads(body)


def post_ok(p: NsqdProcess | NsqlookupdProcess, path: str, body: bytes = b"") -> None:
    status, resp = p.http_post(path, body)
    assert status == 200, (path, status, resp)


def q(s: str) -> str:
    return urllib.parse.quote(s, safe="")


def make_channel(n: NsqdProcess, topic: str, channel: str) -> None:
    """Topic, then channel, over nsqd's HTTP API (/channel/create of a topic nsqd does not
    have is 404 TOPIC_NOT_FOUND, as in Go)."""
    post_ok(n, f"/topic/create?topic={q(topic)}")
    post_ok(n, f"/channel/create?topic={q(topic)}&channel={q(channel)}")


def ident(n: NsqdProcess) -> tuple[str, int, int]:
    """What a lookupd must list for this nsqd: (broadcast_address, tcp_port, http_port)."""
    return (BROADCAST, n.tcp_port, n.http_port)


def node(n: NsqdProcess) -> str:
    """The ``node`` of ``/topic/tombstone``: broadcast_address:http_port."""
    return f"{BROADCAST}:{n.http_port}"


def lookup(lk: NsqlookupdProcess, topic: str) -> dict[str, Any] | None:
    """``/lookup?topic=`` with producers as a set of :func:`ident` tuples; None on 404."""
    status, body = lk.http_get(f"/lookup?topic={q(topic)}")
    if status == 404:
        assert json.loads(body) == {"message": "TOPIC_NOT_FOUND"}
        return None
    assert status == 200, body
    doc = json.loads(body)
    return {
        "channels": sorted(doc["channels"]),
        "producers": {(p["broadcast_address"], p["tcp_port"], p["http_port"]) for p in doc["producers"]},
    }


def nodes(lk: NsqlookupdProcess) -> dict[tuple[str, int, int], dict[str, bool]]:
    """``/nodes`` as {ident: {topic: tombstoned}}."""
    out = {}
    for p in get_json(lk, "/nodes")["producers"]:
        assert len(p["topics"]) == len(p["tombstones"]), p
        out[(p["broadcast_address"], p["tcp_port"], p["http_port"])] = dict(
            zip(p["topics"], p["tombstones"], strict=True)
        )
    return out


def nsqd_state(n: NsqdProcess) -> dict[str, set[str]]:
    """{topic: {channels}} of one nsqd, from its ``/stats``."""
    stats = get_json(n, "/stats?format=json")
    return {t["topic_name"]: {c["channel_name"] for c in t["channels"]} for t in stats["topics"]}


class Cluster:
    """Two nsqlookupd and three nsqd; extra nsqd can join for a test."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.lookupds: list[NsqlookupdProcess] = []
        self.nsqds: list[NsqdProcess] = []
        self.extras: list[NsqdProcess] = []
        self.retired: list[NsqlookupdProcess] = []
        self._n = 0

    def new_lookupd(self, tcp_port: int = 0, http_port: int = 0) -> NsqlookupdProcess:
        self._n += 1
        args = [f"--tombstone-lifetime={TOMBSTONE_LIFETIME:g}s"]
        if tcp_port:  # the last --flag wins, as with Go's flag package
            args += [f"--tcp-address=127.0.0.1:{tcp_port}", f"--http-address=127.0.0.1:{http_port}"]
        return NsqlookupdProcess(self.base / f"lookupd{self._n}", *args)

    def new_nsqd(self, name: str) -> NsqdProcess:
        args = [f"--broadcast-address={BROADCAST}"]
        args += [f"--lookupd-tcp-address={lk.tcp_address}" for lk in self.lookupds]
        return NsqdProcess(self.base / name, *args)

    @staticmethod
    def start_all(procs: list[Any], kinds: tuple[str, ...] = ("TCP", "HTTP")) -> None:
        """Spawn every process first, then wait for each: startups overlap."""
        for p in procs:
            DaemonProcess.start(p)
        for p in procs:
            p.wait_for_addresses(kinds, timeout=20)

    def start(self) -> None:
        self.lookupds = [self.new_lookupd(), self.new_lookupd()]
        self.start_all(self.lookupds)
        self.nsqds = [self.new_nsqd(f"nsqd{i}") for i in range(3)]
        self.start_all(self.nsqds)
        want = {ident(n) for n in self.nsqds}
        for lk in self.lookupds:
            poll(lambda lk=lk: set(nodes(lk)) == want, f"{lk.http_address} /nodes lists the 3 nsqd")

    def add_nsqd(self, name: str) -> NsqdProcess:
        n = self.new_nsqd(name)
        self.extras.append(n)
        n.start(timeout=20)
        return n

    def restart_lookupd(self, i: int) -> NsqlookupdProcess:
        """SIGTERM lookupd ``i``, then start a new one on the same TCP and HTTP ports."""
        old = self.lookupds[i]
        code = old.stop()
        assert code == 0, f"nsqlookupd did not exit cleanly on SIGTERM\n{old.describe()}"
        self.retired.append(old)
        new = self.new_lookupd(old.tcp_port, old.http_port)
        self.lookupds[i] = new
        new.start(timeout=20)
        assert (new.tcp_address, new.http_address) == (old.tcp_address, old.http_address)
        return new

    def stop(self) -> list[str]:
        """Stop everything by PID; the problems found (bad exit codes, tracebacks)."""
        problems = []
        for p in [*self.nsqds, *self.extras, *self.lookupds]:
            if p.proc is None:
                continue
            killed = p.poll() == -signal.SIGKILL
            code = p.stop()
            if not killed and code != 0:
                problems.append(f"{p.name} exited with {code}\n{p.describe()}")
        for p in [*self.nsqds, *self.extras, *self.lookupds, *self.retired]:
            if "Traceback" in p.stderr():
                problems.append(f"{p.name} logged an unhandled exception\n{p.describe(20000)}")
        return problems


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    c = Cluster(tmp_path_factory.mktemp("cluster"))
    problems: list[str] = []
    try:
        c.start()
        yield c
    finally:
        problems = c.stop()
    assert not problems, "\n".join(problems)


class V2Consumer:
    """A bare protocol-V2 subscriber over a blocking socket (no IDENTIFY, RDY 0)."""

    def __init__(self, n: NsqdProcess, topic: str, channel: str) -> None:
        self.sock = socket.create_connection(("127.0.0.1", n.tcp_port), timeout=5)
        self.sock.sendall(b"  V2" + f"SUB {topic} {channel}\n".encode())
        (size,) = struct.unpack(">i", self._exact(4))
        frame = self._exact(size)
        assert frame == struct.pack(">i", 0) + b"OK", frame

    def _exact(self, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("nsqd closed the connection")
            buf += chunk
        return buf

    def close(self) -> None:
        self.sock.close()


# --- the tests ------------------------------------------------------------------------------


def test_lookup_lists_exactly_the_nsqd_that_have_the_topic(cluster: Cluster) -> None:
    """Topics made on nsqd by HTTP /topic/create, /channel/create and a publish are listed by
    both lookupds with each producer's broadcast address and ports, and only those nsqd;
    /topic/delete on one nsqd takes that producer (only) out of /lookup and /nodes."""
    n0, n1, n2 = cluster.nsqds
    make_channel(n0, "orders", "archive")
    post_ok(n1, "/pub?topic=orders", b"first order")
    post_ok(n2, "/topic/create?topic=other")
    want = {"channels": ["archive"], "producers": {ident(n0), ident(n1)}}
    for lk in cluster.lookupds:
        poll(lambda lk=lk: lookup(lk, "orders") == want, f"{lk.http_address} /lookup?topic=orders")
        assert get_json(lk, "/channels?topic=orders") == {"channels": ["archive"]}
        poll(
            lambda lk=lk: {"orders", "other"} <= set(get_json(lk, "/topics")["topics"]),
            f"{lk.http_address} /topics",
        )  # n2 registers independently of n0 and n1
        doc = get_json(lk, "/lookup?topic=orders")
        for p in doc["producers"]:
            assert set(p) == {
                "remote_address",
                "hostname",
                "broadcast_address",
                "tcp_port",
                "http_port",
                "version",
            }
            assert p["hostname"] == socket.gethostname() and p["version"] == "1.3.0"
            assert p["remote_address"].startswith("127.0.0.1:")
        topics = nodes(lk)
        assert "orders" in topics[ident(n0)] and "orders" in topics[ident(n1)]
        assert "orders" not in topics[ident(n2)] and "other" in topics[ident(n2)]

    post_ok(n1, "/topic/delete?topic=orders")
    want = {"channels": ["archive"], "producers": {ident(n0)}}
    for lk in cluster.lookupds:
        poll(lambda lk=lk: lookup(lk, "orders") == want, f"{lk.http_address}: n1 left 'orders'")
        assert "orders" not in nodes(lk)[ident(n1)]

    # the last producer gone, a (durable) topic stays registered, as in Go
    post_ok(n0, "/topic/delete?topic=orders")
    for lk in cluster.lookupds:
        poll(
            lambda lk=lk: lookup(lk, "orders") == {"channels": ["archive"], "producers": set()},
            f"{lk.http_address}: no producer left for 'orders'",
        )


def test_ephemeral_channel_leaves_with_its_last_producer_on_unregister(cluster: Cluster) -> None:
    """nsqd deletes an #ephemeral channel when its last consumer goes and UNREGISTERs it;
    the lookupds drop the channel once no nsqd produces it any more."""
    n0, n1, _ = cluster.nsqds
    topic, channel = "eph_unreg", "c#ephemeral"
    c0 = V2Consumer(n0, topic, channel)
    c1 = V2Consumer(n1, topic, channel)
    try:
        want = {"channels": [channel], "producers": {ident(n0), ident(n1)}}
        for lk in cluster.lookupds:
            poll(lambda lk=lk: lookup(lk, topic) == want, f"{lk.http_address} lists {channel}")

        c0.close()
        poll(lambda: channel not in nsqd_state(n0)[topic], "n0 deleted its ephemeral channel")
        # a later registration by n0 on the same connection proves its UNREGISTER arrived
        post_ok(n0, "/topic/create?topic=eph_unreg_marker")
        for lk in cluster.lookupds:
            poll(
                lambda lk=lk: (lookup(lk, "eph_unreg_marker") or {}).get("producers") == {ident(n0)},
                f"{lk.http_address} saw n0's next REGISTER",
            )
            assert get_json(lk, "/channels?topic=eph_unreg") == {"channels": [channel]}

        c1.close()
        for lk in cluster.lookupds:
            poll(
                lambda lk=lk: get_json(lk, "/channels?topic=eph_unreg") == {"channels": []},
                f"{lk.http_address} dropped {channel}",
            )
            # the durable topic itself stays, still produced by both nsqd
            assert lookup(lk, topic) == {"channels": [], "producers": {ident(n0), ident(n1)}}
    finally:
        c0.close()
        c1.close()


def test_killed_nsqd_leaves_lookup_and_nodes(cluster: Cluster) -> None:
    """SIGKILL an nsqd: its lookupd connections drop, so both lookupds unregister it at once
    (no waiting for --inactive-producer-timeout); its durable channel stays registered
    (as in Go) but its #ephemeral channel goes with it, its last producer."""
    n0 = cluster.nsqds[0]
    victim = cluster.add_nsqd("victim")
    for lk in cluster.lookupds:
        poll(lambda lk=lk: ident(victim) in nodes(lk), f"{lk.http_address} /nodes lists the victim")
    post_ok(n0, "/topic/create?topic=doomed")
    make_channel(victim, "doomed", "keep")
    make_channel(victim, "doomed", "live#ephemeral")
    want = {"channels": ["keep", "live#ephemeral"], "producers": {ident(n0), ident(victim)}}
    for lk in cluster.lookupds:
        poll(lambda lk=lk: lookup(lk, "doomed") == want, f"{lk.http_address} /lookup?topic=doomed")

    victim.kill()
    assert victim.poll() == -signal.SIGKILL
    want = {"channels": ["keep"], "producers": {ident(n0)}}
    for lk in cluster.lookupds:
        poll(lambda lk=lk: lookup(lk, "doomed") == want, f"{lk.http_address} forgot the victim")
        assert ident(victim) not in nodes(lk)
        assert set(nodes(lk)) == {ident(n) for n in cluster.nsqds}


def test_tombstone_hides_a_producer_for_the_tombstone_lifetime(cluster: Cluster) -> None:
    """/topic/tombstone on one lookupd hides that producer of that topic from its /lookup
    (the other lookupd and the node's other topics are unaffected), /nodes flags it, and
    after --tombstone-lifetime it is listed again with no new REGISTER: as in Go, its
    registration was never removed, the tombstone just expires."""
    n0, n1, _ = cluster.nsqds
    post_ok(n0, "/topic/create?topic=tomb")
    post_ok(n1, "/topic/create?topic=tomb")
    post_ok(n1, "/topic/create?topic=tomb_other")
    both = {"channels": [], "producers": {ident(n0), ident(n1)}}
    for lk in cluster.lookupds:
        poll(lambda lk=lk: lookup(lk, "tomb") == both, f"{lk.http_address} /lookup?topic=tomb")
        poll(lambda lk=lk: lookup(lk, "tomb_other") is not None, f"{lk.http_address} tomb_other")
    l0, l1 = cluster.lookupds

    t0 = time.monotonic()
    post_ok(l0, f"/topic/tombstone?topic=tomb&node={q(node(n1))}")
    assert lookup(l0, "tomb") == {"channels": [], "producers": {ident(n0)}}
    assert lookup(l0, "tomb_other") == {"channels": [], "producers": {ident(n1)}}
    assert lookup(l1, "tomb") == both
    flags = nodes(l0)
    assert flags[ident(n1)]["tomb"] is True
    assert flags[ident(n1)]["tomb_other"] is False
    assert flags[ident(n0)]["tomb"] is False
    assert not any(nodes(l1)[ident(n1)].values())

    seen = []

    def back() -> bool:
        got = lookup(l0, "tomb")
        seen.append(got)
        return got == both

    poll(back, "the tombstoned producer is listed again", timeout=TOMBSTONE_LIFETIME + 5)
    elapsed = time.monotonic() - t0
    assert elapsed >= TOMBSTONE_LIFETIME - 0.05, f"listed again after {elapsed:.2f}s"
    assert elapsed < PING_PERIOD, "came back only with a PING/REGISTER, not by expiry"
    assert all(s == {"channels": [], "producers": {ident(n0)}} for s in seen[:-1]), seen
    assert nodes(l0)[ident(n1)]["tomb"] is False


def test_restarted_lookupd_relearns_everything_within_a_ping_period(cluster: Cluster) -> None:
    """Stop a lookupd and start it again on the same ports: every nsqd reconnects, IDENTIFYs
    and REGISTERs again, so the new lookupd's registry is exactly what the nsqd hold, well
    within one PING period (15 s). The other lookupd is not disturbed."""
    n0, n1, n2 = cluster.nsqds
    make_channel(n0, "relearn", "a")
    make_channel(n0, "relearn", "b")
    post_ok(n1, "/topic/create?topic=relearn")
    make_channel(n2, "relearn_too", "z")
    for lk in cluster.lookupds:
        poll(
            lambda lk=lk: (
                lookup(lk, "relearn") == {"channels": ["a", "b"], "producers": {ident(n0), ident(n1)}}
            ),
            f"{lk.http_address} /lookup?topic=relearn",
        )
        poll(lambda lk=lk: lookup(lk, "relearn_too") is not None, f"{lk.http_address} relearn_too")

    def expected() -> dict[str, Any]:
        """The registry a fresh lookupd must rebuild: what the nsqd hold right now."""
        topics: dict[str, dict[str, Any]] = {}
        node_topics = {}
        for n in cluster.nsqds:
            state = nsqd_state(n)
            node_topics[ident(n)] = set(state)
            for t, chans in state.items():
                e = topics.setdefault(t, {"channels": set(), "producers": set()})
                e["channels"] |= chans
                e["producers"].add(ident(n))
        for e in topics.values():
            e["channels"] = sorted(e["channels"])
        return {"topics": topics, "nodes": node_topics}

    def registry(lk: NsqlookupdProcess) -> dict[str, Any]:
        names = get_json(lk, "/topics")["topics"]
        return {
            "topics": {t: lookup(lk, t) for t in names},
            "nodes": {k: set(v) for k, v in nodes(lk).items()},
        }

    before = expected()
    assert before["topics"]["relearn"]["producers"] == {ident(n0), ident(n1)}
    l0_before = registry(cluster.lookupds[0])

    new = cluster.restart_lookupd(1)
    t_up = time.monotonic()
    # right after the restart it knows nothing; then the nsqd come back
    poll(
        lambda: registry(new) == before,
        "the restarted lookupd re-learned every registration",
        timeout=PING_PERIOD + 5,
    )
    relearned = time.monotonic() - t_up
    assert relearned < PING_PERIOD * 0.8, f"re-learned only after {relearned:.1f}s"
    assert expected() == before
    assert registry(cluster.lookupds[0]) == l0_before

    # and it keeps following changes on the new connections
    post_ok(n2, "/topic/create?topic=relearn")
    poll(
        lambda: (lookup(new, "relearn") or {}).get("producers") == {ident(n) for n in cluster.nsqds},
        "the restarted lookupd hears a new REGISTER",
    )


def test_pynsq_reader_discovers_all_nsqd_through_lookupd(cluster: Cluster) -> None:
    """pynsq's Reader, given only one lookupd's HTTP address, finds all three nsqd through
    /lookup, connects to each and receives every body published to each of them."""
    topic, channel = "discover", "pynsq"
    bodies: dict[str, list[str]] = {}
    for i, n in enumerate(cluster.nsqds):
        # the channel first, so what is published now waits in it for the reader
        make_channel(n, topic, channel)
        bodies[ident_str(n)] = []
        for j in range(10):
            body = f"nsqd{i}-msg{j}|".encode() + bytes([0, 10, 255, i, j])
            post_ok(n, f"/pub?topic={topic}", body)
            bodies[ident_str(n)].append(body.hex())
    want = {"channels": [channel], "producers": {ident(n) for n in cluster.nsqds}}
    for lk in cluster.lookupds:
        poll(lambda lk=lk: lookup(lk, topic) == want, f"{lk.http_address} lists all three nsqd")

    expected = {h for hs in bodies.values() for h in hs}
    spec = {
        "lookupd_http": [cluster.lookupds[0].http_address],
        "topic": topic,
        "channel": channel,
        "expected": sorted(expected),
        "stats_urls": [f"http://{n.http_address}/stats?format=json&topic={topic}" for n in cluster.nsqds],
        "deadline": 35,
    }
    res = run_driver(PYNSQ_DRIVER, json.dumps(spec), timeout=45)
    lines = [ln for ln in res.stdout.splitlines() if ln.startswith("{")]
    assert res.returncode == 0 and lines, f"driver failed\n{res.stdout[-4000:]}\n{res.stderr[-6000:]}"
    out = json.loads(lines[-1])
    assert out["status"] == "ok", out["error"] + "\n" + res.stderr[-4000:]
    assert out["errors"] == [], out["errors"]

    assert set(out["finished"]) == expected
    assert all(v == 1 for v in out["finished"].values()), out["finished"]
    # one connection per nsqd, each one delivering exactly that nsqd's bodies
    conns = {f"{BROADCAST}:{n.tcp_port}": ident_str(n) for n in cluster.nsqds}
    assert sorted(out["ready"]) == sorted(conns)
    by_conn: dict[str, set[str]] = {}
    for d in out["deliveries"]:
        by_conn.setdefault(d["conn"], set()).add(d["body"])
    assert {conns[c]: hs for c, hs in by_conn.items()} == {k: set(v) for k, v in bodies.items()}
    # and each nsqd saw the reader as a client of the channel while it was connected
    for url, stats in out["stats"].items():
        (t,) = [t for t in stats["topics"] if t["topic_name"] == topic]
        (ch,) = [c for c in t["channels"] if c["channel_name"] == channel]
        assert len(ch["clients"]) == 1, (url, ch["clients"])
        assert ch["message_count"] == 10 and ch["depth"] == 0, (url, ch)


def ident_str(n: NsqdProcess) -> str:
    return "%s:%d:%d" % ident(n)
