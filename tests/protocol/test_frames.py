import struct

import pytest

from nsqpy.protocol import commands, frames
from nsqpy.protocol.errors import ProtocolError
from nsqpy.protocol.names import is_ephemeral, is_valid_channel_name, is_valid_topic_name


def test_response_frame_bytes():
    assert frames.encode_response(b"OK") == b"\x00\x00\x00\x06\x00\x00\x00\x00OK"
    assert frames.encode_frame(0, b"OK") == frames.OK_FRAME
    assert struct.pack(">Ii", 15, 0) + b"_heartbeat_" == frames.HEARTBEAT_FRAME


def test_error_frame_bytes():
    assert frames.encode_error(b"E_INVALID x") == struct.pack(">Ii", 15, 1) + b"E_INVALID x"


def test_message_frame_layout():
    msg_id = b"0123456789abcdef"
    frame = frames.encode_message_frame(1_700_000_000_123_456_789, 3, msg_id, b"hello")
    size, ftype = struct.unpack_from(">Ii", frame)
    assert size == len(frame) - 4
    assert ftype == frames.FRAME_TYPE_MESSAGE
    decoded = frames.decode_message(frame[8:])
    assert decoded == (1_700_000_000_123_456_789, 3, msg_id, b"hello")
    assert frames.encode_message(1, 2, msg_id, b"x") == struct.pack(">qH", 1, 2) + msg_id + b"x"


def test_frame_reader_incremental():
    data = frames.OK_FRAME + frames.encode_message_frame(5, 1, b"a" * 16, b"body") + frames.HEARTBEAT_FRAME
    reader = frames.FrameReader()
    got = []
    for i in range(len(data)):
        got += reader.feed(data[i : i + 1])
    assert [t for t, _ in got] == [0, 2, 0]
    assert got[0][1] == b"OK"
    assert got[2][1] == b"_heartbeat_"


def test_frame_reader_rejects_bad_size():
    with pytest.raises(ValueError):
        frames.FrameReader().feed(struct.pack(">Ii", 2, 0))


@pytest.mark.parametrize(
    "name,ok",
    [
        ("t", True),
        ("a.b_c-D9", True),
        ("x" * 64, True),
        ("x" * 65, False),
        ("", False),
        ("bad name", False),
        ("bad!", False),
        ("t#ephemeral", True),
        ("#ephemeral", False),
        ("t#eph", False),
        ("t#ephemeral#ephemeral", False),
        ("é", False),
    ],
)
def test_names(name, ok):
    assert is_valid_topic_name(name) is ok
    assert is_valid_channel_name(name) is ok


def test_ephemeral():
    assert is_ephemeral("c#ephemeral")
    assert not is_ephemeral("c")


def test_protocol_error_text_and_fatality():
    e = ProtocolError("E_FIN_FAILED", "FIN x failed ID not in flight")
    assert not e.fatal
    assert bytes(e) == b"E_FIN_FAILED FIN x failed ID not in flight"
    assert ProtocolError("E_INVALID", "x").fatal
    back = ProtocolError.from_frame(b'E_BAD_TOPIC PUB topic name "a b" is not valid')
    assert back.code == "E_BAD_TOPIC" and back.description.startswith("PUB")


def test_client_encoders():
    assert commands.sub("t", "c") == b"SUB t c\n"
    assert commands.pub("t", b"ab") == b"PUB t\n\x00\x00\x00\x02ab"
    assert commands.dpub("t", 1500, b"a") == b"DPUB t 1500\n\x00\x00\x00\x01a"
    assert commands.rdy(10) == b"RDY 10\n"
    assert commands.fin(b"0" * 16) == b"FIN " + b"0" * 16 + b"\n"
    assert commands.req(b"0" * 16, 0) == b"REQ " + b"0" * 16 + b" 0\n"
    body = commands.encode_mpub_body([b"a", b"bc"])
    assert body == b"\x00\x00\x00\x02\x00\x00\x00\x01a\x00\x00\x00\x02bc"
    assert commands.mpub("t", [b"a", b"bc"]) == b"MPUB t\n" + struct.pack(">i", len(body)) + body
