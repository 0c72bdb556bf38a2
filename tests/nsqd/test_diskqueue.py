"""DiskQueue: go-diskqueue v1.1.0's format and rules (nsqd 1.3.0), plus crash recovery."""

from __future__ import annotations

import logging
import os
import shutil
import struct
import tempfile
import threading
from collections import deque
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nsqpy.nsqd.diskqueue import (
    DiskQueue,
    DiskQueueClosedError,
    InvalidMessageSizeError,
)

FIXTURES = Path(__file__).parent / "fixtures" / "diskqueue"


def mk(path, name="q", **kw) -> DiskQueue:
    opts = dict(
        max_bytes_per_file=1024,
        min_msg_size=4,
        max_msg_size=1024,
        sync_every=2500,
        sync_timeout=2.0,
    )
    opts.update(kw)
    return DiskQueue(name, str(path), **opts)


def seg(path, name, n) -> Path:
    return Path(path) / ("%s.diskqueue.%06d.dat" % (name, n))


def meta(path, name="q") -> str:
    return (Path(path) / ("%s.diskqueue.meta.dat" % name)).read_text()


def files(path) -> list[str]:
    return sorted(os.listdir(path))


def rec(data: bytes) -> bytes:
    return struct.pack(">i", len(data)) + data


def read_all(dq: DiskQueue, batch: int = 1000) -> list[bytes]:
    out: list[bytes] = []
    for _ in range(100000):  # bounded: a reader bug must fail, not hang
        got = dq.read(batch)
        if not got:
            return out
        out += got
    raise AssertionError("read() never ran dry")


def real(p) -> str:
    return os.path.realpath(str(p))


def msgs(n: int, size: int = 10) -> list[bytes]:
    return [(b"%d:" % i).ljust(size, b"x") for i in range(n)]


# ---------------------------------------------------------------- basics


def test_put_read_depth(tmp_path):
    dq = mk(tmp_path)
    assert dq.depth == 0
    assert dq.read(10) == []
    dq.put(b"test")
    assert dq.depth == 1
    assert dq.read(10) == [b"test"]
    assert dq.depth == 0
    data = msgs(50)
    for m in data:
        dq.put(m)
    assert dq.depth == 50
    assert dq.read(7) == data[:7]
    assert dq.depth == 43
    assert read_all(dq, 5) == data[7:]
    assert dq.depth == 0
    dq.close()


def test_size_limits(tmp_path):
    dq = mk(tmp_path, min_msg_size=4, max_msg_size=10)
    dq.put(b"1234")
    dq.put(b"1234567890")
    with pytest.raises(InvalidMessageSizeError, match=r"invalid message write size \(3\)"):
        dq.put(b"123")
    with pytest.raises(InvalidMessageSizeError, match=r"\(11\)"):
        dq.put(b"12345678901")
    # put_many checks every size first and writes nothing if one is bad
    with pytest.raises(InvalidMessageSizeError):
        dq.put_many([b"1234", b"12345678901"])
    assert dq.depth == 2
    assert dq.write_pos == 8 + 14
    assert seg(tmp_path, "q", 0).stat().st_size == 22
    assert read_all(dq) == [b"1234", b"1234567890"]
    dq.close()


def test_closed_queue_refuses(tmp_path):
    dq = mk(tmp_path)
    dq.close()
    dq.close()  # idempotent
    with pytest.raises(DiskQueueClosedError):
        dq.put(b"abcd")
    with pytest.raises(DiskQueueClosedError):
        dq.put_many([b"abcd"])
    with pytest.raises(DiskQueueClosedError):
        dq.read(1)
    assert not dq.needs_sync()


# ---------------------------------------------------------------- roll-over


def test_roll_like_go(tmp_path):
    # go-diskqueue TestDiskQueueRoll: 10 records of 14 bytes fill a 140-byte file exactly;
    # the 11th starts file 1
    msg = bytes(range(10))
    dq = mk(tmp_path, max_bytes_per_file=10 * 14, min_msg_size=10)
    for i in range(11):
        dq.put(msg)
        assert dq.depth == i + 1
    assert (dq.write_file_num, dq.write_pos) == (1, 14)
    assert seg(tmp_path, "q", 0).stat().st_size == 140
    assert seg(tmp_path, "q", 1).stat().st_size == 14
    assert read_all(dq, 3) == [msg] * 11
    assert not seg(tmp_path, "q", 0).exists()  # consumed segment deleted
    dq.close()


