"""End-to-end durability: the nsqd console script across clean restarts and kill -9."""

from __future__ import annotations

import asyncio
import json
import signal
import time

import pytest
from e2e.proc import NsqdProcess
from support import RawClient, nsqd_stats, read_go_queue

from nsqpy.protocol import commands

pytestmark = pytest.mark.timeout(120)


async def drain(port: int, topic: str, channel: str, n: int, timeout: float = 30, fin: bool = True):
    """Consume exactly ``n`` messages (then check nothing more arrives)."""
    c = await RawClient.connect(port)
    await c.sub(topic, channel, rdy=500)
    got = []
    deadline = time.monotonic() + timeout
    while len(got) < n:
        m = await c.read_message(timeout=max(deadline - time.monotonic(), 0.1))
        got.append(m)
        if fin:
            c.send(commands.fin(m.id))
    await c.expect_silence(0.3)
    await c.close()
    return got


def stats(p: NsqdProcess) -> dict:
    return nsqd_stats(p.http_address)


def depths(p: NsqdProcess) -> dict:
    out = {}
    for t in stats(p)["topics"] or []:
        out[t["topic_name"]] = t["depth"]
        for c in t["channels"]:
            out[f"{t['topic_name']}:{c['channel_name']}"] = c["depth"]
    return out


async def publish(port: int, topic: str, bodies: list[bytes], batch: int = 100) -> None:
    p = await RawClient.connect(port)
    for i in range(0, len(bodies), batch):
        p.send(commands.mpub(topic, bodies[i : i + batch]))
        assert await p.read_frame(timeout=20) == (0, b"OK")
    await p.close()


async def test_publish_sigterm_restart_consume_exactly_n(tmp_path):
    n = 20000
    bodies = [b"msg-%06d-" % i + b"x" * 50 for i in range(n)]
    held = [b"held-%05d" % i for i in range(3000)]
    with NsqdProcess(tmp_path, "--mem-queue-size=1000", "--max-bytes-per-file=200000") as p:
        p.start()
        assert p.http_post("/topic/create?topic=t")[0] == 200
        assert p.http_post("/channel/create?topic=t&channel=c")[0] == 200
        await publish(p.tcp_port, "t", bodies)
        await publish(p.tcp_port, "held", held)  # a topic with no channel holds them
        before = depths(p)
        assert before == {"t": 0, "t:c": n, "held": len(held)}
        assert p.stop(signal.SIGTERM, timeout=20) == 0
    assert (tmp_path / "nsqd.dat").exists()
    meta = json.loads((tmp_path / "nsqd.dat").read_text())
    assert {t["name"] for t in meta["topics"]} == {"t", "held"}
    with NsqdProcess(tmp_path) as p:
        p.start()
        assert depths(p) == before
        got = await drain(p.tcp_port, "t", "c", n)
        assert sorted(m.body for m in got) == bodies
        assert all(m.attempts == 1 for m in got)
        got = await drain(p.tcp_port, "held", "first", len(held))
        assert sorted(m.body for m in got) == held
        assert p.stop(signal.SIGINT, timeout=20) == 0


async def test_in_flight_and_deferred_survive_a_clean_restart(tmp_path):
    with NsqdProcess(tmp_path) as p:
        p.start()
        port = p.tcp_port
        await publish(port, "t", [b"f%02d" % i for i in range(30)])
        c = await RawClient.connect(port)
        await c.sub("t", "c", rdy=30)
        msgs = await c.read_messages(30)
        # 10 stay in flight, 10 are requeued with a long delay, 10 are finished
        for m in msgs[10:20]:
            c.send(commands.req(m.id, 4000))
        for m in msgs[20:]:
            c.send(commands.fin(m.id))
        d = await RawClient.connect(port)
        d.send(commands.dpub("t", 4000, b"deferred-pub"))
        assert await d.read_frame() == (0, b"OK")
        deadline = time.monotonic() + 5
        while True:
            ch = stats(p)["topics"][0]["channels"][0]
            if ch["deferred_count"] == 11 and ch["in_flight_count"] == 10:
                break
            assert time.monotonic() < deadline, ch
            await asyncio.sleep(0.05)
        stopped_at = time.monotonic()
        assert p.stop(signal.SIGTERM, timeout=20) == 0
    sidecar = tmp_path / "t:c.diskqueue.journal.dat"  # the due times (nsqpy addition)
    assert sidecar.exists()
    with NsqdProcess(tmp_path) as p:
        p.start()
        assert depths(p)["t:c"] == 21  # 10 in flight at once, 11 deferred come later
        c = await RawClient.connect(p.tcp_port)
        await c.sub("t", "c", rdy=50)
        first = await c.read_messages(10)
        assert sorted(m.body for m in first) == sorted(m.body for m in msgs[:10])
        assert all(m.attempts == 2 for m in first)
        await c.expect_silence(0.5)  # the deferred ones keep their due time
        later = await c.read_messages(11, timeout=15)
        assert time.monotonic() - stopped_at >= 3.5
        assert sorted(m.body for m in later) == sorted([m.body for m in msgs[10:20]] + [b"deferred-pub"])
        requeued = {m.body: m.attempts for m in later}
        assert all(requeued[m.body] == 2 for m in msgs[10:20])
        assert requeued[b"deferred-pub"] == 1
        await c.close()


