import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nsqpy.protocol import commands
from nsqpy.protocol.commands import CommandParser, LineTooLong, decode_mpub
from nsqpy.protocol.errors import ProtocolError


def parse_all(data: bytes, validate=None, chunk: int | None = None):
    p = CommandParser()
    out = []
    chunks = [data] if chunk is None else [data[i : i + chunk] for i in range(0, len(data), chunk)]
    for c in chunks:
        p.feed(c)
        while (cmd := p.next(validate)) is not None:
            out.append(cmd)
    return out


def test_simple_lines_and_crlf():
    out = parse_all(b"NOP\nRDY 5\r\nFIN abc\n")
    assert out == [(b"NOP", [b"NOP"], None), (b"RDY", [b"RDY", b"5"], None), (b"FIN", [b"FIN", b"abc"], None)]


def test_body_commands():
    data = commands.pub("t", b"hello") + commands.identify({"a": 1}) + b"NOP\n"
    out = parse_all(data)
    assert out[0] == (b"PUB", [b"PUB", b"t"], b"hello")
    assert out[1][0] == b"IDENTIFY" and out[1][2] == b'{"a": 1}'
    assert out[2][0] == b"NOP"


@given(st.lists(st.binary(min_size=1, max_size=40), min_size=1, max_size=10), st.integers(1, 7))
def test_any_split_parses_the_same(bodies, chunk):
    data = b"".join(commands.pub("t", b) for b in bodies) + commands.mpub("x", bodies)
    whole = parse_all(data)
    split = parse_all(data, chunk=chunk)
    assert whole == split
    assert [c[2] for c in whole[:-1]] == bodies
    assert decode_mpub(whole[-1][2], 1 << 20, 5 << 20) == bodies


def test_validator_called_before_body_buffered():
    calls = []

    def validate(name, params, size):
        calls.append((name, size))
        if size is not None and size > 10:
            raise ProtocolError("E_BAD_MESSAGE", "too big")

    p = CommandParser()
    p.feed(b"PUB t\n")
    assert p.next(validate) is None
    assert calls == [(b"PUB", None)]
    p.feed(struct.pack(">i", 2**31 - 1))
    with pytest.raises(ProtocolError):
        p.next(validate)
    assert calls[-1] == (b"PUB", 2**31 - 1)


def test_negative_size_rejected():
    p = CommandParser()
    p.feed(b"PUB t\n" + struct.pack(">i", -5))
    with pytest.raises(ProtocolError):
        p.next()


def test_line_too_long():
    p = CommandParser()
    p.feed(b"X" * (commands.MAX_LINE_LENGTH + 1))
    with pytest.raises(LineTooLong):
        p.next()


def _mpub_body(*bodies, count=None):
    parts = [struct.pack(">i", len(bodies) if count is None else count)]
    for b in bodies:
        parts.append(struct.pack(">i", len(b)) + b)
    return b"".join(parts)


@pytest.mark.parametrize(
    "body,code,text",
    [
        (b"", "E_BAD_BODY", "MPUB failed to read message count"),
        (_mpub_body(count=0), "E_BAD_BODY", "MPUB invalid message count 0"),
        (_mpub_body(b"a", count=-1), "E_BAD_BODY", "MPUB invalid message count -1"),
        (_mpub_body(b"a", count=2), "E_BAD_MESSAGE", "MPUB failed to read message(1) body size"),
        (struct.pack(">ii", 1, 0), "E_BAD_MESSAGE", "MPUB invalid message(0) body size 0"),
        (_mpub_body(b"x" * 11), "E_BAD_MESSAGE", "MPUB message too big 11 > 10"),
        (struct.pack(">ii", 1, 5) + b"ab", "E_BAD_MESSAGE", "MPUB failed to read message body"),
    ],
)
def test_decode_mpub_errors(body, code, text):
    with pytest.raises(ProtocolError) as ei:
        decode_mpub(body, 10, 1000)
    assert ei.value.code == code
    assert ei.value.description == text


def test_decode_mpub_count_bounded_by_body_size():
    with pytest.raises(ProtocolError) as ei:
        decode_mpub(_mpub_body(b"a", count=200), 10, 100)
    assert ei.value.description == "MPUB invalid message count 200"
