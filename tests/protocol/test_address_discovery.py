"""protocol.address and protocol.discovery: Go's host:port rules and go-nsq's lookupd rules."""

from __future__ import annotations

import pytest

from nsqpy.protocol.address import (
    format_address,
    parse_address,
    parse_address_list,
    split_address,
    split_listen_address,
)
from nsqpy.protocol.discovery import Producer, lookup_headers, lookup_url, producers


@pytest.mark.parametrize(
    "addr,want",
    [
        ("127.0.0.1:4150", ("127.0.0.1", 4150)),
        ("[::1]:4150", ("::1", 4150)),
        ("host.example:1", ("host.example", 1)),
        (" h:65535 ", ("h", 65535)),
    ],
)
def test_split(addr, want):
    assert split_address(addr) == want
    assert split_address(format_address(*want)) == want


@pytest.mark.parametrize("addr", ["h", "h:", "h:x", "h:0", "h:65536", "::1"])
def test_split_refuses(addr):
    with pytest.raises(ValueError):
        split_address(addr)


def test_default_port_and_listen_addresses():
    assert split_address("h", 4150) == ("h", 4150)
    assert split_address("::1", 4150) == ("::1", 4150)
    assert split_listen_address("/tmp/nsqd.sock") == "/tmp/nsqd.sock"
    assert split_listen_address("0.0.0.0:0") == ("0.0.0.0", 0)
    assert format_address("::1", 1) == "[::1]:1"


def test_parse_list_names_the_option():
    assert parse_address_list("a:1, [::1]:2,a:1,", "nsqdTcpAddresses") == ["a:1", "[::1]:2"]
    with pytest.raises(ValueError, match="'nsqdTcpAddresses'"):
        parse_address_list("a:1,b", "nsqdTcpAddresses")
    with pytest.raises(ValueError, match="'x'"):
        parse_address(":1", "x")


def test_lookup_url_and_headers():
    assert lookup_url("127.0.0.1:4161", "a b") == "http://127.0.0.1:4161/lookup?topic=a+b"
    assert lookup_url("https://l.example/custom", "t") == "https://l.example/custom?topic=t"
    assert lookup_url("http://l.example/", "t") == "http://l.example/lookup?topic=t"
    assert lookup_headers(None) == {"Accept": "application/vnd.nsq; version=1.0"}
    assert lookup_headers("s3cret")["Authorization"] == "Bearer s3cret"


def test_producers():
    doc = {
        "channels": [],
        "producers": [
            {"broadcast_address": "n1", "hostname": "h1", "tcp_port": 4150, "http_port": 4151},
            {"broadcast_address": "::1", "tcp_port": 5150, "http_port": 5151},
            {"broadcast_address": "", "hostname": "h3", "tcp_port": 1, "http_port": 2},
            {"broadcast_address": "n1", "tcp_port": 4150, "http_port": 4151},
            "junk",
        ],
    }
    assert producers(doc) == [Producer("n1:4150", "n1:4151"), Producer("[::1]:5150", "[::1]:5151")]
    assert producers({"data": doc}) == producers(doc)
    assert producers(None) == [] and producers({"producers": None}) == []
