"""Sans-I/O core of the nsqlookupd protocol V1: line parsing, IDENTIFY bodies, framing."""

from __future__ import annotations

import json
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from nsqpy.protocol import lookup
from nsqpy.protocol.errors import ProtocolError
from nsqpy.protocol.lookup import LookupParser, decode_identify

pytestmark = pytest.mark.timeout(60)


def lines(data: bytes) -> list[list[str]]:
    p = LookupParser()
    p.feed(data)
    out = []
    while (params := p.next_line()) is not None:
        out.append(params)
    return out


def test_lines_are_trimmed_and_split_on_single_spaces():
    assert lines(b"PING\n") == [["PING"]]
    assert lines(b"  REGISTER t c \r\n") == [["REGISTER", "t", "c"]]
    assert lines(b"REGISTER t  c\n") == [["REGISTER", "t", "", "c"]]
    assert lines(b"\n") == [[""]]
    assert lines(b"\tPING\x0b\x0c\n") == [["PING"]]
    assert lines(b"PING\xc2\xa0\n") == [["PING"]]  # U+00A0 is space to Go's TrimSpace
    assert lines(b"PING\x1c\n") == [["PING\x1c"]]  # but not to Go (Python's isspace says yes)
    assert lines(b"PING") == []


def test_lines_keep_invalid_utf8_bytes():
    [[_name, topic]] = lines(b"REGISTER t\xff\n")
    assert lookup.encode_text(topic) == b"t\xff"


def test_lines_arrive_in_pieces():
    p = LookupParser()
    p.feed(b"REGIS")
    assert p.next_line() is None
    p.feed(b"TER t\nPI")
    assert p.next_line() == ["REGISTER", "t"]
    assert p.next_line() is None
    assert p.buffered == 2
    p.feed(b"NG\n")
    assert p.next_line() == ["PING"]


def test_overlong_line_is_an_error():
    p = LookupParser()
    p.feed(b"x" * (lookup.MAX_LINE_LENGTH + 1))
    with pytest.raises(ProtocolError) as info:
        p.next_line()
    assert info.value.text() == "E_INVALID command line too long"


def test_body_after_identify():
    body = b'{"a":1}'
    p = LookupParser()
    p.feed(b"IDENTIFY\n" + struct.pack(">i", len(body)))
    assert p.next_line() == ["IDENTIFY"]
    assert p.next_body() is None
    p.feed(body[:3])
    assert p.next_body() is None
    p.feed(body[3:] + b"PING\n")
    assert p.next_body() == body
    assert p.next_line() == ["PING"]


def test_empty_body():
    p = LookupParser()
    p.feed(struct.pack(">i", 0))
    assert p.next_body() == b""


@pytest.mark.parametrize("size", [-1, lookup.MAX_BODY_SIZE + 1])
def test_bad_body_size(size):
    p = LookupParser()
    p.feed(struct.pack(">i", size))
    with pytest.raises(ProtocolError) as info:
        p.next_body()
    assert info.value.text() == "E_BAD_BODY IDENTIFY failed to read body"


@given(
    st.lists(st.sampled_from([b"PING", b"REGISTER a b", b" UNREGISTER c "]), max_size=8), st.integers(1, 7)
)
def test_any_chunking_gives_the_same_commands(cmds, step):
    data = b"".join(c + b"\n" for c in cmds)
    p = LookupParser()
    out = []
    for i in range(0, len(data), step):
        p.feed(data[i : i + step])
        while (params := p.next_line()) is not None:
            out.append(params)
    assert out == [lookup.go_trim_space(c.decode()).split(" ") for c in cmds]


def test_encode_response():
    assert lookup.encode_response(b"OK") == b"\x00\x00\x00\x02OK"
    assert lookup.encode_response(b"") == b"\x00\x00\x00\x00"


def test_client_encoders():
    assert lookup.register("t") == b"REGISTER t\n"
    assert lookup.register("t", "c") == b"REGISTER t c\n"
    assert lookup.unregister("t") == b"UNREGISTER t\n"
    assert lookup.unregister("t", "c") == b"UNREGISTER t c\n"
    assert lookup.ping() == b"PING\n"
    data = lookup.identify({"tcp_port": 1})
    assert data.startswith(b"IDENTIFY\n")
    (n,) = struct.unpack(">i", data[9:13])
    assert json.loads(data[13:]) == {"tcp_port": 1} and n == len(data) - 13


# --- IDENTIFY bodies, decoded like Go's json.Unmarshal into PeerInfo -----------------------------

FULL = {
    "broadcast_address": "b",
    "hostname": "h",
    "tcp_port": 4150,
    "http_port": 4151,
    "version": "1.3.0",
}


def test_decode_identify_fields_and_defaults():
    assert decode_identify(json.dumps(FULL).encode()) == {"remote_address": "", **FULL}
    assert decode_identify(b"{}") == {
        "remote_address": "",
        "hostname": "",
        "broadcast_address": "",
        "tcp_port": 0,
        "http_port": 0,
        "version": "",
    }
    assert decode_identify(b"null")["tcp_port"] == 0


def test_decode_identify_go_rules():
    # case-insensitive keys, unknown keys ignored, null leaves the value, last duplicate wins
    body = b'{"TCP_Port": 1, "extra": [1, {"x": 2}], "version": null, "hostname": "a", "hostname": "b"}'
    got = decode_identify(body)
    assert (got["tcp_port"], got["version"], got["hostname"]) == (1, "", "b")
    assert decode_identify(b'{"topology_zone": "z", "tcp_port": -1}')["tcp_port"] == -1
    assert decode_identify('{"hostname": "é\\u00e9"}'.encode())["hostname"] == "éé"
    assert decode_identify(b'{"hostname": "\xff"}')["hostname"] == "\ufffd"


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"nope",
        b"[]",
        b'"x"',
        b"1",
        b"{} x",
        b'{"tcp_port": "4150"}',
        b'{"tcp_port": 1.0}',
        b'{"tcp_port": 1e3}',
        b'{"tcp_port": true}',
        b'{"tcp_port": 9223372036854775808}',
        b'{"tcp_port": NaN}',
        b'{"version": 1}',
        b'{"hostname": {"a": 1}}',
        b'{"hostname": ["a"]}',
        b'{"version": 1, "tcp_port": 2}',
        b"\xef\xbb\xbf{}",
    ],
)
def test_decode_identify_errors(body):
    with pytest.raises(ValueError):
        decode_identify(body)


def test_decode_identify_int64_bounds():
    assert decode_identify(b'{"tcp_port": -9223372036854775808}')["tcp_port"] == -(1 << 63)
    assert decode_identify(b'{"tcp_port": 9223372036854775807}')["tcp_port"] == (1 << 63) - 1
