"""nsqd on a disk that fails for real: a read-only data path, a full disk, a shutdown that
cannot flush. The nsqd console script runs on a small tmpfs the test mounts (root is needed;
the tests skip with the reason otherwise).

The promise checked: with ``--mem-queue-size=0 --sync-every=1`` every ``OK`` is on disk, so a
full disk costs the publisher an error (Go's ``E_PUB_FAILED PUB failed write <file>: no space
left on device``) and never an acknowledged message, not even across kill -9; ``/ping``
answers 500 ``NOK - <error>`` while writes fail; publishing resumes by itself when space
returns.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import time

import pytest
from e2e.proc import DaemonProcess, NsqdProcess
from support import RawClient, fill_disk, mounted_tmpfs

from nsqpy.protocol import commands

pytestmark = pytest.mark.timeout(120)

DURABLE = ("--mem-queue-size=0", "--sync-every=1")
NO_SPACE = re.compile(
    r"^(?P<code>E_[A-Z]+_FAILED) (?P<cmd>[A-Z]+) failed (open|write|sync|rename) \S+: "
    r"no space left on device$"
)


def body(i: int) -> bytes:
    return b"msg-%06d-" % i + b"x" * 1000


async def publish_until_refused(port: int, topic: str, limit: int = 100_000) -> tuple[list[bytes], str]:
    """PUB one message at a time until nsqd refuses one: (acknowledged bodies, error text).
    The refusal must be an error frame followed by the connection closing."""
    c = await RawClient.connect(port)
    acked: list[bytes] = []
    for i in range(limit):
        ftype, data = await c.pub(topic, body(i))
        if (ftype, data) != (0, b"OK"):
            assert ftype == 1, (ftype, data)
            await c.expect_closed()
            return acked, data.decode()
        acked.append(body(i))
    raise AssertionError(f"the disk never filled up after {limit} messages")


async def consume_all(port: int, topic: str, channel: str, quiet: float = 1.5) -> list[bytes]:
    """Every message the channel delivers until it stays quiet for ``quiet`` seconds (FIN'd)."""
    c = await RawClient.connect(port)
    await c.sub(topic, channel, rdy=2500)
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


def ping(p: NsqdProcess) -> tuple[int, str]:
    status, data = p.http_get("/ping")
    return status, data.decode()


@pytest.fixture
def disk(tmp_path):
    with mounted_tmpfs(tmp_path / "disk", "16m") as mnt:
        yield mnt


def start_nsqd(disk, *args: str) -> NsqdProcess:
    return NsqdProcess(disk / "data", *args, log_dir=disk.parent / "logs").start()


def test_read_only_data_path_refuses_to_start(tmp_path):
    with mounted_tmpfs(tmp_path / "ro", "1m", read_only=True) as ro:
        p = NsqdProcess(ro, log_dir=tmp_path / "logs")
        DaemonProcess.start(p)  # no waiting for addresses: it must exit instead
        try:
            code = p.wait(15)
        finally:
            p.stop()
    assert code == 1, p.describe()
    assert re.search(
        r"FATAL: failed to persist metadata - open \S+/nsqd\.dat\.\d+\.tmp: read-only file system",
        p.stderr(),
    ), p.describe()
    assert "Traceback" not in p.stderr()


async def test_full_disk_refuses_publishes_turns_ping_500_and_loses_no_ok(disk):
    """A channel exists: publishes go straight to its DiskQueue."""
    p = start_nsqd(disk, *DURABLE)
    try:
        assert p.http_post("/topic/create?topic=t")[0] == 200
        assert p.http_post("/channel/create?topic=t&channel=c")[0] == 200
        filler = fill_disk(disk, leave=256 * 1024)
        acked, err = await publish_until_refused(p.tcp_port, "t")
        assert acked, "nothing could be published before the disk was full"
        m = NO_SPACE.match(err)
        assert m and m["code"] == "E_PUB_FAILED" and m["cmd"] == "PUB", err

        status, text = ping(p)
        assert status == 500 and text.startswith("NOK - ") and "no space left on device" in text
        status, stats = p.http_get("/stats?format=json")
        assert json.loads(stats)["health"] == text

        # every publish path refuses while the disk is full: MPUB, DPUB-free HTTP /pub
        c = await RawClient.connect(p.tcp_port)
        c.send(commands.mpub("t", [body(i) for i in range(200)]))
        ftype, data = await c.read_frame()
        assert ftype == 1 and (m := NO_SPACE.match(data.decode())) and m["code"] == "E_MPUB_FAILED"
        await c.expect_closed()
        # (bigger than the slack in the segment's last allocated block: a record that fits
        # there is written and fsynced, and rightly acknowledged)
        status, data = p.http_post("/pub?topic=t", b"over http" * 8192)
        assert status == 503 and b"EXITING" in data

        # space comes back: publishing resumes by itself, /ping turns healthy
        filler.unlink()
        c = await RawClient.connect(p.tcp_port)
        assert await c.pub("t", b"after") == (0, b"OK")
        await c.close()
        assert ping(p) == (200, "OK")

        # a crash now: every acknowledged message is on disk
        p.kill()
        p = start_nsqd(disk, *DURABLE)
        got = await consume_all(p.tcp_port, "t", "c")
        missing = set(acked) - set(got)
        assert not missing, f"{len(missing)} of {len(acked)} acknowledged messages lost"
        assert b"after" in got
    finally:
        p.stop()
    assert "Traceback" not in p.stderr(), p.describe()


async def test_topic_backlog_reaches_every_channel_after_the_disk_was_full(disk):
    """No channel at first: publishes wait in the topic's DiskQueue. Two channels appear
    while the disk is full; the backlog moves to them once space returns: each gets every
    acknowledged message, once."""
    p = start_nsqd(disk, *DURABLE)
    try:
        filler = fill_disk(disk, leave=512 * 1024)
        acked, err = await publish_until_refused(p.tcp_port, "t")
        assert NO_SPACE.match(err), err
        for ch in ("a", "b"):
            assert p.http_post(f"/channel/create?topic=t&channel={ch}")[0] == 200

        # the backlog cannot move while the disk is full, and nothing is dropped meanwhile
        await asyncio.sleep(1.5)  # two drain attempts (DRAIN_RETRY is 1 s); nothing to poll for
        _status, stats = p.http_get("/stats?format=json&topic=t")
        topic = json.loads(stats)["topics"][0]
        total = topic["depth"] + sum(ch["depth"] for ch in topic["channels"])
        assert total >= len(acked), topic

        filler.unlink()
        for ch in ("a", "b"):
            got = await consume_all(p.tcp_port, "t", ch)
            missing = set(acked) - set(got)
            assert not missing, f"channel {ch}: {len(missing)} of {len(acked)} acknowledged lost"
            assert len(got) == len(set(got)), f"channel {ch}: duplicates"
        assert ping(p)[0] == 200
    finally:
        code = p.stop()
    assert code == 0, p.describe()
    assert "Traceback" not in p.stderr(), p.describe()


async def test_shutdown_that_cannot_flush_reports_the_loss_and_exits_1(disk):
    p = start_nsqd(disk, "--mem-queue-size=100000")
    try:
        c = await RawClient.connect(p.tcp_port)
        c.send(commands.mpub("t", [body(i) for i in range(500)]))
        assert await c.read_frame() == (0, b"OK")
        await c.close()
        fill_disk(disk)
        p.send_signal(signal.SIGTERM)
        code = p.wait(30)
    finally:
        p.stop()
    assert code == 1, p.describe()
    err = p.stderr()
    assert re.search(r"TOPIC\(t\): failed to flush 500 of 500 message\(s\) to disk, they are lost", err), err
    assert "Traceback" not in err


async def test_http_publishes_are_refused_not_lost(disk):
    p = start_nsqd(disk, *DURABLE)
    try:
        assert p.http_post("/topic/create?topic=h")[0] == 200
        assert p.http_post("/channel/create?topic=h&channel=c")[0] == 200
        filler = fill_disk(disk, leave=128 * 1024)
        acked = []
        deadline = time.monotonic() + 60
        while True:
            assert time.monotonic() < deadline, "the disk never filled up"
            b = body(len(acked))
            status, data = p.http_post("/pub?topic=h", b)
            if status != 200:
                assert (status, json.loads(data)) == (503, {"message": "EXITING"})
                break
            acked.append(b)
        status, data = p.http_post("/mpub?topic=h", b"\n".join(body(i) for i in range(100)))
        assert status == 503
        assert ping(p)[0] == 500
        filler.unlink()
        got = await consume_all(p.tcp_port, "h", "c")
        assert not set(acked) - set(got)
    finally:
        code = p.stop()
    assert code == 0, p.describe()
