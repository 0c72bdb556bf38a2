"""SnappyLayer: the snappy framing format, checked against the spec and python-snappy."""

from __future__ import annotations

import os
import random
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("cramjam")

import cramjam

from nsqpy.transport import SnappyLayer, TransportError
from nsqpy.transport.snappy import MAX_CHUNK_LEN, STREAM_IDENTIFIER
from transport.pairs import random_pieces, split


def crc32c(data: bytes) -> int:
    """Reference CRC-32C (Castagnoli), bit by bit: an independent check of cramjam's."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 & -(crc & 1))
    return crc ^ 0xFFFFFFFF


def masked_crc(data: bytes) -> int:
    """The framing format's masked checksum: rotate right by 15, add 0xa282ead8."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def chunk(kind: int, payload: bytes) -> bytes:
    return bytes([kind]) + len(payload).to_bytes(3, "little") + payload


def uncompressed_chunk(data: bytes, crc: int | None = None) -> bytes:
    return chunk(0x01, struct.pack("<I", masked_crc(data) if crc is None else crc) + data)


def parse_chunks(stream: bytes) -> list[tuple[int, bytes]]:
    chunks = []
    pos = 0
    while pos < len(stream):
        kind = stream[pos]
        length = int.from_bytes(stream[pos + 1 : pos + 4], "little")
        chunks.append((kind, stream[pos + 4 : pos + 4 + length]))
        pos += 4 + length
    assert pos == len(stream)
    return chunks


def decode_pieces(layer: SnappyLayer, pieces: list[bytes]) -> bytes:
    return b"".join(layer.decode(p) for p in pieces)


def test_reference_crc32c():
    assert crc32c(b"123456789") == 0xE3069283  # the standard check value


def test_stream_identifier_once_then_chunks():
    layer = SnappyLayer()
    assert layer.encode(b"") == b""  # nothing to flush, no identifier yet
    first = layer.encode(b"hello, hello, hello, hello")
    second = layer.encode(b"world, world, world, world")
    assert first.startswith(STREAM_IDENTIFIER)
    assert not second.startswith(STREAM_IDENTIFIER)
    assert STREAM_IDENTIFIER not in second
    assert parse_chunks(first)[0] == (0xFF, b"sNaPpY")
    peer = SnappyLayer()
    assert peer.decode(first) == b"hello, hello, hello, hello"
    assert peer.decode(second) == b"world, world, world, world"


def test_encoder_output_follows_the_spec():
    """Every data chunk holds <= 64 KiB with the masked CRC-32C of its uncompressed data."""
    layer = SnappyLayer()
    payload = os.urandom(100_000) + b"compressible " * 20_000 + os.urandom(10)
    stream = layer.encode(payload) + layer.encode(b"tail" * 50)
    chunks = parse_chunks(stream)
    assert chunks[0] == (0xFF, b"sNaPpY")
    assert [kind for kind, _ in chunks[1:]].count(0xFF) == 0
    decoded = b""
    kinds = set()
    for kind, body in chunks[1:]:
        kinds.add(kind)
        assert kind in (0x00, 0x01)
        assert len(body) <= MAX_CHUNK_LEN
        crc, data = struct.unpack("<I", body[:4])[0], body[4:]
        plain = data if kind == 0x01 else bytes(cramjam.snappy.decompress_raw(data))
        assert len(plain) <= 65536
        assert crc == masked_crc(plain)
        decoded += plain
    assert kinds == {0x00, 0x01}  # random data goes uncompressed, text compressed
    assert decoded == payload + b"tail" * 50
    assert len(chunks) >= 1 + 4  # > 64 KiB is split


