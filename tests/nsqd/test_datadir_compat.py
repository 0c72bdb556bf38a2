"""Data-directory compatibility with the Go nsqd 1.x, from the format facts.

Both directions: a directory laid out byte for byte as the Go nsqd v1.3.0 writes it
(nsqd.dat JSON, go-diskqueue v1.1.0 segments and metadata) starts under our nsqd with every
topic, channel, pause flag and message intact; and what our nsqd leaves after a clean
shutdown is read back here by an independent reader that follows the Go reader's rules.
"""

from __future__ import annotations

import json
import os
import struct

import pytest
from conftest import make_options
from support import RawClient, read_go_queue, wait_for

from nsqpy.nsqd.nsqd import NSQD
from nsqpy.protocol import commands

pytestmark = pytest.mark.timeout(30)


def go_message(ts: int, attempts: int, msg_id: bytes, body: bytes) -> bytes:
    """nsqd's Message.WriteTo: [int64 ts][uint16 attempts][16-byte id][body]."""
    return struct.pack(">qH", ts, attempts) + msg_id + body


def write_go_queue(path, name: str, records: list[bytes], max_bytes: int = 1 << 20, read=(0, 0)) -> None:
    """Segments and metadata as go-diskqueue v1.1.0 leaves them after a clean Close."""
    file_num, pos, segment = 0, 0, bytearray()
    for r in records:
        if pos > 0 and pos + 4 + len(r) > max_bytes:
            (path / f"{name}.diskqueue.{file_num:06d}.dat").write_bytes(bytes(segment))
            file_num, pos, segment = file_num + 1, 0, bytearray()
        segment += struct.pack(">i", len(r)) + r
        pos += 4 + len(r)
    (path / f"{name}.diskqueue.{file_num:06d}.dat").write_bytes(bytes(segment))
    meta = f"{len(records)}\n{read[0]},{read[1]}\n{file_num},{pos}\n"
    (path / f"{name}.diskqueue.meta.dat").write_text(meta)


def ids(n: int, start: int = 0) -> list[bytes]:
    return [b"%016x" % (0x0AB0000000000000 + start + i) for i in range(n)]


async def test_directory_written_by_go_nsqd_starts_intact(tmp_path):
    meta = {
        "topics": [
            {
                "channels": [{"name": "c1", "paused": False}, {"name": "c2", "paused": True}],
                "name": "orders",
                "paused": False,
            },
            {"channels": [], "name": "held", "paused": True},
        ],
        "version": "1.3.0",
    }
    (tmp_path / "nsqd.dat").write_text(json.dumps(meta))
    ts = 1_700_000_000_123_456_789
    c1 = [go_message(ts + i, 1 + i % 3, mid, b"c1-%d" % i) for i, mid in enumerate(ids(40))]
    c2 = [go_message(ts + i, 1, mid, b"c2-%d" % i) for i, mid in enumerate(ids(5, 100))]
    held = [go_message(ts, 0, mid, b"held-%d" % i) for i, mid in enumerate(ids(7, 200))]
    write_go_queue(tmp_path, "orders:c1", c1, max_bytes=300)  # several segments
    write_go_queue(tmp_path, "orders:c2", c2)
    write_go_queue(tmp_path, "held", held)
    assert len(list(tmp_path.glob("orders:c1.diskqueue.*.dat"))) > 3

    async with NSQD(make_options(tmp_path)) as d:
        assert set(d.topics) == {"orders", "held"}
        orders = d.topics["orders"]
        assert set(orders.channels) == {"c1", "c2"}
        assert orders.channels["c2"].paused and not orders.channels["c1"].paused
        assert d.topics["held"].paused
        assert orders.channels["c1"].depth == 40 and orders.channels["c2"].depth == 5
        assert d.topics["held"].depth == 7

        c = await RawClient.connect(d.tcp_port)
        await c.sub("orders", "c1", rdy=100)
        got = await c.read_messages(40)
        for i, m in enumerate(got):
            assert m.id == ids(40)[i]
            assert m.timestamp == ts + i
            assert m.body == b"c1-%d" % i
            assert m.attempts == 1 + i % 3 + 1  # stored attempts, then this delivery
        await c.close()


async def test_directory_we_leave_is_readable_by_go_rules(tmp_path):
    async with NSQD(make_options(tmp_path, mem_queue_size=10, max_bytes_per_file=500)) as d:
        p = await RawClient.connect(d.tcp_port)
        p.send(commands.mpub("t", [b"held-%02d" % i for i in range(25)]))
        assert await p.read_frame() == (0, b"OK")
        d.topics["t"].get_channel("c")  # everything moves to the channel
        p.send(commands.mpub("t", [b"more-%02d" % i for i in range(5)]))
        assert await p.read_frame() == (0, b"OK")
        await wait_for(lambda: d.topics["t"].depth == 0)
        d.topics["t"].channels["c"].pause()
        d.get_topic("other").pause()
        p.send(commands.pub("other", b"o"))
        assert await p.read_frame() == (0, b"OK")
    meta = json.loads((tmp_path / "nsqd.dat").read_text())
    assert meta["version"] == "1.3.0"
    topics = {t["name"]: t for t in meta["topics"]}
    assert topics["other"]["paused"] is True and topics["other"]["channels"] == []
    assert topics["t"]["channels"] == [{"name": "c", "paused": True}]
    records = read_go_queue(tmp_path, "t:c")
    bodies = []
    for r in records:
        ts, attempts = struct.unpack_from(">qH", r)
        assert attempts == 0 and ts > 0
        assert len(r[10:26]) == 16 and int(r[10:26], 16) >= 0
        bodies.append(r[26:])
    expected = [b"held-%02d" % i for i in range(25)] + [b"more-%02d" % i for i in range(5)]
    assert sorted(bodies) == sorted(expected)
    assert [r[26:] for r in read_go_queue(tmp_path, "other")] == [b"o"]
    # no stray files a Go nsqd would trip over
    names = sorted(os.listdir(tmp_path))
    assert all(n == "nsqd.dat" or ".diskqueue." in n for n in names), names
