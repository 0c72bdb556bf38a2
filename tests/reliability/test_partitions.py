"""Partitions between hosts: 3 nsqd and 2 nsqlookupd, each in its own network namespace,
a producer and a consumer (our asyncio client, tests/reliability/partition_clients.py) in
two more; every namespace hangs off one bridge (in a namespace of its own) through a veth
pair, and the test's own namespace gets a leg on the bridge too, to read /stats, /nodes and
/lookup. Everything is made by the test and removed afterwards (processes by PID, the
namespaces by the names it gave them).

Links are cut while messages flow, with plain ``ip``:

- between two hosts: a ``blackhole`` route to the other's address on both sides, so every
  packet between them is dropped (TCP connections stall, new ones fail) while each still
  talks to everyone else: nsqd1 <-> lookupd1, consumer <-> nsqd2, producer <-> nsqd3 at once;
- a whole host: its veth on the bridge goes down (its packets vanish without an error):
  nsqd3 alone.

Then every link is healed, the producer stops, and the promise is checked: every message the
producer was told ``OK`` for reached the consumer at least once, the consumer is connected to
all three nsqd again (rediscovered through nsqlookupd, it was given no nsqd address), and both
nsqlookupd converged on the same view: /nodes and /lookup list each nsqd exactly once, with the
topic and the channel.

nsqlookupd runs with ``--inactive-producer-timeout=20s`` (nsqd PINGs every 15 s): a
registration whose connection died without a FIN (a partitioned nsqd that has since
reconnected) stops being listed after 20 s, as with Go's default 5 minutes.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from e2e.proc import DaemonProcess, http_request

pytestmark = pytest.mark.timeout(240)

CLIENTS = Path(__file__).with_name("partition_clients.py")
NODES = ("l1", "l2", "n1", "n2", "n3", "pr", "co")
TOPIC, CHANNEL = "part", "c"


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=20)
    if check and r.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {r.stderr.strip()}")
    return r


class Net:
    """A bridge in namespace ``<prefix>-hub`` and one namespace per node, ``<prefix>-<node>``,
    with the node's address ``10.231.<k>.<n>/24`` on its ``eth0``; the test's namespace is
    ``.1`` on the same subnet."""

    def __init__(self) -> None:
        pid = os.getpid()
        self.prefix = f"nsqpt{pid}"
        self.subnet = f"10.231.{pid % 250}"
        self.hub = f"{self.prefix}-hub"
        self.root_if = f"nsqpt{pid % 1_000_000}"
        self.ip = {node: f"{self.subnet}.{10 + i}" for i, node in enumerate(NODES)}
        self.made: list[str] = []

    def ns(self, node: str) -> str:
        return f"{self.prefix}-{node}"

    def up(self) -> None:
        self._add_ns(self.hub)
        _ip("-n", self.hub, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.hub, "link", "set", "br0", "up")
        for node in NODES:
            ns = self.ns(node)
            self._add_ns(ns)
            _ip(
                "-n",
                self.hub,
                "link",
                "add",
                f"h-{node}",
                "type",
                "veth",
                "peer",
                "name",
                "eth0",
                "netns",
                ns,
            )
            _ip("-n", self.hub, "link", "set", f"h-{node}", "master", "br0", "up")
            _ip("-n", ns, "addr", "add", f"{self.ip[node]}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
        _ip("link", "add", self.root_if, "type", "veth", "peer", "name", "h-root", "netns", self.hub)
        _ip("-n", self.hub, "link", "set", "h-root", "master", "br0", "up")
        _ip("addr", "add", f"{self.subnet}.1/24", "dev", self.root_if)
        _ip("link", "set", self.root_if, "up")

    def _add_ns(self, ns: str) -> None:
        _ip("netns", "add", ns)
        self.made.append(ns)
        _ip("-n", ns, "link", "set", "lo", "up")

    def down(self) -> None:
        _ip("link", "del", self.root_if, check=False)
        for ns in reversed(self.made):
            _ip("netns", "del", ns, check=False)
        self.made.clear()

    def cut(self, a: str, b: str) -> None:
        """Drop every packet between hosts ``a`` and ``b`` (both directions)."""
        _ip("-n", self.ns(a), "route", "add", "blackhole", f"{self.ip[b]}/32")
        _ip("-n", self.ns(b), "route", "add", "blackhole", f"{self.ip[a]}/32")

    def heal(self, a: str, b: str) -> None:
        _ip("-n", self.ns(a), "route", "del", "blackhole", f"{self.ip[b]}/32")
        _ip("-n", self.ns(b), "route", "del", "blackhole", f"{self.ip[a]}/32")

    def isolate(self, node: str, isolated: bool = True) -> None:
        """Take ``node``'s cable out of the bridge (or put it back)."""
        _ip("-n", self.hub, "link", "set", f"h-{node}", "down" if isolated else "up")