async def test_kill_9_loses_no_acknowledged_message(tmp_path):
    acked: list[bytes] = []
    with NsqdProcess(tmp_path, "--mem-queue-size=0", "--sync-every=1") as p:
        p.start()
        port = p.tcp_port
        assert p.http_post("/topic/create?topic=t")[0] == 200
        assert p.http_post("/channel/create?topic=t&channel=c")[0] == 200

        async def publisher(k: int) -> None:
            c = await RawClient.connect(port)
            i = 0
            try:
                while True:
                    body = b"p%d-%06d" % (k, i)
                    c.send(commands.pub("t", body))
                    if await c.read_frame(timeout=5) != (0, b"OK"):
                        return
                    acked.append(body)
                    i += 1
            except (ConnectionError, TimeoutError, OSError):
                return

        tasks = [asyncio.create_task(publisher(k)) for k in range(4)]
        deadline = time.monotonic() + 20
        while len(acked) < 300:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.02)
        p.send_signal(signal.SIGKILL)
        await asyncio.wait(tasks, timeout=10)
        p.wait(10)
    n_acked = len(acked)
    with NsqdProcess(tmp_path) as p:
        p.start()
        depth = depths(p)["t:c"]
        assert depth >= n_acked
        got = await drain(p.tcp_port, "t", "c", depth)
        bodies = {m.body for m in got}
        missing = set(acked) - bodies
        assert not missing, f"{len(missing)} acknowledged messages lost"


async def test_topics_channels_and_pauses_survive_restart(tmp_path):
    with NsqdProcess(tmp_path) as p:
        p.start()
        for path in (
            "/topic/create?topic=a",
            "/channel/create?topic=a&channel=x",
            "/channel/create?topic=a&channel=y",
            "/topic/create?topic=b",
            "/topic/pause?topic=b",
            "/channel/pause?topic=a&channel=y",
        ):
            assert p.http_post(path)[0] == 200
        c = await RawClient.connect(p.tcp_port)
        await c.sub("a", "e#ephemeral")
        assert p.stop(signal.SIGTERM, timeout=20) == 0
    with NsqdProcess(tmp_path) as p:
        p.start()
        topics = {t["topic_name"]: t for t in stats(p)["topics"]}
        assert set(topics) == {"a", "b"}
        assert topics["b"]["paused"] is True and topics["a"]["paused"] is False
        chans = {c["channel_name"]: c["paused"] for c in topics["a"]["channels"]}
        assert chans == {"x": False, "y": True}


STRICT = ("--mem-queue-size=0", "--sync-every=1")


async def act_on(c: RawClient) -> None:
    """Wait until nsqd has acted on everything sent on ``c`` (a FIN of an id nobody has is
    answered after what came before it)."""
    c.send(commands.fin(b"0" * 16))
    ftype, data = await c.read_frame()
    assert ftype == 1 and data.startswith(b"E_FIN_FAILED"), data