def test_roll_rule_boundaries(tmp_path):
    # roll before a write iff write_pos > 0 and write_pos + 4 + len > max_bytes_per_file
    dq = mk(tmp_path, max_bytes_per_file=100, min_msg_size=0)
    dq.put(b"a" * 46)  # 50
    dq.put(b"b" * 46)  # 100: exactly full, no roll yet
    assert (dq.write_file_num, dq.write_pos) == (0, 100)
    dq.put(b"")  # 4 more bytes: rolls
    assert (dq.write_file_num, dq.write_pos) == (1, 4)
    dq.put(b"c" * 200)  # bigger than a whole file: rolls, then gets a file to itself
    assert (dq.write_file_num, dq.write_pos) == (2, 204)
    dq.put(b"d")  # 204 > 0 and 209 > 100: rolls
    assert (dq.write_file_num, dq.write_pos) == (3, 5)
    sizes = [seg(tmp_path, "q", n).stat().st_size for n in range(4)]
    assert sizes == [100, 4, 204, 5]
    assert read_all(dq) == [b"a" * 46, b"b" * 46, b"", b"c" * 200, b"d"]
    assert [f for f in files(tmp_path) if f.endswith(".dat") and "meta" not in f] == [
        "q.diskqueue.000003.dat"
    ]
    dq.close()


def test_put_many_writes_same_bytes_as_put(tmp_path):
    data = [bytes([65 + i % 26]) * (5 + (i * 7) % 40) for i in range(60)]
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    q1 = mk(a, max_bytes_per_file=200)
    for m in data:
        q1.put(m)
    q2 = mk(b, max_bytes_per_file=200)
    q2.put_many(data[:1])
    q2.put_many(data[1:45])
    q2.put_many(data[45:])
    for q in (q1, q2):
        q.sync()
    assert files(a) == files(b)
    for f in files(a):
        assert (a / f).read_bytes() == (b / f).read_bytes(), f
    assert (q2.depth, q2.write_file_num, q2.write_pos) == (
        q1.depth,
        q1.write_file_num,
        q1.write_pos,
    )
    assert read_all(q2) == data
    q1.close()
    q2.close()


def test_put_many_one_write_per_segment(tmp_path, monkeypatch):
    import nsqpy.nsqd.diskqueue as mod

    calls = []
    real = mod._pwrite

    def counting(fd, buf, pos):
        calls.append(len(buf))
        return real(fd, buf, pos)

    monkeypatch.setattr(mod, "_pwrite", counting)
    dq = mk(tmp_path, max_bytes_per_file=1 << 20)
    dq.put_many(msgs(1000, 130))
    assert calls == [1000 * 134]
    calls.clear()
    small = mk(tmp_path, name="small", max_bytes_per_file=134 * 10)
    small.put_many(msgs(25, 130))  # 10 + 10 + 5
    assert calls == [1340, 1340, 670]
    dq.close()
    small.close()


def test_reader_caught_up_at_roll_leaves_no_bad_file(tmp_path):
    # go-diskqueue v1.1.0 (nsqd 1.3.0) renames a fully read segment to .bad when the writer
    # rolls while the reader sits at its end (go-diskqueue #38/#42); we move the reader on
    dq = mk(tmp_path, max_bytes_per_file=10 * 14, min_msg_size=10)
    msg = bytes(10)
    for _ in range(30):
        dq.put(msg)
        assert dq.read(1) == [msg]
        assert dq.depth == 0
    dq.close()
    assert not [f for f in files(tmp_path) if f.endswith(".bad")]
    # metadata never points at the end of a finished file
    assert meta(tmp_path) == "0\n2,140\n2,140\n"
    assert files(tmp_path) == ["q.diskqueue.000002.dat", "q.diskqueue.meta.dat"]


def test_channel_names(tmp_path):
    dq = mk(tmp_path, name="orders:archive")
    dq.put(b"abcd")
    dq.close()
    assert files(tmp_path) == [
        "orders:archive.diskqueue.000000.dat",
        "orders:archive.diskqueue.meta.dat",
    ]
    assert meta(tmp_path, "orders:archive") == "1\n0,0\n0,8\n"


# ---------------------------------------------------------------- metadata and restart


def test_metadata_text_after_known_operations(tmp_path):
    dq = mk(tmp_path, max_bytes_per_file=100, min_msg_size=0)
    assert not (tmp_path / "q.diskqueue.meta.dat").exists()
    dq.sync()
    assert meta(tmp_path) == "0\n0,0\n0,0\n"
    for _ in range(5):
        dq.put(b"x" * 16)  # 20 bytes each: exactly one 100-byte file
    dq.sync()
    assert meta(tmp_path) == "5\n0,0\n0,100\n"
    dq.put(b"y" * 6)
    dq.sync()
    assert meta(tmp_path) == "6\n0,0\n1,10\n"
    dq.read(2)
    dq.sync()
    assert meta(tmp_path) == "4\n0,40\n1,10\n"
    dq.read(3)  # finishes file 0: it is deleted, the reader moves to file 1
    dq.sync()
    assert meta(tmp_path) == "1\n1,0\n1,10\n"
    assert not seg(tmp_path, "q", 0).exists()
    dq.close()
    assert meta(tmp_path) == "1\n1,0\n1,10\n"
    assert not [f for f in files(tmp_path) if f.endswith(".tmp")]


