"""test_disk_faults.py's promise with many clients at once: nsqd (the console script, on a
small tmpfs the test mounts, ``--mem-queue-size=0 --sync-every=1``) runs out of disk while
eight TCP publishers (PUB, MPUB, DPUB), two HTTP publishers (/pub, /mpub) and three
consumers work, on a topic whose channel is consumed (the channel's queue) and on one with no
channel yet (the topic's own queue). Small segments (``--max-bytes-per-file``) make the
consumers free space now and then, so refusals and acknowledgements interleave.

Checked: every refusal is an answer (``E_PUB_FAILED``/``E_MPUB_FAILED``/``E_DPUB_FAILED …
no space left on device`` then the close, HTTP 503), /ping turns 500 while it lasts,
publishing resumes by itself when the space returns, and after a clean restart every
acknowledged message comes out of each queue (DPUBs to the consumed topic too: those wait in
the channel's in-memory deferred queue, as in Go, so the full disk does not refuse them, and
the clean shutdown writes them out). The same load with nsqd killed -9 while the disk is full:
every message acknowledged after a write (all but those in-memory DPUBs) comes back. Then the
data directory turns read-only across a restart: nsqd refuses to start (exit 1, the reason),
and once it is writable again nothing acknowledged is missing.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import subprocess
import time
from pathlib import Path

import pytest
from e2e.proc import DaemonProcess, NsqdProcess
from support import RawClient, fill_disk, mounted_tmpfs

from nsqpy.protocol import commands

pytestmark = pytest.mark.timeout(180)

FLAGS = ("--mem-queue-size=0", "--sync-every=1", "--max-bytes-per-file=262144", "--msg-timeout=5s")
REFUSED = re.compile(
    r"^E_(?P<cmd>PUB|MPUB|DPUB)_FAILED (?P=cmd) failed (open|write|sync|rename) \S+: no space left on device$"
)


def body(tag: str, i: int) -> bytes:
    return f"{tag}-{i:06d}-".encode() + b"x" * 600


class Load:
    def __init__(self, p: NsqdProcess) -> None:
        self.p = p
        self.acked: dict[str, set[bytes]] = {"t": set(), "u": set()}
        self.refused: dict[str, int] = {}
        self.acked_after: dict[str, int] = {}  # acknowledgements since the space came back
        self.space_back = False
        self.stop = asyncio.Event()
        self.got_a: set[bytes] = set()
        #: DPUBs to topic t: held in the channel's memory, not written (lost by a kill -9, as in Go)
        self.in_memory: set[bytes] = set()

    def _ack(self, name: str, topic: str, bodies: list[bytes]) -> None:
        self.acked[topic].update(bodies)
        if self.space_back:
            self.acked_after[name] = self.acked_after.get(name, 0) + 1

    async def tcp_publisher(self, name: str, kind: str, topic: str) -> None:
        rng = random.Random(name)
        c = await RawClient.connect(self.p.tcp_port)
        i = 0
        while not self.stop.is_set():
            if kind == "MPUB":
                bodies = [body(name, i + k) for k in range(rng.randint(2, 20))]
                cmd = commands.mpub(topic, bodies)
            elif kind == "DPUB":
                bodies = [body(name, i)]
                cmd = commands.dpub(topic, 200, bodies[0])
            else:
                bodies = [body(name, i)]
                cmd = commands.pub(topic, bodies[0])
            i += len(bodies)
            c.send(cmd)
            ftype, data = await c.read_frame(timeout=30)
            if (ftype, data) == (0, b"OK"):
                self._ack(name, topic, bodies)
                if kind == "DPUB" and topic == "t":
                    self.in_memory.update(bodies)
                continue
            # a refusal: Go's error frame, then nsqd closes the connection
            m = REFUSED.match(data.decode())
            assert ftype == 1 and m and m["cmd"] == kind, (name, ftype, data)
            await c.expect_closed()
            self.refused[name] = self.refused.get(name, 0) + 1
            c = await RawClient.connect(self.p.tcp_port)
        await c.close()

    async def http_publisher(self, name: str, path: str, topic: str) -> None:
        i = 0
        while not self.stop.is_set():
            bodies = [body(name, i + k) for k in range(10 if path == "/mpub" else 1)]
            i += len(bodies)
            status, data = await asyncio.to_thread(
                self.p.http_post, f"{path}?topic={topic}", b"\n".join(bodies)
            )
            if status == 200:
                self._ack(name, topic, bodies)
            else:
                assert (status, json.loads(data)) == (503, {"message": "EXITING"}), (name, status, data)
                self.refused[name] = self.refused.get(name, 0) + 1

    async def consumer(self) -> None:
        c = await RawClient.connect(self.p.tcp_port)
        await c.sub("t", "a", rdy=50)
        # after the stop, read on until quiet: what nsqd sent before a kill -9 (still in this
        # socket) was delivered
        while True:
            try:
                m = await c.read_message(timeout=0.5)
            except TimeoutError:
                if self.stop.is_set():
                    break
                continue
            except ConnectionError:
                assert self.stop.is_set(), "nsqd closed a consumer's connection"
                break
            self.got_a.add(m.body)
            c.send(commands.fin(m.id))
        await c.close()


async def poll(what: str, cond, timeout: float, describe=str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"not within {timeout}s: {what}\n{describe()}"
        await asyncio.sleep(0.1)


async def consume_until(
    port: int, topic: str, channel: str, want: set[bytes], got: set[bytes], timeout: float
):
    """FIN messages of topic/channel into ``got`` until it holds all of ``want``."""
    c = await RawClient.connect(port)
    await c.sub(topic, channel, rdy=500)
    deadline = time.monotonic() + timeout
    while want - got:
        left = deadline - time.monotonic()
        assert left > 0, (
            f"{topic}/{channel}: {len(want - got)} of {len(want)} acknowledged messages lost, e.g. "
            f"{sorted(b[:16] for b in want - got)[:20]}"
        )
        try:
            m = await c.read_message(timeout=min(left, 2.0))
        except TimeoutError:
            continue
        got.add(m.body)
        c.send(commands.fin(m.id))
    await c.close()


async def consume_all(p: NsqdProcess, topic: str, channel: str, got: set[bytes], timeout: float) -> None:
    """FIN messages of topic/channel into ``got`` until nsqd says the channel is empty."""
    c = await RawClient.connect(p.tcp_port)
    await c.sub(topic, channel, rdy=500)
    deadline = time.monotonic() + timeout
    while True:
        assert time.monotonic() < deadline, f"{topic}/{channel} never emptied"
        try:
            m = await c.read_message(timeout=0.5)
        except TimeoutError:
            _, stats = await asyncio.to_thread(
                p.http_get, f"/stats?format=json&topic={topic}&channel={channel}"
            )
            (ch,) = [c for c in json.loads(stats)["topics"][0]["channels"] if c["channel_name"] == channel]
            if ch["depth"] == ch["in_flight_count"] == ch["deferred_count"] == 0:
                break
            continue
        got.add(m.body)
        c.send(commands.fin(m.id))
    await c.close()


def start(data: Path, logs: Path) -> NsqdProcess:
    return NsqdProcess(data, *FLAGS, log_dir=logs).start()


async def test_full_disk_under_load_refuses_with_answers_and_loses_nothing(tmp_path):
    """Refusals under load, space back, then a clean restart."""
    with mounted_tmpfs(tmp_path / "disk", "16m") as disk:
        data, logs = disk / "data", tmp_path / "logs"
        p = start(data, logs)
        try:
            assert p.http_post("/topic/create?topic=t")[0] == 200
            assert p.http_post("/channel/create?topic=t&channel=a")[0] == 200
            assert p.http_post("/topic/create?topic=u")[0] == 200  # no channel: the topic's queue
            filler = fill_disk(disk, leave=1 << 20)
            load = Load(p)
            pubs = {
                "pub-t": ("PUB", "t"), "pub-u": ("PUB", "u"), "pub-t2": ("PUB", "t"),
                "mpub-t": ("MPUB", "t"), "mpub-u": ("MPUB", "u"),
                "dpub-t": ("DPUB", "t"), "dpub-u": ("DPUB", "u"), "dpub-t2": ("DPUB", "t"),
            }  # fmt: skip
            https = {"http-pub": ("/pub", "u"), "http-mpub": ("/mpub", "t")}
            # a DPUB to a topic with a channel is held in memory (the channel's deferred
            # queue, as Go does) and answered OK with a full disk; every other publish writes
            writers = [n for n, (k, t) in pubs.items() if (k, t) != ("DPUB", "t")] + list(https)
            tasks = [asyncio.create_task(load.tcp_publisher(n, k, t)) for n, (k, t) in pubs.items()]
            tasks += [asyncio.create_task(load.http_publisher(n, pth, t)) for n, (pth, t) in https.items()]
            tasks += [asyncio.create_task(load.consumer()) for _ in range(3)]

            def failed() -> None:
                for t in tasks:
                    if t.done() and t.exception() is not None:
                        raise t.exception()  # type: ignore[misc]

            unhealthy = []

            def every_publisher_refused() -> bool:
                failed()
                if p.http_get("/ping")[0] == 500:
                    unhealthy.append(True)
                return all(load.refused.get(n, 0) >= 5 for n in writers)

            def counts() -> str:
                return (
                    f"refused {load.refused}\nacknowledged after the space came back {load.acked_after}"
                    f"\nacknowledged { ({k: len(v) for k, v in load.acked.items()}) }"
                    f", consumed {len(load.got_a)}"
                )

            await poll("five refusals for every publisher that writes", every_publisher_refused, 60, counts)
            assert unhealthy, "/ping never answered 500 while publishes were refused"
            assert all(load.acked.values()), load.acked.keys()

            # space comes back: every publisher is acknowledged again, without a restart
            filler.unlink()
            load.space_back = True

            def resumed() -> bool:
                failed()
                return all(load.acked_after.get(n, 0) >= 20 for n in [*pubs, *https])

            await poll("publishing resumed for every publisher", resumed, 60, counts)
            assert p.http_get("/ping") == (200, b"OK")
            load.stop.set()
            await asyncio.gather(*tasks)
            code = p.stop(timeout=30)
            assert code == 0, p.describe()
            assert "Traceback" not in p.stderr(), p.describe()

            # a clean restart: every acknowledged message comes out of each queue
            p = start(data, logs)
            got_a = set(load.got_a)
            await consume_until(p.tcp_port, "t", "a", load.acked["t"], got_a, 60)
            got_u: set[bytes] = set()
            await consume_until(p.tcp_port, "u", "x", load.acked["u"], got_u, 60)
        finally:
            code = p.stop(timeout=30)
        assert code == 0, p.describe()
        assert "Traceback" not in p.stderr(), p.describe()


async def test_unwritable_data_directory_across_a_restart(tmp_path):
    with mounted_tmpfs(tmp_path / "disk", "16m") as disk:
        data, logs = disk / "data", tmp_path / "logs"
        p = start(data, logs)
        try:
            assert p.http_post("/topic/create?topic=t")[0] == 200
            assert p.http_post("/channel/create?topic=t&channel=a")[0] == 200
            load = Load(p)
            tasks = [
                asyncio.create_task(load.tcp_publisher("pub", "PUB", "t")),
                asyncio.create_task(load.tcp_publisher("mpub", "MPUB", "t")),
                asyncio.create_task(load.tcp_publisher("dpub", "DPUB", "t")),
                asyncio.create_task(load.http_publisher("http", "/mpub", "t")),
                asyncio.create_task(load.consumer()),
            ]
            await poll("messages published", lambda: len(load.acked["t"]) > 2000, 60)
            load.stop.set()
            await asyncio.gather(*tasks)
            assert p.stop(timeout=30) == 0, p.describe()

            # read-only now: nsqd refuses to start, says why, and leaves the data alone
            subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
            ro = NsqdProcess(data, *FLAGS, log_dir=logs / "ro")
            DaemonProcess.start(ro)
            try:
                assert ro.wait(15) == 1, ro.describe()
            finally:
                ro.stop()
            assert re.search(r"FATAL: failed to persist metadata - .*read-only file system", ro.stderr()), (
                ro.describe()
            )
            assert "Traceback" not in ro.stderr(), ro.describe()

            subprocess.run(["mount", "-o", "remount,rw", str(disk)], check=True)
            p = start(data, logs)
            got = set(load.got_a)
            await consume_until(p.tcp_port, "t", "a", load.acked["t"], got, 60)
        finally:
            code = p.stop(timeout=30)
        assert code == 0, p.describe()
        assert "Traceback" not in p.stderr(), p.describe()


async def test_kill_9_under_load_while_the_disk_is_full_loses_nothing_on_disk(tmp_path):
    """The same load; nsqd is killed -9 mid-load while the disk is still full. Channel
    ``archive`` (read only after the restart) and topic u's queue hold every message
    acknowledged with a write (all but the DPUBs held in memory); channel ``a``, consumed
    during the load, may miss only what was in flight at the kill (sent, not yet read by the
    consumer: at most the consumers' RDY, as test_restart_storms.py says and Go does)."""
    with mounted_tmpfs(tmp_path / "disk", "16m") as disk:
        data, logs = disk / "data", tmp_path / "logs"
        p = start(data, logs / "before")
        try:
            assert p.http_post("/topic/create?topic=t")[0] == 200
            assert p.http_post("/channel/create?topic=t&channel=a")[0] == 200
            assert p.http_post("/channel/create?topic=t&channel=archive")[0] == 200
            assert p.http_post("/topic/create?topic=u")[0] == 200
            filler = fill_disk(disk, leave=1 << 20)
            load = Load(p)
            pubs = {
                "pub-t": ("PUB", "t"), "pub-u": ("PUB", "u"),
                "mpub-t": ("MPUB", "t"), "mpub-u": ("MPUB", "u"),
                "dpub-t": ("DPUB", "t"), "dpub-u": ("DPUB", "u"),
            }  # fmt: skip
            tasks = [asyncio.create_task(load.tcp_publisher(n, k, t)) for n, (k, t) in pubs.items()]
            tasks.append(asyncio.create_task(load.http_publisher("http-mpub", "/mpub", "u")))
            tasks += [asyncio.create_task(load.consumer()) for _ in range(2)]
            writers = ["pub-t", "pub-u", "mpub-t", "mpub-u", "dpub-u", "http-mpub"]

            def refused() -> bool:
                for t in tasks:
                    if t.done() and t.exception() is not None:
                        raise t.exception()  # type: ignore[misc]
                return all(load.refused.get(n, 0) >= 3 for n in writers)

            await poll("refusals for every publisher that writes", refused, 60, lambda: str(load.refused))
            p.kill()  # mid-load, disk full
            load.stop.set()
            results = await asyncio.gather(*tasks, return_exceptions=True)
            # the publishers and consumers saw the daemon vanish, nothing else
            assert all(r is None or isinstance(r, OSError) for r in results), results
            filler.unlink()

            p = start(data, logs / "after")
            want_t = load.acked["t"] - load.in_memory
            got_archive: set[bytes] = set()
            await consume_until(p.tcp_port, "t", "archive", want_t, got_archive, 60)
            got_a = set(load.got_a)
            await consume_all(p, "t", "a", got_a, 60)
            in_flight = want_t - got_a
            assert len(in_flight) <= 2 * 50, f"channel a lost {len(in_flight)}, more than was in flight"
            got_u: set[bytes] = set()
            await consume_until(p.tcp_port, "u", "x", load.acked["u"], got_u, 60)
        finally:
            code = p.stop(timeout=30)
        assert code == 0, p.describe()
        assert "Traceback" not in p.stderr(), p.describe()
