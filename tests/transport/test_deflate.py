"""DeflateLayer: raw deflate with a sync flush per encode, interoperable with zlib raw streams."""

from __future__ import annotations

import random
import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nsqpy.transport import DeflateLayer, TransportError
from transport.pairs import random_pieces, split

SYNC_MARKER = b"\x00\x00\xff\xff"


@pytest.mark.parametrize("level", [1, 6, 9])
@settings(max_examples=60, deadline=None)
@given(
    payloads=st.lists(
        st.binary(max_size=3000) | st.sampled_from([b"x" * 70_000, b"msg " * 20_000]), max_size=8
    ),
    data=st.data(),
)
def test_round_trip_any_fragmentation(level, payloads, data):
    sender, receiver = DeflateLayer(level), DeflateLayer(level)
    wire = b"".join(sender.encode(p) for p in payloads)
    cuts = data.draw(st.lists(st.integers(0, max(len(wire), 1)), max_size=40))
    assert b"".join(receiver.decode(piece) for piece in split(wire, cuts)) == b"".join(payloads)


@pytest.mark.parametrize("level", [1, 6, 9])
def test_each_encode_is_a_flush_point(level):
    """The peer decodes every batch completely as soon as it arrives (Go's Flush)."""
    sender, receiver = DeflateLayer(level), DeflateLayer(level)
    rng = random.Random(level)
    for n in (1, 100, 5000, 70_000):
        batch = rng.randbytes(n // 2) + b"a" * (n - n // 2)
        wire = sender.encode(batch)
        assert wire.endswith(SYNC_MARKER)
        assert receiver.decode(wire) == batch
    assert sender.encode(b"") == b""  # no empty flush blocks for nothing


def test_many_small_writes_and_large_payload():
    rng = random.Random(5)
    sender, receiver = DeflateLayer(6), DeflateLayer(6)
    frames = [rng.randbytes(rng.randint(1, 40)) for _ in range(3000)] + [b"big" * 100_000]
    wire = b"".join(sender.encode(f) for f in frames)
    pieces = random_pieces(wire, rng, 500)
    assert b"".join(receiver.decode(p) for p in pieces) == b"".join(frames)


def test_one_byte_at_a_time():
    payload = random.Random(1).randbytes(20_000) + b"nsq" * 10_000
    wire = DeflateLayer(9).encode(payload)
    receiver = DeflateLayer(9)
    assert b"".join(receiver.decode(wire[i : i + 1]) for i in range(len(wire))) == payload


@pytest.mark.parametrize("flush", [zlib.Z_SYNC_FLUSH, zlib.Z_FULL_FLUSH, zlib.Z_FINISH])
def test_decodes_zlib_raw_streams(flush):
    compressor = zlib.compressobj(7, zlib.DEFLATED, -15)
    payloads = [b"PUB topic\n", random.Random(2).randbytes(9000), b"FIN 0123456789abcdef\n" * 500]
    wire = b"".join(compressor.compress(p) + compressor.flush(zlib.Z_SYNC_FLUSH) for p in payloads[:-1])
    wire += compressor.compress(payloads[-1]) + compressor.flush(flush)
    assert DeflateLayer().decode(wire) == b"".join(payloads)


def test_zlib_decodes_layer_output():
    sender = DeflateLayer(6)
    decompressor = zlib.decompressobj(-15)
    for batch in (b"OK", b"\x00\x00\x00\x06\x00\x00\x00\x00OK" * 1000, random.Random(4).randbytes(100_000)):
        assert decompressor.decompress(sender.encode(batch)) == batch


def test_garbage_raises():
    with pytest.raises(TransportError, match=r"^flate: corrupt input \(invalid block type\)$"):
        DeflateLayer().decode(b"\xff\xff\xff garbage after the upgrade")


def test_data_after_the_final_block_raises():
    compressor = zlib.compressobj(6, zlib.DEFLATED, -15)
    wire = compressor.compress(b"last words") + compressor.flush(zlib.Z_FINISH)
    layer = DeflateLayer()
    assert layer.decode(wire) == b"last words"
    with pytest.raises(TransportError, match=r"^flate: data after the end of the stream$"):
        layer.decode(b"more")


@pytest.mark.parametrize("level", [-1, 10])
def test_invalid_level(level):
    with pytest.raises(ValueError):
        DeflateLayer(level)