def test_restart_mid_file_resumes_exactly(tmp_path):
    data = msgs(40, 20)
    dq = mk(tmp_path, max_bytes_per_file=240)
    dq.put_many(data)
    assert dq.read(13) == data[:13]
    state = (dq.depth, dq.read_file_num, dq.read_pos, dq.write_file_num, dq.write_pos)
    dq.close()
    assert state == (27, 1, 72, 3, 240)  # 10 records of 24 bytes fill each 240-byte file
    assert meta(tmp_path) == "27\n1,72\n3,240\n"

    dq = mk(tmp_path, max_bytes_per_file=240)
    assert (dq.depth, dq.read_file_num, dq.read_pos, dq.write_file_num, dq.write_pos) == state
    assert not dq.needs_sync()
    assert dq.read(5) == data[13:18]
    dq.put(b"after restart")
    dq.close()

    dq = mk(tmp_path, max_bytes_per_file=240)
    assert dq.depth == 23
    assert read_all(dq, 4) == [*data[18:], b"after restart"]
    dq.close()


# ---------------------------------------------------------------- byte-exact Go layout

# The fixture directories were built by hand from the format facts (see _go_records):
# topic "orders", --max-bytes-per-file=256, six messages whose records are 40, 130, 90, 60,
# 106 and 230 bytes. go-diskqueue v1.1.0 rolls before a write that would pass 256 bytes:
#   000000: rec0 + rec1          = 170 bytes (170 + 90 > 256)
#   000001: rec2 + rec3 + rec4   = 256 bytes (exactly full: the roll comes with rec5)
#   000002: rec5                 = 230 bytes
# orders_written: after the six puts and a sync, meta "6\n0,0\n2,230\n".
# orders_partly_read: after three reads (file 0 consumed and deleted), meta "3\n1,90\n2,230\n".

GO_BODY_LENS = [10, 100, 60, 30, 76, 200]
GO_ATTEMPTS = [0, 0, 1, 0, 2, 0]
GO_OPTS = dict(max_bytes_per_file=256, min_msg_size=26, max_msg_size=1024 * 1024 + 26)


def _go_message(i: int) -> bytes:
    # nsqd's Message.WriteTo: [int64 timestamp ns][uint16 attempts][16-byte hex id][body]
    ts = 1_700_000_000_000_000_000 + i * 1_000_000
    msg_id = b"%016x" % (0x0B5E1A2C3D000000 + i)
    body = (b"msg-%d:" % i + b"abcdefghijklmnopqrstuvwxyz" * 10)[: GO_BODY_LENS[i]]
    return struct.pack(">qH", ts, GO_ATTEMPTS[i]) + msg_id + body


def _go_records() -> list[bytes]:
    return [rec(_go_message(i)) for i in range(6)]


def test_fixture_bytes_are_the_hand_built_layout():
    r = _go_records()
    assert [len(x) for x in r] == [40, 130, 90, 60, 106, 230]
    assert r[0][:4] == b"\x00\x00\x00\x24"  # 36 = 26 + 10
    d = FIXTURES / "orders_written"
    assert (d / "orders.diskqueue.000000.dat").read_bytes() == r[0] + r[1]
    assert (d / "orders.diskqueue.000001.dat").read_bytes() == r[2] + r[3] + r[4]
    assert (d / "orders.diskqueue.000002.dat").read_bytes() == r[5]
    assert (d / "orders.diskqueue.meta.dat").read_bytes() == b"6\n0,0\n2,230\n"
    d = FIXTURES / "orders_partly_read"
    assert files(d) == [
        "orders.diskqueue.000001.dat",
        "orders.diskqueue.000002.dat",
        "orders.diskqueue.meta.dat",
    ]
    assert (d / "orders.diskqueue.meta.dat").read_bytes() == b"3\n1,90\n2,230\n"


@pytest.mark.parametrize("batched", [False, True])
def test_writes_the_go_directory_byte_for_byte(tmp_path, batched):
    dq = DiskQueue("orders", str(tmp_path), sync_every=2500, sync_timeout=2.0, **GO_OPTS)
    messages = [_go_message(i) for i in range(6)]
    if batched:
        dq.put_many(messages)
    else:
        for m in messages:
            dq.put(m)
    dq.sync()
    expected = FIXTURES / "orders_written"
    assert files(tmp_path) == files(expected)
    for f in files(expected):
        assert (tmp_path / f).read_bytes() == (expected / f).read_bytes(), f

    assert dq.read(3) == messages[:3]
    dq.close()
    expected = FIXTURES / "orders_partly_read"
    assert files(tmp_path) == files(expected)
    for f in files(expected):
        assert (tmp_path / f).read_bytes() == (expected / f).read_bytes(), f