def test_hand_built_stream_uncompressed_padding_skippable():
    stream = (
        STREAM_IDENTIFIER
        + uncompressed_chunk(b"plain ")
        + chunk(0xFE, b"\x00" * 7)  # padding
        + chunk(0x80, b"skip me")  # reserved skippable
        + chunk(0xFD, b"")
        + uncompressed_chunk(b"data")
        + STREAM_IDENTIFIER  # a repeated identifier (concatenated streams) is allowed
        + uncompressed_chunk(b"!")
    )
    assert SnappyLayer().decode(stream) == b"plain data!"
    one_by_one = SnappyLayer()
    assert b"".join(one_by_one.decode(stream[i : i + 1]) for i in range(len(stream))) == b"plain data!"


def test_compressed_chunk_built_from_a_raw_block():
    block = b"abcabcabcabcabcabc" * 100
    raw = bytes(cramjam.snappy.compress_raw(block))
    stream = STREAM_IDENTIFIER + chunk(0x00, struct.pack("<I", masked_crc(block)) + raw)
    assert SnappyLayer().decode(stream) == block


@settings(max_examples=200, deadline=None)
@given(
    payloads=st.lists(
        st.binary(max_size=3000) | st.sampled_from([b"x" * 70_000, b"ab" * 40_000]), max_size=8
    ),
    data=st.data(),
)
def test_round_trip_any_fragmentation(payloads, data):
    sender, receiver = SnappyLayer(), SnappyLayer()
    wire = b"".join(sender.encode(p) for p in payloads)
    cuts = data.draw(st.lists(st.integers(0, max(len(wire), 1)), max_size=40))
    assert decode_pieces(receiver, split(wire, cuts)) == b"".join(payloads)


def test_large_payload_one_byte_at_a_time():
    payload = random.Random(7).randbytes(70_000) + b"nsq " * 30_000
    wire = SnappyLayer().encode(payload)
    receiver = SnappyLayer()
    out = bytearray()
    for i in range(len(wire)):
        out += receiver.decode(wire[i : i + 1])
    assert out == payload


def test_many_small_writes():
    rng = random.Random(3)
    sender, receiver = SnappyLayer(), SnappyLayer()
    frames = [rng.randbytes(rng.randint(1, 40)) for _ in range(3000)]
    wire = b"".join(sender.encode(f) for f in frames)
    assert decode_pieces(receiver, random_pieces(wire, rng, 700)) == b"".join(frames)


@pytest.mark.parametrize(
    ("stream", "message"),
    [
        (b"PUB topic\n\x00\x00\x00\x05hello", "snappy: corrupt input"),  # garbage, not a stream
        (uncompressed_chunk(b"data"), "snappy: corrupt input"),  # no stream identifier first
        (b"\xff\x06\x00\x00sNaPpZ", "snappy: corrupt input"),  # wrong magic
        (b"\xff\x07\x00\x00sNaPpY!", "snappy: corrupt input"),  # wrong identifier length
        (STREAM_IDENTIFIER + chunk(0x02, b"x"), "snappy: unsupported input"),  # reserved unskippable
        (STREAM_IDENTIFIER + chunk(0x7F, b""), "snappy: unsupported input"),
        (STREAM_IDENTIFIER + chunk(0x00, b"abc"), "snappy: corrupt input"),  # shorter than a CRC
        (STREAM_IDENTIFIER + b"\x80\xff\xff\xff", "snappy: unsupported input"),  # chunk too large
        (STREAM_IDENTIFIER + b"\x01\x05\x00\x01", "snappy: corrupt input"),  # > 64 KiB uncompressed
        (STREAM_IDENTIFIER + uncompressed_chunk(b"data", crc=12345), "snappy: corrupt input"),
        (STREAM_IDENTIFIER + chunk(0x00, b"\x00\x00\x00\x00\xff\xff\xff"), "snappy: corrupt input"),
    ],
)
def test_bad_input_raises(stream, message):
    with pytest.raises(TransportError) as info:
        SnappyLayer().decode(stream)
    assert str(info.value).startswith(message)


