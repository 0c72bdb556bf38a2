"""Hypothesis properties of the parsers that read network and disk bytes: what is encoded
comes back whole however the bytes are cut, the compiled twins agree with the pure
references, and arbitrary bytes only ever raise each parser's documented errors (the fuzz
targets themselves, driven by Hypothesis' generator rather than libFuzzer's)."""

from __future__ import annotations

import json
import os
import struct
import zlib

import fuzz_targets as ft
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nsqpy.httpapi import parse_query
from nsqpy.protocol import commands
from nsqpy.protocol import lookup as lk
from nsqpy.protocol.frames import FrameReader, encode_frame, encode_message_frame

pytestmark = pytest.mark.timeout(120)

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789_-.", min_size=1, max_size=20)
bodies = st.binary(min_size=1, max_size=300)
msg_id = st.binary(min_size=16, max_size=16).map(lambda b: b.hex()[:16].encode())


def command_bytes() -> st.SearchStrategy[bytes]:
    return st.one_of(
        st.builds(commands.pub, names, bodies),
        st.builds(commands.mpub, names, st.lists(bodies, min_size=1, max_size=5)),
        st.builds(commands.dpub, names, st.integers(0, 3_600_000), bodies),
        st.builds(commands.sub, names, names),
        st.builds(commands.rdy, st.integers(0, 10_000)),
        st.builds(commands.fin, msg_id),
        st.builds(commands.req, msg_id, st.integers(0, 60_000)),
        st.builds(commands.touch, msg_id),
        st.builds(lambda d: commands.identify(d), st.dictionaries(names, st.integers() | names, max_size=4)),
        st.just(commands.NOP),
        st.just(commands.CLS),
    )


@pytest.fixture(scope="module", autouse=True)
def targets_ready():
    ft.setup()
    yield
    ft.cleanup()


@SETTINGS
@given(st.lists(command_bytes(), min_size=1, max_size=12), st.integers(0, 255))
def test_encoded_commands_parse_back_however_cut(cmds, seed):
    stream = b"".join(cmds)
    for compiled in {False, ft.compiled_available()}:
        got, err = ft._parse_commands(ft.cuts(stream, seed), compiled)
        assert err is None
        assert len(got) == len(cmds)
        for (name, params, payload), raw in zip(got, cmds, strict=True):
            line, _, rest = raw.partition(b"\n")
            assert params == line.split(b" ") and name == params[0]
            if payload is not None:
                assert _INT32.unpack_from(rest)[0] == len(payload) and rest[4:] == payload


_INT32 = struct.Struct(">i")


@SETTINGS
@given(st.lists(bodies, min_size=1, max_size=20))
def test_mpub_bodies_round_trip(items):
    body = commands.encode_mpub_body(items)
    assert commands.decode_mpub(body, 1 << 20, 5 << 20) == items
    assert commands.decode_mpub_py(body, 1 << 20, 5 << 20) == items


@SETTINGS
@given(st.binary(max_size=400), st.integers(0, 1000), st.integers(0, 5000))
def test_mpub_decoders_agree_on_any_body(body, max_msg, max_body):
    ft._mpub_bodies([(b"MPUB", [b"MPUB", b"t"], body)])
    from nsqpy.protocol.errors import ProtocolError

    try:
        commands.decode_mpub(body, max_msg, max_body)
    except ProtocolError as e:
        assert e.code in ("E_BAD_BODY", "E_BAD_MESSAGE")


frames_st = st.lists(
    st.one_of(
        st.builds(lambda b: encode_frame(0, b), st.binary(max_size=50)),
        st.builds(lambda b: encode_frame(1, b), st.binary(max_size=50)),
        st.builds(
            lambda ts, a, i, b: encode_message_frame(ts, a, i, b),
            st.integers(0, 2**62),
            st.integers(0, 65535),
            msg_id,
            st.binary(max_size=200),
        ),
    ),
    max_size=15,
)


@SETTINGS
@given(frames_st, st.integers(0, 255))
def test_frames_come_back_whole_and_both_decoders_agree(frames, seed):
    stream = b"".join(frames)
    a, a_err = ft._frames_plain(ft.cuts(stream, seed))
    b, b_err = ft._frames_batched(ft.cuts(stream, seed))
    assert not a_err and not b_err
    assert a == b and len(a) == len(frames)
    r = FrameReader()
    assert len(r.feed(stream)) == len(frames)