@pytest.mark.parametrize(
    ("fixture", "first", "depth"), [("orders_written", 0, 6), ("orders_partly_read", 3, 3)]
)
def test_reads_a_go_directory(tmp_path, fixture, first, depth):
    d = tmp_path / "data"
    shutil.copytree(FIXTURES / fixture, d)
    dq = DiskQueue("orders", str(d), sync_every=2500, sync_timeout=2.0, **GO_OPTS)
    assert not dq.needs_sync()  # consistent metadata: nothing recovered or changed
    assert dq.depth == depth
    got = []
    for _ in range(depth):
        got += dq.read(1)
        assert dq.depth == depth - len(got)
    assert got == [_go_message(i) for i in range(first, 6)]
    assert dq.read(1) == []
    dq.put(_go_message(0))  # appends to file 2 (230 + 40 > 256: rolls to file 3)
    dq.close()
    assert files(d) == ["orders.diskqueue.000003.dat", "orders.diskqueue.meta.dat"]
    assert meta(d, "orders") == "1\n3,0\n3,40\n"


def test_reads_go_directory_after_go_kill9(tmp_path):
    # Go wrote rec0, rec1 (meta synced at the roll as "2\n0,0\n1,0\n"), then rec2 into
    # file 1 and was killed before the next sync: the metadata misses rec2
    r = _go_records()
    (tmp_path / "orders.diskqueue.000000.dat").write_bytes(r[0] + r[1])
    (tmp_path / "orders.diskqueue.000001.dat").write_bytes(r[2])
    (tmp_path / "orders.diskqueue.meta.dat").write_text("2\n0,0\n1,0\n")
    dq = DiskQueue("orders", str(tmp_path), sync_every=2500, sync_timeout=2.0, **GO_OPTS)
    assert dq.depth == 3
    assert (dq.write_file_num, dq.write_pos) == (1, 90)
    assert dq.needs_sync()
    dq.put(_go_message(3))
    assert (dq.write_file_num, dq.write_pos) == (1, 150)
    assert read_all(dq) == [_go_message(i) for i in range(4)]
    dq.close()


# ---------------------------------------------------------------- corruption


def _fill(dq: DiskQueue, n: int, size: int = 120) -> list[bytes]:
    data = [(b"%d:" % i).ljust(size, b"m") for i in range(n)]
    for m in data:
        dq.put(m)
    return data


def test_corruption_like_go(tmp_path, caplog):
    # go-diskqueue TestDiskQueueCorruption: 124-byte records, 8 per 1000-byte file
    caplog.set_level(logging.INFO)
    dq = mk(tmp_path, max_bytes_per_file=1000, min_msg_size=10, sync_every=5)
    data = _fill(dq, 25)
    assert dq.depth == 25
    os.truncate(seg(tmp_path, "q", 1), 400)  # 3 valid records, then a torn one
    assert dq.read(19) == data[0:8] + data[8:11] + data[16:24]
    assert seg(tmp_path, "q", 1).with_suffix(".dat.bad").exists()
    assert "jump to next file and saving bad file" in caplog.text
    assert dq.depth == 1  # exact: only data[24] is left (go-diskqueue would say 6)

    os.truncate(seg(tmp_path, "q", 3), 100)  # the current write file, now unreadable
    assert dq.read(5) == []  # its torn record makes it .bad, writes move on too
    assert seg(tmp_path, "q", 3).with_suffix(".dat.bad").exists()
    assert (dq.read_file_num, dq.write_file_num, dq.depth) == (4, 4, 0)
    dq.put(data[1])
    assert seg(tmp_path, "q", 4).exists()
    assert dq.read(5) == [data[1]]
    assert dq.depth == 0
    dq.close()


def test_bad_length_in_finished_file_skips_to_next(tmp_path):
    dq = mk(tmp_path, max_bytes_per_file=500, min_msg_size=10, max_msg_size=200)
    data = _fill(dq, 12)  # 4 per file: files 0, 1, 2
    with open(seg(tmp_path, "q", 1), "r+b") as f:
        f.seek(124)  # the header of the 2nd record of file 1
        f.write(b"\xff\xff\xff\xff")  # -1
    assert read_all(dq) == data[:5] + data[8:]
    assert files(tmp_path) == ["q.diskqueue.000001.dat.bad", "q.diskqueue.000002.dat"]
    assert dq.depth == 0
    dq.close()


def test_too_long_length_and_garbage(tmp_path):
    dq = mk(tmp_path, max_bytes_per_file=500, min_msg_size=10, max_msg_size=200)
    data = _fill(dq, 12)
    with open(seg(tmp_path, "q", 0), "r+b") as f:
        f.seek(0)
        f.write(struct.pack(">i", 201))  # just past max_msg_size
    with open(seg(tmp_path, "q", 2), "r+b") as f:
        f.seek(248)
        f.write(b"\x7f" * 60)  # garbage over the 3rd record of file 2
    got = read_all(dq)
    assert got[:4] == data[4:8]  # file 0 lost entirely, file 1 whole
    assert got[4:6] == data[8:10]  # file 2 up to the garbage
    assert dq.depth == 0
    assert {f for f in files(tmp_path) if f.endswith(".bad")} == {
        "q.diskqueue.000000.dat.bad",
        "q.diskqueue.000002.dat.bad",
    }
    dq.put(b"x" * 10)  # the write file (2) went bad: writing continues in file 3
    assert dq.write_file_num == 3
    assert dq.read(10) == [b"x" * 10]
    dq.close()


