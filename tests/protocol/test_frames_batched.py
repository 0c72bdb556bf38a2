"""FrameReader.feed_batched: the client's bulk decoder gives what feed() gives, grouped."""

import random
import struct

import pytest

from nsqpy.protocol import frames


def _msg(i: int, body: bytes) -> bytes:
    return frames.encode_message_frame(1_700_000_000_000_000_000 + i, i % 7 + 1, b"%016x" % i, body)


STREAM = (
    _msg(1, b"a")
    + _msg(2, b"b" * 300)
    + frames.OK_FRAME
    + _msg(3, b"")  # an empty body still decodes
    + frames.encode_error(b"E_FIN_FAILED x")
    + frames.HEARTBEAT_FRAME
    + _msg(4, b"d" * 70000)
    + _msg(5, b"e")
)


def _flat(items: list) -> list:
    out = []
    for it in items:
        if isinstance(it, list):
            out += [(frames.FRAME_TYPE_MESSAGE, m) for m in it]
        else:
            out.append(it)
    return out


def _expected() -> list:
    out = []
    for ftype, data in frames.FrameReader().feed(STREAM):
        if ftype == frames.FRAME_TYPE_MESSAGE:
            d = frames.decode_message(data)
            out.append((ftype, (d.id, d.body, d.timestamp, d.attempts)))
        else:
            out.append((ftype, data))
    return out


def test_runs_of_messages_and_other_frames_in_order() -> None:
    items = frames.FrameReader().feed_batched(STREAM, lambda *f: f)
    assert [type(i).__name__ for i in items] == ["list", "tuple", "list", "tuple", "tuple", "list"]
    assert [len(i) for i in items if isinstance(i, list)] == [2, 1, 2]
    assert _flat(items) == _expected()


@pytest.mark.parametrize("seed", range(5))
def test_any_split_gives_the_same_frames(seed: int) -> None:
    rng = random.Random(seed)
    reader = frames.FrameReader()
    got: list = []
    pos = 0
    while pos < len(STREAM):
        n = rng.choice([1, 2, 7, 33, 500, 4096, 65536])
        got += reader.feed_batched(STREAM[pos : pos + n], lambda *f: f)
        pos += n
    assert _flat(got) == _expected()


def test_byte_by_byte() -> None:
    reader = frames.FrameReader()
    got: list = []
    for i in range(len(STREAM)):
        got += reader.feed_batched(STREAM[i : i + 1], lambda *f: f)
    assert _flat(got) == _expected()


def test_mixing_feed_and_feed_batched() -> None:
    reader = frames.FrameReader()
    first = reader.feed(STREAM[:150])
    rest = reader.feed_batched(STREAM[150:], lambda *f: f)
    assert len(first) + len(_flat(rest)) == len(_expected())


def test_bad_sizes_are_rejected() -> None:
    with pytest.raises(ValueError):
        frames.FrameReader().feed_batched(struct.pack(">Ii", 2, 0), lambda *f: f)
    with pytest.raises(ValueError):
        frames.FrameReader(max_frame_size=1000).feed_batched(struct.pack(">Ii", 1001, 0), lambda *f: f)
    short_message = struct.pack(">Ii", 10, frames.FRAME_TYPE_MESSAGE) + b"x" * 6
    with pytest.raises(ValueError):
        frames.FrameReader().feed_batched(short_message, lambda *f: f)
