"""nsqlookupd options: flags of REFERENCE §1.7, Go flag syntax, the config file, usage."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from nsqpy.nsqlookupd.options import (
    FLAGS,
    HelpRequested,
    Options,
    OptionsError,
    config_value,
    parse_args,
    usage,
    validate,
)

pytestmark = pytest.mark.timeout(30)

S = 1_000_000_000


def err(argv: list[str]) -> str:
    with pytest.raises(OptionsError) as info:
        parse_args(argv)
    return str(info.value)


def write_config(tmp_path: Path, text: str) -> str:
    path = tmp_path / "nsqlookupd.cfg"
    path.write_text(text)
    return str(path)


def test_defaults_match_the_reference_table():
    o = Options()
    assert o.log_level == "info"
    assert o.log_prefix == "[nsqlookupd] "
    assert o.tcp_address == "0.0.0.0:4160"
    assert o.http_address == "0.0.0.0:4161"
    assert o.broadcast_address == socket.gethostname()
    assert o.inactive_producer_timeout == 300.0
    assert o.tombstone_lifetime == 45.0
    assert (o.version, o.config, o.verbose) == (False, "", False)
    assert parse_args([]) == o and parse_args([]).explicit == set()


def test_every_flag_of_the_reference():
    assert [f.name for f in FLAGS] == [
        "config",
        "version",
        "log-level",
        "log-prefix",
        "verbose",
        "tcp-address",
        "http-address",
        "broadcast-address",
        "inactive-producer-timeout",
        "tombstone-lifetime",
        "admin-token-file",  # an nsqpy addition, after Go's
    ]


def test_flags():
    o = parse_args(
        [
            "--tcp-address=127.0.0.1:5160",
            "-http-address",
            "127.0.0.1:5161",
            "--broadcast-address",
            "lookupd1",
            "--inactive-producer-timeout=1m30s",
            "-tombstone-lifetime=500ms",
            "--log-level=WARN",
            "--log-prefix=",
            "-verbose",
        ]
    )
    assert o.tcp_address == "127.0.0.1:5160" and o.http_address == "127.0.0.1:5161"
    assert o.broadcast_address == "lookupd1"
    assert o.inactive_producer_timeout == 90.0 and o.tombstone_lifetime == 0.5
    assert o.log_level == "warn" and o.log_prefix == "" and o.verbose is True
    assert o.explicit == {
        "tcp_address",
        "http_address",
        "broadcast_address",
        "inactive_producer_timeout",
        "tombstone_lifetime",
        "log_level",
        "log_prefix",
        "verbose",
    }


def test_parsing_stops_at_the_first_non_flag():
    o = parse_args(["--tcp-address=:1", "extra", "--http-address=:2"])
    assert o.tcp_address == ":1" and o.http_address == "0.0.0.0:4161"


def test_version_flag():
    assert parse_args(["--version"]).version is True
    assert parse_args(["-version=false"]).version is False


@pytest.mark.parametrize(
    "argv,message",
    [
        (["--nope"], "flag provided but not defined: -nope"),
        (["--data-path=/x"], "flag provided but not defined: -data-path"),
        (["--tcp-address"], "flag needs an argument: -tcp-address"),
        (["--tombstone-lifetime=45"], 'invalid value "45" for flag -tombstone-lifetime: parse error'),
        (
            ["--inactive-producer-timeout", "x"],
            'invalid value "x" for flag -inactive-producer-timeout: parse error',
        ),
        (
            ["--log-level=loud"],
            "invalid value \"loud\" for flag -log-level: invalid log level 'loud' "
            "(debug, info, warn, error, fatal)",
        ),
        (["--version=maybe"], 'invalid boolean value "maybe" for -version: parse error'),
        (["---x"], "bad flag syntax: ---x"),
    ],
)
def test_flag_errors(argv, message):
    assert err(argv) == message


@pytest.mark.parametrize("flag", ["-h", "--help", "-help"])
def test_help(flag):
    with pytest.raises(HelpRequested) as info:
        parse_args([flag])
    assert info.value.usage == usage()


def test_usage():
    text = usage()
    assert text.startswith("Usage of nsqlookupd:\n")
    flag_lines = [line.split()[0] for line in text.splitlines() if line.startswith("  -")]
    assert flag_lines == sorted("-" + f.name for f in FLAGS)
    assert '(default "0.0.0.0:4160")' in text
    assert '(default "0.0.0.0:4161")' in text
    assert '(default "[nsqlookupd] ")' in text
    assert "(default 5m0s)" in text
    assert "(default 45s)" in text
    assert "(default info)" in text
    assert "  -tombstone-lifetime duration\n" in text
    assert "  -verbose\n" in text
    assert "  -log-level value\n" in text


def test_config_file(tmp_path):
    path = write_config(
        tmp_path,
        """
tcp_address = "127.0.0.1:6160"
http_address = "127.0.0.1:6161"
broadcast_address = "from-config"
inactive_producer_timeout = "10s"
tombstone_lifetime = 2500
log_level = "debug"
log_prefix = "[L] "
unknown_key = 1
verbose = true
""",
    )
    o = parse_args([f"--config={path}", "--tcp-address=127.0.0.1:7160"])
    assert o.tcp_address == "127.0.0.1:7160"  # the command line wins
    assert o.http_address == "127.0.0.1:6161"
    assert o.broadcast_address == "from-config"
    assert o.inactive_producer_timeout == 10.0
    assert o.tombstone_lifetime == 2.5  # go-options reads integers as milliseconds
    assert o.log_level == "debug" and o.log_prefix == "[L] "
    assert o.verbose is False  # not an option key in Go's nsqlookupd.Options
    assert o.explicit == {
        "config",
        "tcp_address",
        "http_address",
        "broadcast_address",
        "inactive_producer_timeout",
        "tombstone_lifetime",
        "log_level",
        "log_prefix",
    }


@pytest.mark.parametrize(
    "text,message",
    [
        ('log_level = "loud"', "failed parsing log_level loud"),
        (
            'tombstone_lifetime = "45"',
            'option resolution failed to coerce 45 for tombstone_lifetime - time: invalid duration ""',
        ),
        (
            "tombstone_lifetime = true",
            "option resolution failed to coerce true for tombstone_lifetime - "
            "invalid time.Duration value type bool",
        ),
        ("tcp_address = [", None),
    ],
)
def test_config_errors(tmp_path, text, message):
    path = write_config(tmp_path, text)
    got = err([f"--config={path}"])
    if message is None:
        assert got.startswith(f"failed to load config file {path} - ")
    else:
        assert got == message


def test_missing_config_file(tmp_path):
    path = tmp_path / "nope.cfg"
    assert err([f"--config={path}"]) == (f"failed to load config file {path} - No such file or directory")


def test_config_value():
    o = parse_args(["--tombstone-lifetime=1s", "--log-level=error"])
    assert config_value(o, "tombstone_lifetime") == S
    assert config_value(o, "inactive_producer_timeout") == 300 * S
    assert config_value(o, "log_level") == 4
    assert config_value(o, "tcp_address") == "0.0.0.0:4160"
    with pytest.raises(KeyError):
        config_value(o, "verbose")


def test_validate():
    o = Options(log_level="DEBUG")
    validate(o)
    assert o.log_level == "debug"
    with pytest.raises(OptionsError):
        validate(Options(log_level="loud"))