def test_depth_is_recounted_after_skipping_a_bad_file(tmp_path):
    dq = mk(tmp_path, max_bytes_per_file=500, min_msg_size=10, max_msg_size=200)
    data = _fill(dq, 12)
    os.truncate(seg(tmp_path, "q", 0), 130)  # 1 whole record + 6 bytes
    assert dq.read(1) == [data[0]]
    assert dq.depth == 11  # not yet known
    assert dq.read(1) == [data[4]]  # hits the torn record, skips to file 1
    assert dq.depth == 7  # recounted from the files left
    dq.close()
    dq = mk(tmp_path, max_bytes_per_file=500, min_msg_size=10, max_msg_size=200)
    assert dq.depth == 7
    assert read_all(dq) == data[5:]
    dq.close()


def test_missing_segment_is_skipped(tmp_path):
    dq = mk(tmp_path, max_bytes_per_file=500, min_msg_size=10, max_msg_size=200)
    data = _fill(dq, 12)
    os.remove(seg(tmp_path, "q", 1))
    assert read_all(dq) == data[:4] + data[8:]
    assert dq.depth == 0
    dq.close()


# ---------------------------------------------------------------- sync policy


@pytest.fixture
def fsyncs(monkeypatch):
    """Record the path of every fsync'd descriptor."""
    seen: list[str] = []
    real = os.fsync

    def fsync(fd):
        seen.append(os.readlink("/proc/self/fd/%d" % fd))
        return real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return seen


def test_needs_sync_after_sync_every_ops(tmp_path, fsyncs):
    dq = mk(tmp_path, sync_every=10, sync_timeout=1000.0)
    assert not dq.needs_sync()
    for _ in range(9):
        dq.put(b"abcd")
    assert not dq.needs_sync()
    dq.put(b"abcd")
    assert dq.needs_sync()
    job = dq.prepare_sync()
    assert not dq.needs_sync()
    assert fsyncs == []  # prepare is cheap: nothing blocking yet
    job.run()
    assert real(seg(tmp_path, "q", 0)) in fsyncs
    assert any(p.endswith(".tmp") and "q.diskqueue.meta.dat." in p for p in fsyncs)
    assert real(tmp_path) in fsyncs  # the directory, after the rename
    assert meta(tmp_path) == "10\n0,0\n0,80\n"
    # reads count too (as in go-diskqueue)
    dq.read(9)
    assert not dq.needs_sync()
    dq.read(1)
    assert dq.needs_sync()
    dq.close()


def test_needs_sync_after_timeout_only_with_activity(tmp_path):
    dq = mk(tmp_path, sync_every=1000, sync_timeout=2.0)
    dq.sync()
    t0 = dq._last_sync
    assert not dq.needs_sync(now=t0 + 100)  # idle: never
    dq.put(b"abcd")
    assert not dq.needs_sync(now=t0 + 1.9)
    assert dq.needs_sync(now=t0 + 2.0)
    dq.close()


def test_sync_every_one(tmp_path, fsyncs):
    dq = mk(tmp_path, sync_every=1)
    dq.put(b"abcd")
    assert dq.needs_sync()
    dq.sync()
    assert fsyncs.count(real(seg(tmp_path, "q", 0))) == 1
    assert meta(tmp_path) == "1\n0,0\n0,8\n"
    dq.close()


def test_roll_requests_sync_and_fsyncs_the_retired_segment(tmp_path, fsyncs):
    dq = mk(tmp_path, max_bytes_per_file=100, min_msg_size=0, sync_every=2500)
    dq.put(b"x" * 90)  # 94 bytes
    dq.sync()
    fsyncs.clear()
    dq.put(b"y" * 4)  # 94 + 8 > 100: rolls to file 1 first
    assert (dq.write_file_num, dq.write_pos) == (1, 8)
    assert dq.needs_sync()
    dq.put(b"z" * 10)  # 22
    dq.put(b"w" * 80)  # 22 + 84 > 100: rolls again, file 1 is retired
    assert (dq.write_file_num, dq.write_pos) == (2, 84)
    dq.sync()
    assert real(seg(tmp_path, "q", 0)) not in fsyncs  # synced before the roll already
    assert real(seg(tmp_path, "q", 1)) in fsyncs
    assert real(seg(tmp_path, "q", 2)) in fsyncs
    # segments were created since the last round: the directory is synced before the
    # metadata rename too, then after it
    assert fsyncs.count(real(tmp_path)) == 2
    assert meta(tmp_path) == "4\n0,0\n2,84\n"
    dq.close()


