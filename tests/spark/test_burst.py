"""The source's frame decoder (nsqd stream → Arrow columns) against the protocol's own
FrameReader, over streams cut at every kind of boundary."""

from __future__ import annotations

import random
import struct

import pyarrow as pa
import pytest
from support import load_hot

from nsqpy.protocol.frames import FRAME_TYPE_ERROR, FRAME_TYPE_MESSAGE, FRAME_TYPE_RESPONSE, FrameReader
from nsqpy.spark import burst as burst_mod
from nsqpy.spark.burst import Burst, BurstReader, fin_command, scan_frames_py

hot = load_hot()


def _message(i: int, body: bytes) -> bytes:
    payload = struct.pack(">qH", 1_700_000_000_123_456_789 + i * 1000, i % 7 + 1) + b"%016x" % i + body
    return struct.pack(">Ii", len(payload) + 4, FRAME_TYPE_MESSAGE) + payload


def _frame(ftype: int, data: bytes) -> bytes:
    return struct.pack(">Ii", len(data) + 4, ftype) + data


def _stream(rng: random.Random, n: int) -> bytes:
    out = []
    for i in range(n):
        out.append(_message(i, bytes(rng.randrange(256) for _ in range(rng.choice((0, 1, 5, 100, 3000))))))
        if rng.random() < 0.05:
            out.append(_frame(FRAME_TYPE_RESPONSE, b"_heartbeat_"))
        if rng.random() < 0.02:
            out.append(_frame(FRAME_TYPE_ERROR, b"E_FIN_FAILED FIN 0000 failed"))
    return b"".join(out)


@pytest.mark.parametrize("scan", ["compiled", "pure"])
@pytest.mark.parametrize("seed", range(6))
def test_columns_match_the_frame_reader(seed: int, scan: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(burst_mod, "scan_frames", hot.scan_frames if scan == "compiled" else scan_frames_py)
    rng = random.Random(seed)
    data = _stream(rng, 400)
    # the reference: every frame decoded by the protocol's reader
    want_msgs, want_others = [], []
    for ftype, payload in FrameReader().feed(data):
        if ftype == FRAME_TYPE_MESSAGE:
            ts, attempts = struct.unpack_from(">qH", payload)
            want_msgs.append((payload[10:26].decode(), ts // 1000, attempts, payload[26:]))
        else:
            want_others.append((ftype, payload))
    # the stream in random pieces: 1 byte, inside headers, whole runs
    reader, burst, others = BurstReader(), Burst(), []
    pos = 0
    while pos < len(data):
        step = rng.choice((1, 3, 7, 17, 29, 300, 5000, 100_000))
        others += reader.feed(data[pos : pos + step], burst)
        pos += step
    assert others == want_others
    assert len(burst) == len(want_msgs) == 400
    ids, ts, attempts, bodies = burst.columns()
    assert ids.type == pa.string() and bodies.type == pa.binary()
    assert ts.type == pa.timestamp("us", tz="UTC") and attempts.type == pa.int32()
    got = list(
        zip(
            ids.to_pylist(),
            ts.cast(pa.int64()).to_pylist(),
            attempts.to_pylist(),
            bodies.to_pylist(),
            strict=True,
        )
    )
    assert got == want_msgs
    # the FIN command of every message, and how many were delivered before
    assert burst.fins() == b"".join(b"FIN %s\n" % m[0].encode() for m in want_msgs)
    assert burst.again == sum(m[2] > 1 for m in want_msgs) > 0


@pytest.mark.parametrize("seed", range(20))
def test_compiled_scan_matches_the_reference(seed: int) -> None:
    """The same runs, timestamps, attempts, other frames and stopping point from any cut of
    a stream; None from the compiled scan exactly where the reference raises."""
    rng = random.Random(seed)
    data = _stream(rng, 60)
    for _ in range(30):
        a = rng.randrange(len(data))
        piece = data[a : a + rng.choice((5, 40, 500, 5000, len(data)))]
        max_size = rng.choice((100, 1000, 64 * 1024 * 1024))
        try:
            want = scan_frames_py(piece, max_size)
        except ValueError:
            assert hot.scan_frames(piece, max_size) is None
        else:
            assert hot.scan_frames(piece, max_size) == want
    frame = _message(1, b"x" * 10)
    for bad in (
        struct.pack(">Ii", 3, FRAME_TYPE_MESSAGE),  # below the least frame size
        struct.pack(">Ii", 2**31 + 5, FRAME_TYPE_MESSAGE),  # an int32 that reads negative
        _frame(FRAME_TYPE_MESSAGE, b"short"),  # a message frame shorter than its header
    ):
        with pytest.raises(ValueError):
            scan_frames_py(frame + bad, 1 << 20)
        assert hot.scan_frames(frame + bad, 1 << 20) is None


def test_bad_sizes_raise() -> None:
    with pytest.raises(ValueError, match="invalid frame size"):
        BurstReader().feed(struct.pack(">Ii", 2, FRAME_TYPE_MESSAGE) + b"xxxxxxxx", Burst())
    with pytest.raises(ValueError, match="invalid message buffer size"):
        BurstReader().feed(_frame(FRAME_TYPE_MESSAGE, b"short"), Burst())
    with pytest.raises(ValueError, match="invalid frame size"):
        BurstReader(FrameReader(max_frame_size=100)).feed(_message(1, b"x" * 200), Burst())


def test_fin_command_of_a_slice() -> None:
    ids = pa.array([f"{i:016x}" for i in range(10)], pa.string())
    assert fin_command(ids) == b"".join(b"FIN %016x\n" % i for i in range(10))
    assert fin_command(ids.slice(3, 4)) == b"".join(b"FIN %016x\n" % i for i in range(3, 7))


def test_takes_over_a_connection_readers_partial_frame() -> None:
    data = _frame(FRAME_TYPE_RESPONSE, b"OK") + _message(1, b"body-1") + _message(2, b"body-2")
    cut = len(_frame(FRAME_TYPE_RESPONSE, b"OK")) + 11  # inside the first message's header
    conn_reader = FrameReader()
    assert conn_reader.feed(data[:cut]) == [(FRAME_TYPE_RESPONSE, b"OK")]
    burst = Burst()
    assert BurstReader(conn_reader).feed(data[cut:], burst) == []
    ids, _, _, bodies = burst.columns()
    assert ids.to_pylist() == ["%016x" % 1, "%016x" % 2] and bodies.to_pylist() == [b"body-1", b"body-2"]