@pytest.fixture
def net() -> Iterator[Net]:
    if os.geteuid() != 0:
        pytest.skip("network namespaces need root (ip netns add)")
    if shutil.which("ip") is None:
        pytest.skip("no `ip` command (iproute2) to make network namespaces")
    probe = f"nsqpt{os.getpid()}-probe"
    r = _ip("netns", "add", probe, check=False)
    if r.returncode != 0:
        pytest.skip(f"cannot make a network namespace here: {r.stderr.strip()}")
    _ip("netns", "del", probe, check=False)
    n = Net()
    try:
        n.up()
        yield n
    finally:
        n.down()


class InNs(DaemonProcess):
    """A console script (or this Python) started with ``ip netns exec`` (which execs it: the
    PID is the daemon's own)."""

    def __init__(self, ns: str, name: str, args: list[str], log_dir: Path, python: bool = False) -> None:
        super().__init__("nsqd" if python else name, args, log_dir)
        if python:
            self.name = name
            self.stdout_path = self.log_dir / f"{name}.stdout"
            self.stderr_path = self.log_dir / f"{name}.stderr"
            self.args = [sys.executable, *args]
        self.args = ["ip", "netns", "exec", ns, *self.args]


def wait_for(what: str, cond: Callable[[], Any], timeout: float, describe: Callable[[], str] = str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            v = cond()
        except OSError:
            v = None
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {what}\n{describe()}")
        time.sleep(0.2)


def get_json(addr: str, path: str) -> Any:
    status, body = http_request(f"http://{addr}{path}", timeout=3)
    return json.loads(body) if status == 200 else None


def read_ids(path: Path) -> list[int]:
    if not path.exists():
        return []
    # the last line may be half-written
    return [int(x) for x in path.read_text().split("\n")[:-1] if x]


def test_partitions_lose_nothing_and_the_cluster_heals(net: Net, tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    procs: list[InNs] = []
    stop_pr, stop_co = tmp_path / "stop-producer", tmp_path / "stop-consumer"

    def start(p: InNs, kinds: tuple[str, ...] = ()) -> InNs:
        procs.append(p)
        p.start()
        if kinds:
            p.wait_for_addresses(kinds)
        return p

    def describe() -> str:
        return "\n".join(p.describe(2500) for p in procs)

    ip = net.ip
    lookupd_tcp = [f"{ip['l1']}:4160", f"{ip['l2']}:4160"]
    lookupd_http = {"l1": f"{ip['l1']}:4161", "l2": f"{ip['l2']}:4161"}
    nsqd_tcp = {n: f"{ip[n]}:4150" for n in ("n1", "n2", "n3")}
    nsqd_http = {n: f"{ip[n]}:4151" for n in ("n1", "n2", "n3")}
    try:
        for node in ("l1", "l2"):
            start(
                InNs(
                    net.ns(node),
                    "nsqlookupd",
                    [
                        f"--tcp-address={ip[node]}:4160",
                        f"--http-address={ip[node]}:4161",
                        f"--broadcast-address={ip[node]}",
                        "--inactive-producer-timeout=20s",
                    ],
                    logs / node,
                ),
                ("TCP", "HTTP"),
            )
        for node in ("n1", "n2", "n3"):
            (tmp_path / node).mkdir()
            start(
                InNs(
                    net.ns(node),
                    "nsqd",
                    [
                        f"--tcp-address={ip[node]}:4150",
                        f"--http-address={ip[node]}:4151",
                        f"--broadcast-address={ip[node]}",
                        f"--data-path={tmp_path / node}",
                        *(f"--lookupd-tcp-address={a}" for a in lookupd_tcp),
                        "--msg-timeout=4s",
                    ],
                    logs / node,
                ),
                ("TCP", "HTTP"),
            )
        acked_file, got_file, status_file = tmp_path / "acked", tmp_path / "got", tmp_path / "status.json"
        start(
            InNs(
                net.ns("co"),
                "consumer",
                [
                    str(CLIENTS),
                    "consumer",
                    "--lookupd",
                    ",".join(lookupd_http.values()),
                    "--out",
                    str(got_file),
                    "--status",
                    str(status_file),
                    "--stop",
                    str(stop_co),
                ],
                logs / "co",
                python=True,
            )
        )
        start(
            InNs(
                net.ns("pr"),
                "producer",
                [
                    str(CLIENTS),
                    "producer",
                    "--nsqd",
                    ",".join(nsqd_tcp.values()),
                    "--out",
                    str(acked_file),
                    "--stop",
                    str(stop_pr),
                    "--rate",
                    "100",
                ],
                logs / "pr",
                python=True,
            )
        )

        def consumer_on() -> set[str]:
            try:
                return set(json.loads(status_file.read_text())["connections"])
            except (OSError, ValueError, KeyError):
                return set()

        def topic_count(node: str) -> int | None:
            doc = get_json(nsqd_http[node], f"/stats?format=json&topic={TOPIC}")
            topics = (doc or {}).get("topics", [])
            return topics[0]["message_count"] if topics else None

        def listed_by(lookupd: str) -> set[str]:
            doc = get_json(lookupd_http[lookupd], f"/lookup?topic={TOPIC}") or {"producers": []}
            return {f"{p['broadcast_address']}:{p['tcp_port']}" for p in doc["producers"]}

        # all up: the consumer found all three nsqd through lookupd, messages flow
        wait_for("consumer on every nsqd", lambda: consumer_on() == set(nsqd_tcp.values()), 40, describe)
        wait_for("messages consumed", lambda: len(read_ids(got_file)) > 200, 30, describe)

        # three pairs cut at once
        net.cut("n1", "l1")
        net.cut("co", "n2")
        net.cut("pr", "n3")
        t_cut = time.monotonic()
        wait_for("consumer lost nsqd2", lambda: nsqd_tcp["n2"] not in consumer_on(), 20, describe)
        before = topic_count("n3")
        n_acked = len(read_ids(acked_file))
        wait_for(
            "publishing goes on without nsqd3",
            lambda: len(read_ids(acked_file)) > n_acked + 200,
            30,
            describe,
        )
        assert topic_count("n3") == before, "the producer still reached nsqd3 through the cut"
        # nsqd1 notices at its next PING (every 15 s) that lookupd1 is gone
        wait_for(
            "nsqd1 lost lookupd1",
            lambda: f"LOOKUPD({lookupd_tcp[0]}): lost connection" in procs[2].stderr(),
            30,
            describe,
        )
        # lookupd1 stops listing nsqd1 (no PING for --inactive-producer-timeout); lookupd2 still does
        wait_for(
            "lookupd1 dropped nsqd1",
            lambda: nsqd_tcp["n1"] not in listed_by("l1") and nsqd_tcp["n1"] in listed_by("l2"),
            30,
            describe,
        )
        assert time.monotonic() - t_cut < 60
        net.heal("n1", "l1")
        net.heal("co", "n2")
        net.heal("pr", "n3")
        wait_for("consumer back on nsqd2", lambda: nsqd_tcp["n2"] in consumer_on(), 30, describe)
        wait_for("nsqd3 published to again", lambda: (topic_count("n3") or 0) > (before or 0), 30, describe)

        # a whole host off the network, until both lookupd stop listing it
        before = topic_count("n3")
        net.isolate("n3")
        wait_for("consumer lost nsqd3", lambda: nsqd_tcp["n3"] not in consumer_on(), 20, describe)
        n_acked = len(read_ids(acked_file))
        wait_for("publishing goes on", lambda: len(read_ids(acked_file)) > n_acked + 100, 30, describe)
        wait_for(
            "both lookupd dropped nsqd3",
            lambda: not any(nsqd_tcp["n3"] in listed_by(lk) for lk in ("l1", "l2")),
            40,
            describe,
        )
        net.isolate("n3", False)

        # healed: the consumer rediscovers every nsqd, lookupd's views converge
        wait_for(
            "consumer on every nsqd again", lambda: consumer_on() == set(nsqd_tcp.values()), 40, describe
        )
        wait_for(
            "nsqd3 published to again", lambda: (topic_count("n3") or 0) > (before or 0) + 50, 30, describe
        )
        stop_pr.touch()
        assert procs[-1].wait(30) == 0, procs[-1].describe()
        acked = set(read_ids(acked_file))
        assert len(acked) > 1000
        # every acknowledged message delivered at least once
        wait_for(
            "every acknowledged message delivered",
            lambda: not acked - set(read_ids(got_file)),
            45,
            lambda: f"missing: {sorted(acked - set(read_ids(got_file)))[:50]}\n{describe()}",
        )
        stop_co.touch()
        assert procs[-2].wait(30) == 0, procs[-2].describe()

        def views() -> dict[str, Any]:
            out = {}
            for node, addr in lookupd_http.items():
                nodes = get_json(addr, "/nodes")
                lookup = get_json(addr, f"/lookup?topic={TOPIC}")
                if nodes is None or lookup is None:
                    return {}
                out[node] = {
                    "nodes": sorted(
                        (f"{p['broadcast_address']}:{p['tcp_port']}", TOPIC in p["topics"])
                        for p in nodes["producers"]
                    ),
                    "lookup": sorted(
                        f"{p['broadcast_address']}:{p['tcp_port']}" for p in lookup["producers"]
                    ),
                    "channels": lookup["channels"],
                }
            return out

        want = {
            "nodes": sorted((a, True) for a in nsqd_tcp.values()),
            "lookup": sorted(nsqd_tcp.values()),
            "channels": [CHANNEL],
        }
        wait_for(
            "each lookupd lists every nsqd once",
            lambda: views() == {"l1": want, "l2": want},
            45,
            lambda: f"{views()}\n{describe()}",
        )
    finally:
        for p in reversed(procs):
            p.stop(timeout=10)
    for p in procs:
        assert "Traceback" not in p.stderr(), p.describe()