def test_sync_job_runs_in_a_thread_while_the_loop_writes(tmp_path):
    dq = mk(tmp_path, max_bytes_per_file=2000, min_msg_size=0, sync_every=50)
    expected: deque[bytes] = deque()
    stop = threading.Event()
    errors: list[BaseException] = []
    jobs: list = []
    lock = threading.Lock()

    def worker():
        while not stop.is_set() or jobs:
            with lock:
                job = jobs.pop(0) if jobs else None
            if job is None:
                stop.wait(0.001)
                continue
            try:
                job.run()
            except BaseException as e:  # pragma: no cover - reported below
                errors.append(e)

    t = threading.Thread(target=worker)
    t.start()
    try:
        for i in range(3000):
            m = b"%d" % i
            dq.put(m)
            expected.append(m)
            if i % 3 == 0:
                for got in dq.read(2):
                    assert got == expected.popleft()
            if dq.needs_sync():
                with lock:
                    jobs.append(dq.prepare_sync())
    finally:
        stop.set()
        t.join(timeout=30)
    assert not errors
    dq.close()
    dq = mk(tmp_path, max_bytes_per_file=2000, min_msg_size=0)
    assert dq.depth == len(expected)
    assert read_all(dq) == list(expected)
    dq.close()


def test_an_older_job_never_overwrites_newer_metadata(tmp_path):
    dq = mk(tmp_path)
    dq.put(b"abcd")
    old = dq.prepare_sync()
    dq.put(b"efgh")
    new = dq.prepare_sync()
    new.run()
    old.run()
    assert meta(tmp_path) == "2\n0,0\n0,16\n"
    old.run()  # a job runs once; again is a no-op
    dq.close()
    assert not [f for f in files(tmp_path) if f.endswith(".tmp")]


# ---------------------------------------------------------------- empty, delete


def test_empty(tmp_path):
    dq = mk(tmp_path, max_bytes_per_file=100, min_msg_size=0)
    data = msgs(30)
    dq.put_many(data)
    assert dq.read(3) == data[:3]
    dq.sync()
    wfn = dq.write_file_num
    pending = dq.prepare_sync()  # prepared before empty(): must not resurrect the metadata
    dq.empty()
    pending.run()
    assert dq.depth == 0
    # no segment is left, and the metadata names the next one (written before the segments
    # went: a crash meanwhile cannot bring them back)
    assert [f for f in files(tmp_path) if f.startswith("q.diskqueue.")] == ["q.diskqueue.meta.dat"]
    assert meta(tmp_path) == "0\n%d,0\n%d,0\n" % (wfn + 1, wfn + 1)
    assert (dq.read_file_num, dq.read_pos, dq.write_file_num, dq.write_pos) == (
        wfn + 1,
        0,
        wfn + 1,
        0,
    )
    assert dq.read(10) == []
    dq.put_many(data)
    assert dq.depth == 30
    assert read_all(dq, 7) == data
    dq.close()
    # 14-byte records, 7 per 100-byte file: files wfn+1 .. wfn+5, 2 records in the last
    assert meta(tmp_path) == "0\n%d,28\n%d,28\n" % (wfn + 5, wfn + 5)


def test_delete_removes_every_file(tmp_path):
    other = mk(tmp_path, name="q:c")
    other.put(b"keep")
    other.sync()
    dq = mk(tmp_path, max_bytes_per_file=100, min_msg_size=0)
    dq.put_many(msgs(30))
    dq.sync()
    dq.put(b"more")
    dq.delete()
    assert files(tmp_path) == ["q:c.diskqueue.000000.dat", "q:c.diskqueue.meta.dat"]
    with pytest.raises(DiskQueueClosedError):
        dq.put(b"abcd")
    other.close()


# ---------------------------------------------------------------- crash recovery


def crash_copy(src: Path, dst: Path) -> Path:
    """What a kill -9 leaves: the files as they are now (writes go straight to the OS)."""
    shutil.copytree(src, dst)
    return dst


def test_crash_recovers_records_past_stale_metadata_and_drops_torn_tail(tmp_path):
    live = tmp_path / "live"
    live.mkdir()
    dq = mk(live, max_bytes_per_file=1 << 20)
    data = msgs(8, 20)
    dq.put_many(data[:5])
    dq.sync()  # metadata: 5 records, writePos 120
    for m in data[5:]:
        dq.put(m)  # 3 more, metadata not updated
    crashed = crash_copy(live, tmp_path / "crashed")
    assert meta(crashed) == "5\n0,0\n0,120\n"
    os.truncate(seg(crashed, "q", 0), 8 * 24 - 7)  # the last record is torn

    dq2 = mk(crashed, max_bytes_per_file=1 << 20)
    assert dq2.depth == 7
    assert (dq2.write_file_num, dq2.write_pos) == (0, 7 * 24)
    assert seg(crashed, "q", 0).stat().st_size == 7 * 24  # torn record truncated
    assert dq2.needs_sync()
    dq2.put(b"after crash")  # lands right after the last whole record
    assert read_all(dq2, 3) == [*data[:7], b"after crash"]
    dq2.close()
    dq.close()