@pytest.mark.parametrize("stop", ["kill -9", "SIGTERM"])
async def test_crash_safe_mode_keeps_every_unfinished_message(tmp_path, stop):
    """The crash-safe mode's promise, in the scenario NSQ loses messages in: queued, in
    flight, requeued with a delay, DPUB'd and not yet due. After the restart each comes back
    (in flight: attempts counted; deferred: when due, not before), finished ones do not, and
    the directory read by the Go nsqd's rules holds every unfinished message."""
    bodies = [b"q%04d" % i for i in range(300)]
    with NsqdProcess(tmp_path, *STRICT, "--msg-timeout=60s") as p:
        p.start()
        assert p.http_post("/topic/create?topic=t")[0] == 200
        assert p.http_post("/channel/create?topic=t&channel=c")[0] == 200
        await publish(p.tcp_port, "t", bodies)
        d = await RawClient.connect(p.tcp_port)
        for i in range(5):
            d.send(commands.dpub("t", 4000, b"dpub-%d" % i))
            assert await d.read_frame() == (0, b"OK")
        c = await RawClient.connect(p.tcp_port)
        await c.sub("t", "c", rdy=60)
        got = await c.read_messages(60)
        c.send(commands.rdy(0))  # no more: what is in flight stays so
        finished, requeued, held = got[:20], got[20:30], got[30:]
        for m in finished:
            c.send(commands.fin(m.id))
        for m in requeued:
            c.send(commands.req(m.id, 4000))
        await act_on(c)
        stopped_at = time.monotonic()
        if stop == "kill -9":
            p.kill()
        else:
            assert p.stop(signal.SIGTERM, timeout=20) == 0
    # what the Go nsqd would read: from the floor on, every message not finished
    go_view = {r[26:] for r in read_go_queue(tmp_path, "t:c")}
    unfinished = set(bodies) - {m.body for m in finished} | {b"dpub-%d" % i for i in range(5)}
    assert unfinished <= go_view
    with NsqdProcess(tmp_path, *STRICT) as p:
        p.start()
        # the depth counts what is owed now: the journal's finished records are not in it
        assert depths(p)["t:c"] == len(unfinished)
        c = await RawClient.connect(p.tcp_port)
        await c.sub("t", "c", rdy=500)
        now = await c.read_messages(270)  # 240 never delivered, 30 in flight at the stop
        attempts = {m.body: m.attempts for m in now}
        assert set(attempts) == set(bodies[60:]) | {m.body for m in held}
        assert all(attempts[m.body] == 2 for m in held)  # the delivery before the stop counts
        assert all(attempts[b] == 1 for b in bodies[60:])
        for m in now:
            c.send(commands.fin(m.id))
        await c.expect_silence(0.5)  # the deferred ones keep their due time
        later = await c.read_messages(15, timeout=15)
        assert time.monotonic() - stopped_at >= 3.5
        assert {m.body for m in later} == {m.body for m in requeued} | {b"dpub-%d" % i for i in range(5)}
        for m in later:
            c.send(commands.fin(m.id))
        await act_on(c)
        await c.expect_silence(0.5)  # and the finished ones never come back
        await c.close()


async def test_dpub_held_by_a_topic_keeps_its_due_time_across_kill_9(tmp_path):
    """A topic without channels holds a DPUB in its DiskQueue: its due time is kept (NSQ's
    topic backlog forgets it and delivers at once)."""
    with NsqdProcess(tmp_path, *STRICT) as p:
        p.start()
        d = await RawClient.connect(p.tcp_port)
        d.send(commands.dpub("held", 3000, b"later"))
        assert await d.read_frame() == (0, b"OK")
        d.send(commands.pub("held", b"now"))
        assert await d.read_frame() == (0, b"OK")
        sent_at = time.monotonic()
        p.kill()
    with NsqdProcess(tmp_path, *STRICT) as p:
        p.start()
        c = await RawClient.connect(p.tcp_port)
        await c.sub("held", "c", rdy=10)
        assert (await c.read_message()).body == b"now"
        m = await c.read_message(timeout=10)
        assert m.body == b"later" and time.monotonic() - sent_at >= 2.9
        await c.close()


async def test_queue_settings_survive_kill_9(tmp_path):
    """A queue setting nsqd answered is on disk (nsqd.dat): a kill -9 right after keeps it,
    and in the crash-safe mode a bound still holds what it bounded."""
    with NsqdProcess(tmp_path, *STRICT) as p:
        p.start()
        assert p.http_post("/topic/create?topic=t")[0] == 200
        assert p.http_post("/channel/create?topic=t&channel=c")[0] == 200
        settings = json.dumps({"max_depth": 3, "max_attempts": 2, "dead_letter_topic": "t.dlq"}).encode()
        status, _ = p.http_post("/channel/config?topic=t&channel=c", settings)
        assert status == 200
        await publish(p.tcp_port, "t", [b"1", b"2", b"3"])
        p.kill()
    with NsqdProcess(tmp_path, *STRICT) as p:
        p.start()
        status, body = p.http_get("/channel/config?topic=t&channel=c")
        doc = json.loads(body)
        assert (status, doc["max_depth"], doc["max_attempts"], doc["dead_letter_topic"]) == (
            200,
            3,
            2,
            "t.dlq",
        )
        status, body = p.http_post("/pub?topic=t", b"4")
        assert status == 503 and b"channel t:c is full (max_depth 3)" in body
