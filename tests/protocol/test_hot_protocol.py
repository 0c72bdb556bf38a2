"""The compiled protocol hot paths (nsqpy._speedups._hot) against their pure-Python
references, on the same inputs: same results, same state afterwards, and None from the
compiled one exactly where the reference raises (the caller then runs the reference).

These tests import the C module directly, whatever NSQPY_PURE_PYTHON says; they fail when it
is not built (the dev setup always builds it: scripts/setup.sh, pip install -e .).
"""

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st
from support import load_hot

from nsqpy import _speedups
from nsqpy.protocol import commands
from nsqpy.protocol.commands import CommandParser, decode_mpub_py, fin_run_py
from nsqpy.protocol.errors import ProtocolError

hot = load_hot()


def test_the_switch_follows_the_environment():
    import os

    pure = os.environ.get("NSQPY_PURE_PYTHON", "").strip() not in ("", "0")
    assert _speedups.compiled is (not pure)
    assert ("pure Python" in _speedups.describe()) is pure
    assert (commands.fin_run is fin_run_py) is pure


def test_a_layout_it_does_not_know_is_refused():
    with pytest.raises(ValueError):
        hot.set_layout(16, 31, 2, 10, 26)
    with pytest.raises(ValueError):
        hot.set_layout(16, 30, 2, 11, 27)


# --- decode_mpub ----------------------------------------------------------------------------


def mpub_body(bodies: list[bytes]) -> bytes:
    return commands.encode_mpub_body(bodies)


def same_decode(body: bytes, max_msg: int, max_body: int, declined: bool = False) -> None:
    """``declined``: limits the C code does not take (it returns None, the reference runs)."""
    fast = hot.decode_mpub(body, max_msg, max_body)
    try:
        ref = decode_mpub_py(body, max_msg, max_body)
    except ProtocolError:
        assert fast is None
    else:
        if declined:
            assert fast is None
            fast = ref
        assert fast == ref
        assert all(type(b) is bytes for b in fast)
    # and the public function gives the reference's answer or its exact error either way
    try:
        ref = decode_mpub_py(body, max_msg, max_body)
    except ProtocolError as e:
        with pytest.raises(ProtocolError) as got:
            commands.decode_mpub(body, max_msg, max_body)
        assert got.value.text() == e.text()
    else:
        assert commands.decode_mpub(body, max_msg, max_body) == ref


@given(st.lists(st.binary(min_size=1, max_size=50), min_size=1, max_size=30))
def test_decode_mpub_valid(bodies):
    same_decode(mpub_body(bodies), 1 << 20, 5 << 20)


@given(st.binary(max_size=80), st.integers(1, 64), st.integers(4, 200))
def test_decode_mpub_any_bytes(body, max_msg, max_body):
    same_decode(body, max_msg, max_body)


@given(st.lists(st.binary(min_size=1, max_size=20), min_size=1, max_size=8), st.data())
def test_decode_mpub_damaged(bodies, data):
    body = bytearray(mpub_body(bodies))
    i = data.draw(st.integers(0, len(body) - 1))
    body[i] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(body)))
    same_decode(bytes(body[:cut]), data.draw(st.integers(1, 25)), data.draw(st.integers(4, 300)))


def test_decode_mpub_edges():
    for body, mm, mb in [
        (b"", 10, 100),
        (b"\x00\x00\x00", 10, 100),
        (struct.pack(">i", 0), 10, 100),
        (struct.pack(">i", -1), 10, 100),
        (struct.pack(">ii", 1, 0), 10, 100),
        (struct.pack(">ii", 1, -5), 10, 100),
        (struct.pack(">ii", 1, 11) + b"x" * 11, 10, 100),
        (struct.pack(">ii", 1, 3) + b"ab", 10, 100),
        (struct.pack(">ii", 2, 1) + b"a", 10, 100),
        (struct.pack(">ii", 1, 1) + b"a" + b"trailing", 10, 100),
        (struct.pack(">ii", 21, 1) + b"a", 10, 100),  # more than (max_body - 4) // 5
        (struct.pack(">ii", 1, 1) + b"a", 10, 3),
    ]:
        same_decode(body, mm, mb)
    same_decode(struct.pack(">ii", 1, 1) + b"a", 2**70, 2**70, declined=True)  # beyond int64
    # a body received in place is a bytearray: split the same, into bytes
    got = hot.decode_mpub(bytearray(b"\x00\x00\x00\x01\x00\x00\x00\x01a"), 10, 100)
    assert got == [b"a"] and type(got[0]) is bytes
    assert hot.decode_mpub(memoryview(b"\x00\x00\x00\x01\x00\x00\x00\x01a"), 10, 100) is None


# --- parse_line / CommandParser -----------------------------------------------------------


def ref_parse_line(buf: bytearray, pos: int):
    nl = buf.find(b"\n", pos)
    if nl < 0:
        return None
    end = nl - 1 if nl > pos and buf[nl - 1] == 13 else nl
    return bytes(buf[pos:end]).split(b" "), nl + 1