def test_crash_recovers_segments_started_after_the_metadata(tmp_path):
    live = tmp_path / "live"
    live.mkdir()
    dq = mk(live, max_bytes_per_file=100, min_msg_size=0)
    data = msgs(20, 16)  # 20-byte records, 5 per file
    dq.put_many(data[:3])
    assert dq.read(1) == data[:1]
    dq.sync()  # "2\n0,20\n0,60\n"
    dq.put_many(data[3:])  # rolls into files 1, 2, 3; metadata not updated
    assert dq.read(2) == data[1:3]
    crashed = crash_copy(live, tmp_path / "crashed")
    assert meta(crashed) == "2\n0,20\n0,60\n"
    with open(seg(crashed, "q", 3), "ab") as f:
        f.write(b"\x00\x00\x00\x10abc")  # a torn append at the end

    dq2 = mk(crashed, max_bytes_per_file=100, min_msg_size=0)
    assert (dq2.read_file_num, dq2.read_pos) == (0, 20)  # reads since the sync come again
    assert (dq2.write_file_num, dq2.write_pos) == (3, 100)
    assert dq2.depth == 19
    assert seg(crashed, "q", 3).stat().st_size == 100
    dq2.put(b"z" * 16)
    assert dq2.write_file_num == 4
    assert read_all(dq2) == [*data[1:], b"z" * 16]
    dq2.close()
    dq.close()


def test_crash_after_reader_deleted_a_segment(tmp_path):
    live = tmp_path / "live"
    live.mkdir()
    dq = mk(live, max_bytes_per_file=100, min_msg_size=0)
    data = msgs(15, 16)  # files 0, 1, 2
    dq.put_many(data)
    assert dq.read(2) == data[:2]
    dq.sync()  # "13\n0,40\n2,100\n"
    assert dq.read(6) == data[2:8]  # file 0 consumed and deleted, reader in file 1
    crashed = crash_copy(live, tmp_path / "crashed")
    assert not seg(crashed, "q", 0).exists()

    dq2 = mk(crashed, max_bytes_per_file=100, min_msg_size=0)
    assert (dq2.read_file_num, dq2.read_pos) == (1, 0)
    assert dq2.depth == 10  # recounted: files 1 and 2
    assert read_all(dq2) == data[5:]
    dq2.close()
    dq.close()


def test_crash_with_zero_filled_tail(tmp_path):
    # a filesystem may leave zeros where unsynced appends were after a power cut
    dq = mk(tmp_path, max_bytes_per_file=1 << 20, min_msg_size=4)
    data = msgs(4, 12)
    dq.put_many(data)
    dq.sync()
    dq.close()
    with open(seg(tmp_path, "q", 0), "ab") as f:
        f.write(bytes(4096))
    dq = mk(tmp_path, max_bytes_per_file=1 << 20, min_msg_size=4)
    assert dq.depth == 4
    assert seg(tmp_path, "q", 0).stat().st_size == 64
    assert read_all(dq) == data
    dq.close()


def test_missing_metadata_recovers_from_segments(tmp_path):
    live = tmp_path / "live"
    live.mkdir()
    dq = mk(live, max_bytes_per_file=100, min_msg_size=0)
    data = msgs(12, 16)  # files 0, 1, 2 (2 records in the last)
    dq.put_many(data)  # never synced: no metadata at all
    crashed = crash_copy(live, tmp_path / "crashed")
    assert not (crashed / "q.diskqueue.meta.dat").exists()
    with open(seg(crashed, "q", 2), "ab") as f:
        f.write(b"\x00\x00")  # a torn length

    dq2 = mk(crashed, max_bytes_per_file=100, min_msg_size=0)
    assert (dq2.read_file_num, dq2.read_pos, dq2.write_file_num, dq2.write_pos) == (0, 0, 2, 40)
    assert dq2.depth == 12
    dq2.put(b"next")
    assert read_all(dq2) == [*data, b"next"]
    dq2.close()
    dq.close()


def test_shorter_write_file_than_metadata(tmp_path):
    dq = mk(tmp_path, max_bytes_per_file=1 << 20)
    data = msgs(6, 20)
    dq.put_many(data)
    dq.close()
    os.truncate(seg(tmp_path, "q", 0), 3 * 24 + 10)  # lost bytes the metadata counted
    dq = mk(tmp_path, max_bytes_per_file=1 << 20)
    assert (dq.depth, dq.write_pos) == (3, 72)
    dq.put(b"again")
    assert read_all(dq) == [*data[:3], b"again"]
    dq.close()


def test_unparseable_metadata_recovers_from_segments(tmp_path):
    dq = mk(tmp_path)
    dq.put_many(msgs(3))
    dq.close()
    (tmp_path / "q.diskqueue.meta.dat").write_text("garbage")
    dq = mk(tmp_path)
    assert dq.depth == 3
    assert read_all(dq) == msgs(3)
    dq.close()