def test_wrong_crc_in_a_compressed_chunk():
    wire = bytearray(SnappyLayer().encode(b"hello world " * 100))
    assert wire[10] == 0x00
    wire[14] ^= 0x01  # first CRC byte of the first data chunk
    with pytest.raises(TransportError, match=r"^snappy: corrupt input"):
        SnappyLayer().decode(bytes(wire))


def test_compressed_chunk_decoding_to_more_than_64k_is_refused():
    block = b"a" * 100_000
    raw = bytes(cramjam.snappy.compress_raw(block))
    stream = STREAM_IDENTIFIER + chunk(0x00, struct.pack("<I", masked_crc(block)) + raw)
    with pytest.raises(TransportError, match=r"^snappy: corrupt input"):
        SnappyLayer().decode(stream)


def test_corrupt_chunk_detected_only_when_complete():
    bad = STREAM_IDENTIFIER + uncompressed_chunk(b"data", crc=1)
    layer = SnappyLayer()
    assert layer.decode(bad[:-1]) == b""
    with pytest.raises(TransportError):
        layer.decode(bad[-1:])


class TestPythonSnappyInterop:
    """python-snappy's stream classes are what pynsq's SnappySocket uses."""

    @pytest.fixture(autouse=True)
    def _snappy(self):
        self.snappy = pytest.importorskip("snappy")

    def test_python_snappy_stream_into_layer(self):
        compressor = self.snappy.StreamCompressor()
        rng = random.Random(11)
        payloads = [rng.randbytes(n) for n in (5, 0, 1000, 70_000)] + [b"nsq" * 30_000]
        wire = b"".join(compressor.add_chunk(p) for p in payloads if p)
        receiver = SnappyLayer()
        assert decode_pieces(receiver, random_pieces(wire, rng, 3000)) == b"".join(payloads)

    def test_layer_stream_into_python_snappy(self):
        decompressor = self.snappy.StreamDecompressor()
        sender = SnappyLayer()
        rng = random.Random(12)
        payloads = [rng.randbytes(300), b"frame" * 20_000, b"x", rng.randbytes(66_000)]
        wire = b"".join(sender.encode(p) for p in payloads)
        out = b"".join(decompressor.decompress(piece) for piece in random_pieces(wire, rng, 4000))
        assert out == b"".join(payloads)


class TestPysnappyInterop:
    """pysnappy: Google's C++ snappy with its own framing and CRC-32C code, independent of
    cramjam (python-snappy 0.7 is a thin layer over cramjam itself)."""

    @pytest.fixture(autouse=True)
    def _framing(self):
        self.framing = pytest.importorskip("pysnappy.framing")

    @pytest.mark.parametrize("mode", [None, True, False])  # auto, always compressed, never
    def test_pysnappy_stream_into_layer(self, mode):
        compressor = self.framing.Compressor()
        rng = random.Random(21)
        payloads = [rng.randbytes(7), b"nsq message " * 9000, rng.randbytes(70_000), b"z"]
        wire = b"".join(compressor.add_chunk(p, compress=mode) for p in payloads)
        receiver = SnappyLayer()
        assert decode_pieces(receiver, random_pieces(wire, rng, 2000)) == b"".join(payloads)

    def test_layer_stream_into_pysnappy(self):
        decompressor = self.framing.Decompressor()
        sender = SnappyLayer()
        rng = random.Random(22)
        payloads = [rng.randbytes(300), b"frame" * 20_000, b"x", rng.randbytes(66_000)]
        payloads += [rng.randbytes(rng.randint(1, 50)) for _ in range(500)]
        wire = b"".join(sender.encode(p) for p in payloads)
        out = b"".join(decompressor.decompress(piece) for piece in random_pieces(wire, rng, 4000))
        assert out == b"".join(payloads)

    def test_pysnappy_rejects_our_corrupted_crc(self):
        wire = bytearray(SnappyLayer().encode(b"hello world " * 100))
        wire[14] ^= 0x01
        with pytest.raises(Exception, match="crc mismatch"):
            self.framing.Decompressor().decompress(bytes(wire))