@SETTINGS
@given(st.lists(st.binary(max_size=3000), min_size=1, max_size=6), st.integers(1, 255))
def test_snappy_stream_round_trips_in_pieces(chunks, seed):
    from nsqpy.transport.snappy import SnappyLayer

    tx, rx = SnappyLayer(), SnappyLayer()
    wire = b"".join(tx.encode(c) for c in chunks)
    out = b"".join(rx.decode(p) for p in ft.cuts(wire, seed))
    assert out == b"".join(chunks)


@SETTINGS
@given(st.lists(st.binary(max_size=3000), min_size=1, max_size=6), st.integers(1, 255), st.integers(1, 9))
def test_deflate_stream_round_trips_in_pieces(chunks, seed, level):
    from nsqpy.transport.deflate import DeflateLayer

    tx, rx = DeflateLayer(level), DeflateLayer()
    wire = b"".join(tx.encode(c) for c in chunks)
    out = b"".join(rx.decode(p) for p in ft.cuts(wire, seed))
    assert out == b"".join(chunks)
    ref = zlib.decompressobj(-15)
    assert ref.decompress(wire) == out


@SETTINGS
@given(
    st.lists(
        st.sampled_from([lk.ping(), lk.register("t"), lk.register("t", "c"), lk.unregister("t")]), max_size=10
    ),
    st.integers(0, 255),
)
def test_lookup_lines_parse_back(lines, seed):
    p = lk.LookupParser()
    got = []
    for piece in ft.cuts(b"".join(lines), seed):
        p.feed(piece)
        while (params := p.next_line()) is not None:
            got.append(params)
    assert got == [line.decode().strip().split(" ") for line in lines]


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=20,
)


@SETTINGS
@given(json_values)
def test_lookup_identify_decodes_any_json_or_says_why(doc):
    try:
        out = lk.decode_identify(json.dumps(doc).encode())
    except ValueError:
        return
    assert set(out) == set(lk.PEER_INFO_FIELDS)


@SETTINGS
@given(
    st.dictionaries(
        st.text(min_size=1, max_size=10), st.lists(st.text(max_size=10), min_size=1, max_size=3), max_size=5
    )
)
def test_parse_query_reads_back_what_urlencode_wrote(values):
    from urllib.parse import urlencode

    raw = urlencode([(k, v) for k, vs in values.items() for v in vs])
    got, ok = parse_query(raw)
    assert ok
    assert got == {k: vs for k, vs in values.items()}


@SETTINGS
@given(st.binary(max_size=600), st.integers(0, 3), st.sampled_from([8, 64, 1024]))
def test_record_splitters_agree(buf, mn, mx):
    ft._split_records_both(buf, mn, mx)


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    st.lists(st.binary(min_size=1, max_size=200), min_size=1, max_size=40),
    st.integers(64, 2048),
    st.integers(0, 10_000),
)
def test_diskqueue_torn_tail_keeps_every_whole_record(tmp_path_factory, records, per_file, cut):
    """Records put, the queue closed, then the last segment cut anywhere (a torn write):
    reopened, the queue yields a prefix of the records, in order, and nothing else."""
    from nsqpy.nsqd.diskqueue import DiskQueue

    d = str(tmp_path_factory.mktemp("dq"))
    kw = dict(max_bytes_per_file=per_file, min_msg_size=1, max_msg_size=200, sync_every=1, sync_timeout=1)
    q = DiskQueue("q", d, **kw)
    for r in records:
        q.put(r)
    q.close()
    segs = sorted(f for f in os.listdir(d) if f.endswith(".dat") and "meta" not in f)
    last = os.path.join(d, segs[-1])
    size = os.path.getsize(last)
    os.truncate(last, cut % (size + 1))
    q = DiskQueue("q", d, **kw)
    got = []
    while chunk := q.read(100):
        got += chunk
    q.close()
    assert got == records[: len(got)]
    whole_segments = sum(1 for _ in segs[:-1])
    assert len(got) >= min(whole_segments, 1) or not segs[:-1]


@pytest.mark.parametrize("name", sorted(ft.TARGETS))
def test_target_on_hypothesis_bytes(name):
    fn = ft.TARGETS[name]

    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.binary(max_size=512))
    def check(data):
        fn(data)

    check()