# ---------------------------------------------------------------- model test

op = st.one_of(
    st.tuples(st.just("put"), st.binary(min_size=0, max_size=60)),
    st.tuples(st.just("put_many"), st.lists(st.binary(min_size=0, max_size=60), max_size=12)),
    st.tuples(st.just("read"), st.integers(min_value=0, max_value=15)),
    st.tuples(st.just("read_into"), st.integers(min_value=0, max_value=15)),
    st.tuples(st.just("read_into_fails"), st.integers(min_value=0, max_value=15)),
    st.tuples(st.just("reopen"), st.none()),
    st.tuples(st.just("sync"), st.none()),
    st.tuples(st.just("empty"), st.none()),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(op, max_size=40), max_bytes=st.integers(min_value=4, max_value=300))
def test_model(ops, max_bytes):
    with tempfile.TemporaryDirectory() as d:

        def open_q():
            return mk(d, max_bytes_per_file=max_bytes, min_msg_size=0, max_msg_size=60)

        dq = open_q()
        model: deque[bytes] = deque()
        for name, arg in ops:
            if name == "put":
                dq.put(arg)
                model.append(arg)
            elif name == "put_many":
                dq.put_many(arg)
                model.extend(arg)
            elif name == "read":
                got = dq.read(arg)
                assert got == [model.popleft() for _ in range(min(arg, len(model)))]
            elif name in ("read_into", "read_into_fails"):
                seen: list[bytes] = []

                def sink(records, fail=name == "read_into_fails", seen=seen):
                    seen.extend(records)
                    if fail:
                        raise OSError("the sink failed")

                if name == "read_into" or not (arg and model):
                    n = dq.read_into(arg, sink)
                    assert n == len(seen)
                else:
                    with pytest.raises(OSError):
                        dq.read_into(arg, sink)
                # a prefix of the queue (never past its segment), at least one record
                assert seen == list(model)[: len(seen)]
                assert bool(seen) == bool(arg and model)
                if name == "read_into":
                    for _ in seen:
                        model.popleft()
            elif name == "reopen":
                state = (dq.depth, dq.read_file_num, dq.read_pos, dq.write_file_num, dq.write_pos)
                dq.close()
                dq = open_q()
                assert (dq.depth, dq.read_file_num, dq.read_pos, dq.write_file_num, dq.write_pos) == state
            elif name == "sync":
                dq.sync()
            elif name == "empty":
                dq.empty()
                model.clear()
            assert dq.depth == len(model)
            names = os.listdir(d)
            assert not [f for f in names if f.endswith(".bad")]
            for f in names:  # consumed segments are gone
                if f.endswith(".dat") and "meta" not in f:
                    assert dq.read_file_num <= int(f.split(".")[-2]) <= dq.write_file_num
        assert read_all(dq, 7) == list(model)
        dq.close()


crash_op = st.one_of(
    st.tuples(st.just("put"), st.binary(min_size=4, max_size=60)),
    st.tuples(st.just("put_many"), st.lists(st.binary(min_size=4, max_size=60), max_size=12)),
    st.tuples(st.just("read_sync"), st.integers(min_value=0, max_value=15)),
    st.tuples(st.just("crash"), st.sampled_from([None, b"\x00", b"\x00\x00\x00\x20abc"])),
)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(crash_op, max_size=30), max_bytes=st.integers(min_value=8, max_value=300))
def test_model_kill9(ops, max_bytes):
    """kill -9 anywhere (reads are synced, writes are not): every written record survives,
    a torn append is dropped, and writing resumes after the last whole record."""
    with tempfile.TemporaryDirectory() as root:
        gen = 0
        d = os.path.join(root, "0")
        os.mkdir(d)

        def open_q(path):
            return mk(path, max_bytes_per_file=max_bytes, min_msg_size=4, max_msg_size=60)

        dq = open_q(d)
        model: deque[bytes] = deque()
        for name, arg in ops:
            if name == "put":
                dq.put(arg)
                model.append(arg)
            elif name == "put_many":
                dq.put_many(arg)
                model.extend(arg)
            elif name == "read_sync":
                got = dq.read(arg)
                assert got == [model.popleft() for _ in range(min(arg, len(model)))]
                dq.sync()
            else:
                gen += 1
                new = os.path.join(root, str(gen))
                shutil.copytree(d, new)  # the files as a kill -9 leaves them
                last = seg(new, "q", dq.write_file_num)
                if arg is not None and last.exists():
                    with open(last, "ab") as f:
                        f.write(arg)
                dq.delete()
                d = new
                dq = open_q(d)
            assert dq.depth == len(model)
        assert read_all(dq, 5) == list(model)
        dq.put(b"tail")
        assert dq.read(1) == [b"tail"]
        dq.close()