@given(st.binary(max_size=60), st.data())
def test_parse_line(data, draw):
    buf = bytearray(data)
    pos = draw.draw(st.integers(0, len(buf)))
    assert hot.parse_line(buf, pos) == ref_parse_line(buf, pos)


TOKENS = [b"FIN ", b"RDY", b" ", b"\r", b"\n", b"\r\n", b"x", b"NOP", b"12"]


@given(st.lists(st.sampled_from(TOKENS), max_size=30))
def test_parse_line_tokens(parts):
    buf = bytearray(b"".join(parts))
    pos = 0
    while True:
        got = hot.parse_line(buf, pos)
        assert got == ref_parse_line(buf, pos)
        if got is None:
            break
        pos = got[1]


def test_parse_line_bad_position():
    with pytest.raises(ValueError):
        hot.parse_line(bytearray(b"x\n"), 3)
    with pytest.raises(TypeError):
        hot.parse_line(b"x\n", 0)


# --- fin_run / CommandParser.apply_fins ------------------------------------------------------


class Msg:
    """What fin_run needs of a message: its id and client."""

    __slots__ = ("client", "id")

    def __init__(self, msg_id: bytes, client: object) -> None:
        self.id = msg_id
        self.client = client


OWNER = object()
OTHER = object()


def fin_world(n_ids: int):
    ids = [b"%016x" % (i * 7919) for i in range(n_ids)]
    return ids


LINE = st.one_of(
    st.tuples(st.just("fin"), st.integers(0, 5), st.sampled_from([b"\n", b"\r\n"])),
    st.tuples(
        st.just("raw"),
        st.sampled_from(
            [
                b"NOP\n",
                b"RDY 10\n",
                b"FIN \n",
                b"FIN 0123456789abcde\n",
                b"FIN 0123456789abcdef0\n",
                b"FIN 0123456789 bcdef\n",
                b"FIN  0123456789abcde\n",
                b"FIN 0000000000000000 x\n",
                b"FIN 0000000000000000\r\r\n",
                b"fin 0000000000000000\n",
                b"FIN 0000000000000000",
                b"TOUCH 0000000000000000\n",
                b"\n",
                b"\r\n",
                b"FIN 000000000000000\r\n",
            ]
        ),
        st.just(b""),
    ),
)


@given(st.lists(LINE, max_size=12), st.sets(st.integers(0, 5)), st.sets(st.integers(0, 5)), st.integers(0, 3))
def test_fin_run_matches_the_reference(lines, in_flight_ids, others, start_junk):
    ids = fin_world(6)
    chunks = [b"x" * start_junk]
    for kind, what, end in lines:
        chunks.append(b"FIN " + ids[what] + end if kind == "fin" else what)
    data = b"".join(chunks)

    def world():
        msgs = {i: Msg(ids[i], OTHER if i in others else OWNER) for i in in_flight_ids}
        return msgs, {m.id: m for m in msgs.values()}

    msgs_c, flight_c = world()
    msgs_p, flight_p = world()
    got_c = hot.fin_run(bytearray(data), start_junk, flight_c, OWNER)
    got_p = fin_run_py(bytearray(data), start_junk, flight_p, OWNER)
    assert got_c == got_p
    assert sorted(flight_c) == sorted(flight_p)
    assert {i: m.client for i, m in msgs_c.items()} == {i: m.client for i, m in msgs_p.items()}


def test_fin_run_stops_at_the_first_failure_and_the_parser_takes_it():
    ids = fin_world(3)
    msgs = [Msg(i, OWNER) for i in ids[:2]]
    in_flight = {m.id: m for m in msgs}
    p = CommandParser()
    p.feed(b"FIN " + ids[0] + b"\nFIN " + ids[2] + b"\nFIN " + ids[1] + b"\r\nRDY 5\n")
    assert p.apply_fins(in_flight, OWNER) == 1
    assert msgs[0].client is None and ids[0] not in in_flight
    assert p.next() == (b"FIN", [b"FIN", ids[2]], None)  # not in flight: next() reports it
    assert p.apply_fins(in_flight, OWNER) == 1
    assert in_flight == {}
    assert p.apply_fins(in_flight, OWNER) == 0
    assert p.next() == (b"RDY", [b"RDY", b"5"], None)
    assert p.next() is None


def test_apply_fins_waits_for_a_whole_line_and_a_body():
    ids = fin_world(1)
    m = Msg(ids[0], OWNER)
    p = CommandParser()
    p.feed(b"FIN " + ids[0][:9])
    assert p.apply_fins({m.id: m}, OWNER) == 0
    p.feed(ids[0][9:] + b"\n")
    assert p.apply_fins({m.id: m}, OWNER) == 1
    p.feed(b"PUB t\n")
    assert p.next() is None  # waiting for the body
    assert p.apply_fins({}, OWNER) == 0


def test_fin_run_bad_arguments():
    with pytest.raises(TypeError):
        hot.fin_run(b"FIN x\n", 0, {}, OWNER)
    with pytest.raises(ValueError):
        hot.fin_run(bytearray(b"x"), 5, {}, OWNER)
