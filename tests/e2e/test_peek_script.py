"""Peek and redrive through the nsqd console script: a kill -9 in the middle of a redrive in
the crash-safe mode leaves every message in the dead-letter queue, in its destination, or in
both (never in neither); the admin token file is re-read on SIGHUP."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import threading
import time
import urllib.request

import pytest
from e2e.proc import NsqdProcess
from support import RawClient, nsqd_stats

from nsqpy.protocol import commands

pytestmark = pytest.mark.timeout(180)

STRICT = ("--mem-queue-size=0", "--sync-every=1", "--max-bytes-per-file=1048576")


async def publish(port: int, topic: str, bodies: list[bytes], batch: int = 200) -> None:
    p = await RawClient.connect(port)
    for i in range(0, len(bodies), batch):
        p.send(commands.mpub(topic, bodies[i : i + batch]))
        assert await p.read_frame(timeout=20) == (0, b"OK")
    await p.close()


async def drain_all(port: int, topic: str, channel: str, quiet: float = 1.0) -> list[bytes]:
    """Every message the channel delivers until it is quiet for ``quiet`` seconds."""
    c = await RawClient.connect(port)
    await c.sub(topic, channel, rdy=1000)
    got = []
    while True:
        try:
            m = await c.read_message(timeout=quiet)
        except TimeoutError:
            break
        got.append(m.body)
        c.send(commands.fin(m.id))
    await c.close()
    return got


def post_in_background(url: str) -> threading.Thread:
    def run() -> None:
        try:
            urllib.request.urlopen(urllib.request.Request(url, data=b"", method="POST"), timeout=30).read()
        except OSError:
            pass  # the kill cuts it off

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def depth(p: NsqdProcess, topic: str, channel: str | None = None) -> int:
    for t in nsqd_stats(p.http_address)["topics"] or []:
        if t["topic_name"] == topic:
            if channel is None:
                return t["depth"]
            for c in t["channels"]:
                if c["channel_name"] == channel:
                    return c["depth"]
    return 0


@pytest.mark.parametrize("source", ["topic", "channel"])
async def test_kill_9_during_a_redrive_loses_nothing(tmp_path, source):
    n = 200_000
    bodies = [b"dead-%06d" % i for i in range(n)]
    rng = random.Random(29)
    partial = 0
    for round_ in range(2):
        data = tmp_path / f"r{round_}"
        with NsqdProcess(data, *STRICT).start() as p:
            p.http_post("/topic/create?topic=work")
            p.http_post("/channel/create?topic=work&channel=c")
            if source == "channel":
                p.http_post("/topic/create?topic=t.dlq")
                p.http_post("/channel/create?topic=t.dlq&channel=inspect")
            await publish(p.tcp_port, "t.dlq", bodies, batch=1000)
            query = "topic=t.dlq&destination=work" + ("&channel=inspect" if source == "channel" else "")
            post_in_background(f"http://{p.http_address}/topic/redrive?{query}")
            if round_ == 0:  # as soon as copies arrive
                deadline = time.monotonic() + 10
                while depth(p, "work", "c") == 0 and time.monotonic() < deadline:
                    pass
            else:
                await asyncio.sleep(rng.uniform(0.0, 0.1))
            p.kill()
        with NsqdProcess(data, *STRICT).start() as p:
            left = depth(p, "t.dlq", "inspect" if source == "channel" else None)
            moved = depth(p, "work", "c")
            if 0 < moved < n:
                partial += 1
            if source == "topic":
                p.http_post("/channel/create?topic=t.dlq&channel=inspect")
            in_dlq = await drain_all(p.tcp_port, "t.dlq", "inspect")
            in_work = await drain_all(p.tcp_port, "work", "c")
            assert len(in_dlq) == left and len(in_work) == moved
            # every message is somewhere; none is twice in one place
            assert set(in_dlq) | set(in_work) == set(bodies)
            assert len(set(in_dlq)) == len(in_dlq) and len(set(in_work)) == len(in_work)
            print(f"round {round_}: {left} left, {moved} moved, {left + moved - n} in both")
            p.stop()
    print(f"rounds killed mid-redrive: {partial} of 2")


async def test_redrive_answers_after_the_copies_are_on_disk(tmp_path):
    """A redrive's answer means the copies survive a kill -9 that follows at once."""
    with NsqdProcess(tmp_path, *STRICT).start() as p:
        p.http_post("/topic/create?topic=work")
        p.http_post("/channel/create?topic=work&channel=c")
        await publish(p.tcp_port, "t.dlq", [b"m%04d" % i for i in range(2000)])
        status, body = p.http_post("/topic/redrive?topic=t.dlq&destination=work&n=1500", timeout=30)
        assert (status, json.loads(body)) == (200, {"moved": 1500})
        p.kill()
    with NsqdProcess(tmp_path, *STRICT).start() as p:
        assert depth(p, "work", "c") == 1500
        assert depth(p, "t.dlq") in (500, 2000) or 500 <= depth(p, "t.dlq") <= 2000
        got = await drain_all(p.tcp_port, "work", "c")
        assert sorted(got) == [b"m%04d" % i for i in range(1500)]


async def test_peek_through_the_script_and_the_token_file_on_sighup(tmp_path):
    tokens = tmp_path / "tokens"
    tokens.write_text("first\n")
    os.chmod(tokens, 0o600)
    with NsqdProcess(tmp_path / "data", f"--admin-token-file={tokens}").start() as p:
        p.http_post("/topic/create?topic=t")
        await publish(p.tcp_port, "t", [b"hello"])
        url = f"http://{p.http_address}/topic/peek?topic=t"

        def get(token: str | None) -> tuple[int, dict]:
            req = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"} if token else {})
            try:
                with urllib.request.urlopen(req, timeout=5) as r:
                    return r.status, json.loads(r.read())
            except urllib.error.HTTPError as e:
                return e.code, json.loads(e.read())

        assert get(None) == (401, {"message": "UNAUTHORIZED"})
        status, doc = get("first")
        assert status == 200 and doc["messages"][0]["body_preview"] == "hello"
        tokens.write_text("second\n")
        p.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 5
        while get("second")[0] != 200:
            assert time.monotonic() < deadline, "SIGHUP did not reload the tokens"
            await asyncio.sleep(0.05)
        assert get("first") == (403, {"message": "FORBIDDEN"})
        assert p.is_running()
    # a token file other users can read: nsqd refuses to start
    tokens.chmod(0o644)
    p = NsqdProcess(tmp_path / "data2", f"--admin-token-file={tokens}")
    with pytest.raises(Exception):  # noqa: B017 - the start fails whichever way it is told
        p.start(timeout=10)
    assert p.wait(10) == 1
    assert "readable by other users" in p.stderr()
