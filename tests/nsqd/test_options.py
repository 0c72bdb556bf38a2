"""nsqd options: Go flag syntax, config-file resolution, validation, /config values."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import socket
import zlib
from pathlib import Path

import pytest

from nsqpy.nsqd.options import (
    FLAGS,
    UNBUILT_FEATURES,
    HelpRequested,
    InvalidOptionError,
    InvalidValueError,
    Options,
    OptionsError,
    config_value,
    default_node_id,
    format_duration,
    parse_args,
    parse_duration,
    parse_duration_ns,
    set_config_value,
    unbuilt_requested,
    usage,
    validate,
)

S = 1_000_000_000  # ns per second


def err(argv: list[str]) -> str:
    with pytest.raises(OptionsError) as info:
        parse_args(argv)
    return str(info.value)


def write_config(tmp_path: Path, text: str) -> str:
    path = tmp_path / "nsqd.cfg"
    path.write_text(text)
    return str(path)


# --------------------------------------------------------------------------------------------
# Defaults and the field table
# --------------------------------------------------------------------------------------------


def test_defaults_match_the_reference_table() -> None:
    o = Options()
    expected = {
        "log_level": "info",
        "log_prefix": "[nsqd] ",
        "https_address": "0.0.0.0:4152",
        "http_address": "0.0.0.0:4151",
        "tcp_address": "0.0.0.0:4150",
        "auth_http_addresses": [],
        "auth_http_request_method": "get",
        "broadcast_tcp_port": 0,
        "broadcast_http_port": 0,
        "nsqlookupd_tcp_addresses": [],
        "http_client_connect_timeout": 2.0,
        "http_client_request_timeout": 5.0,
        "topology_region": "",
        "topology_zone": "",
        "data_path": "",
        "mem_queue_size": 10000,
        "max_bytes_per_file": 104857600,
        "sync_every": 2500,
        "sync_timeout": 2.0,
        "queue_scan_worker_pool_max": 4,
        "queue_scan_selection_count": 20,
        "msg_timeout": 60.0,
        "max_msg_timeout": 900.0,
        "max_msg_size": 1048576,
        "max_req_timeout": 3600.0,
        "max_body_size": 5242880,
        "max_heartbeat_interval": 60.0,
        "max_rdy_count": 2500,
        "max_output_buffer_size": 65536,
        "max_output_buffer_timeout": 30.0,
        "min_output_buffer_timeout": 0.025,
        "output_buffer_timeout": 0.25,
        "max_channel_consumers": 0,
        "statsd_address": "",
        "statsd_interval": 60.0,
        "statsd_mem_stats": True,
        "statsd_prefix": "nsq.%s",
        "statsd_udp_packet_size": 508,
        "statsd_exclude_ephemeral": False,
        "e2e_processing_latency_percentiles": [],
        "e2e_processing_latency_window_time": 600.0,
        "tls_cert": "",
        "tls_key": "",
        "tls_client_auth_policy": "",
        "tls_root_ca_file": "",
        "tls_required": "false",
        "tls_min_version": "tls1.0",
        "deflate": True,
        "max_deflate_level": 6,
        "snappy": True,
        "enable_experiment": [],
        "verbose": False,
        "worker_id": False,
        "version": False,
        "config": "",
        "queue_scan_interval": 0.1,
        "queue_scan_refresh_interval": 5.0,
        "queue_scan_dirty_percent": 0.25,
        "client_timeout": 60.0,
    }
    for name, value in expected.items():
        assert getattr(o, name) == value, name
    assert o.explicit == set()


def test_node_id_and_broadcast_address_default_from_hostname() -> None:
    host = socket.gethostname()
    o = Options()
    assert o.broadcast_address == host
    assert o.node_id == zlib.crc32(hashlib.md5(host.encode()).digest()) % 1024
    assert 0 <= default_node_id("example.com") < 1024
    # the recipe is crc32 over the raw 16-byte md5 digest, not the hex string
    digest = hashlib.md5(b"example.com").digest()
    assert default_node_id("example.com") == zlib.crc32(digest) % 1024


def test_every_flag_has_a_field_and_unique_names() -> None:
    fields = {f.name for f in dataclasses.fields(Options)}
    names = [f.name for f in FLAGS]
    assert len(names) == len(set(names))
    for spec in FLAGS:
        assert spec.attr in fields, spec
    cfgs = {f.cfg for f in FLAGS}
    assert {
        "id",
        "nsqlookupd_tcp_addresses",
        "auth_http_addresses",
        "e2e_processing_latency_percentiles",
        "enable_experiment",
    } <= cfgs
    assert "node_id" not in cfgs


def test_list_defaults_are_not_shared() -> None:
    a, b = Options(), Options()
    a.nsqlookupd_tcp_addresses.append("x:1")
    assert b.nsqlookupd_tcp_addresses == []


# --------------------------------------------------------------------------------------------
# Flag syntax
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        ["-max-rdy-count", "7"],
        ["--max-rdy-count", "7"],
        ["-max-rdy-count=7"],
        ["--max-rdy-count=7"],
    ],
)
def test_value_flag_forms(argv: list[str]) -> None:
    assert parse_args(argv).max_rdy_count == 7


def test_string_flag_forms_and_empty_value() -> None:
    assert parse_args(["--tcp-address", "127.0.0.1:1"]).tcp_address == "127.0.0.1:1"
    assert parse_args(["-http-address="]).http_address == ""
    # a value may itself start with a dash when given as a separate word
    assert parse_args(["--log-prefix", "-x-"]).log_prefix == "-x-"
    # '=' inside the value is kept
    assert parse_args(["--statsd-prefix=a=b"]).statsd_prefix == "a=b"


def test_last_occurrence_wins_for_scalars() -> None:
    assert parse_args(["--max-rdy-count=1", "--max-rdy-count", "2"]).max_rdy_count == 2


@pytest.mark.parametrize("word", ["1", "t", "T", "TRUE", "true", "True"])
def test_bool_true_forms(word: str) -> None:
    assert parse_args([f"--statsd-exclude-ephemeral={word}"]).statsd_exclude_ephemeral is True


@pytest.mark.parametrize("word", ["0", "f", "F", "FALSE", "false", "False"])
def test_bool_false_forms(word: str) -> None:
    assert parse_args([f"-snappy={word}"]).snappy is False


def test_bare_bool_flag_means_true() -> None:
    assert parse_args(["-statsd-exclude-ephemeral"]).statsd_exclude_ephemeral is True
    assert parse_args(["--verbose"]).verbose is True
    assert parse_args(["--worker-id"]).worker_id is True
    assert parse_args(["--version"]).version is True


def test_bool_flag_never_takes_a_separate_word() -> None:
    # Go: "-deflate false" sets deflate=true and "false" ends flag parsing
    o = parse_args(["--deflate", "false", "--tcp-address=1.2.3.4:5"])
    assert o.deflate is True
    assert o.tcp_address == "0.0.0.0:4150"


@pytest.mark.parametrize("word", ["yes", "", "2", "tRuE"])
def test_bad_bool_value(word: str) -> None:
    assert err([f"--deflate={word}"]) == f'invalid boolean value "{word}" for -deflate: parse error'


def test_worker_id_is_a_deprecated_bool() -> None:
    assert err(["--worker-id=5"]) == 'invalid boolean value "5" for -worker-id: parse error'


def test_parsing_stops_at_first_non_flag() -> None:
    o = parse_args(["--max-rdy-count=3", "extra", "--max-rdy-count=4"])
    assert o.max_rdy_count == 3
    # a lone "-" is not a flag either
    assert parse_args(["-", "--max-rdy-count=4"]).max_rdy_count == 2500


def test_double_dash_terminates() -> None:
    o = parse_args(["--snappy=false", "--", "--max-rdy-count=4"])
    assert o.snappy is False
    assert o.max_rdy_count == 2500


@pytest.mark.parametrize("word", ["---x", "-=x", "--=x"])
def test_bad_flag_syntax(word: str) -> None:
    assert err([word]) == f"bad flag syntax: {word}"


@pytest.mark.parametrize("word", ["--nope", "-nope", "--nope=1", "-max-message-size=5"])
def test_unknown_flag(word: str) -> None:
    name = word.lstrip("-").split("=")[0]
    assert err([word]) == f"flag provided but not defined: -{name}"


def test_flag_needs_an_argument() -> None:
    assert err(["--tcp-address"]) == "flag needs an argument: -tcp-address"


@pytest.mark.parametrize("word", ["-h", "--h", "-help", "--help", "-help=1"])
def test_help(word: str) -> None:
    with pytest.raises(HelpRequested) as info:
        parse_args([word, "--nope"])
    assert info.value.usage == usage()
    assert "-max-rdy-count int" in info.value.usage


def test_empty_command_line_gives_defaults() -> None:
    assert parse_args([]) == Options()


# --------------------------------------------------------------------------------------------
# Integers
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("word", "value"),
    [
        ("0", 0),
        ("-5", -5),
        ("+5", 5),
        ("0x1F", 31),
        ("0X1f", 31),
        ("010", 8),
        ("0o17", 15),
        ("0b101", 5),
        ("1_000", 1000),
        ("0x_ff", 255),
        ("9223372036854775807", 9223372036854775807),
        ("-9223372036854775808", -9223372036854775808),
    ],
)
def test_int_syntax(word: str, value: int) -> None:
    assert parse_args([f"--mem-queue-size={word}"]).mem_queue_size == value


@pytest.mark.parametrize("word", ["abc", "", "1.5", "08", "0x", "1__0", "_1", "1_", " 1", "١"])
def test_int_parse_error(word: str) -> None:
    assert err([f"--max-rdy-count={word}"]) == (
        f'invalid value "{word}" for flag -max-rdy-count: parse error'
    )


@pytest.mark.parametrize("word", ["9223372036854775808", "-9223372036854775809", "0x1" + "0" * 20])
def test_int_range_error(word: str) -> None:
    assert err(["--sync-every", word]) == (f'invalid value "{word}" for flag -sync-every: value out of range')


# --------------------------------------------------------------------------------------------
# Durations
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "ns"),
    [
        ("0", 0),
        ("-0", 0),
        ("+0", 0),
        ("1ns", 1),
        ("1.5us", 1500),
        ("1.5\u00b5s", 1500),
        ("2\u03bcs", 2000),
        ("250ms", 250_000_000),
        ("60s", 60 * S),
        ("1m", 60 * S),
        ("15m", 900 * S),
        ("1h", 3600 * S),
        ("1h2m3.5s", 3723 * S + S // 2),
        ("1.5h", 5400 * S),
        (".5s", S // 2),
        ("5.s", 5 * S),
        ("-1m30s", -90 * S),
        ("0.000000001s", 1),
        ("1.0000000001s", S),  # below 1ns is truncated
        ("9223372036854775807ns", 9223372036854775807),
        ("-9223372036854775808ns", -9223372036854775808),
    ],
)
def test_parse_duration(text: str, ns: int) -> None:
    assert parse_duration_ns(text) == ns
    assert parse_duration(text) == ns / S


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("5", 'time: missing unit in duration "5"'),
        ("00", 'time: missing unit in duration "00"'),
        ("1s5", 'time: missing unit in duration "1s5"'),
        ("", 'time: invalid duration ""'),
        ("-", 'time: invalid duration "-"'),
        ("s", 'time: invalid duration "s"'),
        (".s", 'time: invalid duration ".s"'),
        ("1.2.3s", 'time: missing unit in duration "1.2.3s"'),
        ("5x", 'time: unknown unit "x" in duration "5x"'),
        ("5 s", 'time: unknown unit " s" in duration "5 s"'),
        ("1d", 'time: unknown unit "d" in duration "1d"'),
        ("3\u00e9", 'time: unknown unit "\\xc3\\xa9" in duration "3\\xc3\\xa9"'),
        ("9223372036854775808ns", 'time: invalid duration "9223372036854775808ns"'),
        ("3000000h", 'time: invalid duration "3000000h"'),
    ],
)
def test_parse_duration_errors(text: str, message: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_duration_ns(text)
    assert str(info.value) == message


def test_duration_flags() -> None:
    o = parse_args(["--msg-timeout", "1h2m3.5s", "-output-buffer-timeout=100ms", "--sync-timeout=0"])
    assert o.msg_timeout == 3723.5
    assert o.output_buffer_timeout == 0.1
    assert o.sync_timeout == 0.0


@pytest.mark.parametrize("word", ["5", "60", "1x", ""])
def test_duration_flag_error_is_gos_flag_message(word: str) -> None:
    # Go's flag package replaces time.ParseDuration's detail with "parse error"
    assert err([f"--msg-timeout={word}"]) == (f'invalid value "{word}" for flag -msg-timeout: parse error')


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (60, "1m0s"),
        (0.25, "250ms"),
        (0.025, "25ms"),
        (900, "15m0s"),
        (3600, "1h0m0s"),
        (3723.5, "1h2m3.5s"),
        (1.5e-6, "1.5\u00b5s"),
        (1e-9, "1ns"),
        (-90, "-1m30s"),
        (2, "2s"),
    ],
)
def test_format_duration(seconds: float, text: str) -> None:
    assert format_duration(seconds) == text


# --------------------------------------------------------------------------------------------
# Repeatable flags
# --------------------------------------------------------------------------------------------


def test_lookupd_addresses_append_and_split_on_commas() -> None:
    o = parse_args(["--lookupd-tcp-address", "a:4160", "-lookupd-tcp-address=b:4160,c:4160"])
    assert o.nsqlookupd_tcp_addresses == ["a:4160", "b:4160", "c:4160"]


def test_auth_addresses_and_experiments_repeat() -> None:
    o = parse_args(
        [
            "--auth-http-address=a:1",
            "--auth-http-address=http://b/auth",
            "--enable-experiment=topology-aware-consumption",
        ]
    )
    assert o.auth_http_addresses == ["a:1", "http://b/auth"]
    assert o.enable_experiment == ["topology-aware-consumption"]


def test_percentiles_repeat_comma_sort_and_round() -> None:
    o = parse_args(
        [
            "--e2e-processing-latency-percentile=0.5,0.99",
            "--e2e-processing-latency-percentile",
            "1.0",
            "--e2e-processing-latency-percentile=0.9999999",
        ]
    )
    # Go's FloatArray keeps itself sorted high to low and Resolve re-reads it with %f
    assert o.e2e_processing_latency_percentiles == [1.0, 1.0, 0.99, 0.5]


@pytest.mark.parametrize("word", ["abc", "0.5,x", "0.5, 0.9", ""])
def test_percentile_parse_error(word: str) -> None:
    bad = next(p for p in word.split(",") if p not in ("0.5",))
    assert err([f"--e2e-processing-latency-percentile={word}"]) == (
        f'invalid value "{word}" for flag -e2e-processing-latency-percentile: '
        f'strconv.ParseFloat: parsing "{bad}": invalid syntax'
    )


# --------------------------------------------------------------------------------------------
# Enumerations
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("word", "level"), [("debug", "debug"), ("WARN", "warn"), ("Error", "error"), ("fatal", "fatal")]
)
def test_log_level(word: str, level: str) -> None:
    assert parse_args([f"--log-level={word}"]).log_level == level


def test_log_level_error() -> None:
    assert err(["--log-level", "loud"]) == (
        'invalid value "loud" for flag -log-level: '
        "invalid log level 'loud' (debug, info, warn, error, fatal)"
    )
    # "warning" is not a level name in NSQ
    assert "invalid log level 'warning'" in err(["--log-level=warning"])


@pytest.mark.parametrize(
    ("argv", "value"),
    [
        (["--tls-required"], "true"),
        (["--tls-required=true"], "true"),
        (["--tls-required=1"], "true"),
        (["--tls-required=T"], "true"),
        (["--tls-required=false"], "false"),
        (["--tls-required=tcp-https"], "tcp-https"),
        (["--tls-required=TCP-HTTPS"], "tcp-https"),
        # a bool-style flag: the next word is not its value
        (["--tls-required", "tcp-https"], "true"),
    ],
)
def test_tls_required(argv: list[str], value: str) -> None:
    assert parse_args(argv).tls_required == value


def test_tls_required_error() -> None:
    assert err(["--tls-required=Maybe"]) == (
        'invalid boolean value "Maybe" for -tls-required: strconv.ParseBool: parsing "maybe": invalid syntax'
    )


def test_tls_client_auth_policy_implies_tls_required() -> None:
    assert parse_args(["--tls-client-auth-policy=require"]).tls_required == "true"
    o = parse_args(["--tls-client-auth-policy=require", "--tls-required=tcp-https"])
    assert o.tls_required == "tcp-https"


@pytest.mark.parametrize(
    ("word", "value"), [("tls1.3", "tls1.3"), ("TLS1.2", "tls1.2"), ("tls1.1", "tls1.1"), ("", "tls1.0")]
)
def test_tls_min_version(word: str, value: str) -> None:
    assert parse_args([f"--tls-min-version={word}"]).tls_min_version == value


def test_tls_min_version_empty_keeps_earlier_value() -> None:
    assert parse_args(["--tls-min-version=tls1.2", "--tls-min-version="]).tls_min_version == ("tls1.2")


@pytest.mark.parametrize("word", ["ssl3.0", "tls1.4", "TLS9"])
def test_tls_min_version_error(word: str) -> None:
    assert err([f"--tls-min-version={word}"]) == (
        f'invalid value "{word}" for flag -tls-min-version: unknown tlsVersionOption "{word.lower()}"'
    )


# --------------------------------------------------------------------------------------------
# Explicitly set options
# --------------------------------------------------------------------------------------------


def test_explicit_tracks_flags_given() -> None:
    o = parse_args(["--max-rdy-count=2500", "--lookupd-tcp-address=a:1", "--node-id=3", "--snappy"])
    assert o.explicit == {"max_rdy_count", "nsqlookupd_tcp_addresses", "node_id", "snappy"}


def test_implied_tls_required_is_not_explicit() -> None:
    o = parse_args(["--tls-client-auth-policy=require"])
    assert o.explicit == {"tls_client_auth_policy"}


# --------------------------------------------------------------------------------------------
# Config file
# --------------------------------------------------------------------------------------------


def test_config_file_values(tmp_path: Path) -> None:
    path = write_config(
        tmp_path,
        """
id = 42
log_level = "debug"
tcp_address = "127.0.0.1:5150"
nsqlookupd_tcp_addresses = ["a:4160", "b:4160"]
auth_http_addresses = "x:1,y:2"
msg_timeout = "90s"
max_msg_timeout = 120000          # integers are milliseconds
mem_queue_size = 5
max_rdy_count = "100"             # strings are parsed as base-10 ints
statsd_mem_stats = "false"
e2e_processing_latency_percentiles = [1.0, 0.99, 0.5]
e2e_processing_latency_window_time = "1m"
tls_min_version = "tls1.2"
snappy = false
enable_experiment = ["topology-aware-consumption"]
""",
    )
    o = parse_args(["--config", path])
    assert o.config == path
    assert o.node_id == 42
    assert o.log_level == "debug"
    assert o.tcp_address == "127.0.0.1:5150"
    assert o.nsqlookupd_tcp_addresses == ["a:4160", "b:4160"]
    assert o.auth_http_addresses == ["x:1", "y:2"]
    assert o.msg_timeout == 90.0
    assert o.max_msg_timeout == 120.0
    assert o.mem_queue_size == 5
    assert o.max_rdy_count == 100
    assert o.statsd_mem_stats is False
    # config-file lists keep their order (only the flag sorts)
    assert o.e2e_processing_latency_percentiles == [1.0, 0.99, 0.5]
    assert o.e2e_processing_latency_window_time == 60.0
    assert o.tls_min_version == "tls1.2"
    assert o.snappy is False
    assert o.enable_experiment == ["topology-aware-consumption"]
    assert o.explicit == {
        "config",
        "node_id",
        "log_level",
        "tcp_address",
        "nsqlookupd_tcp_addresses",
        "auth_http_addresses",
        "msg_timeout",
        "max_msg_timeout",
        "mem_queue_size",
        "max_rdy_count",
        "statsd_mem_stats",
        "e2e_processing_latency_percentiles",
        "e2e_processing_latency_window_time",
        "tls_min_version",
        "snappy",
        "enable_experiment",
    }


def test_precedence_flag_over_config_over_default(tmp_path: Path) -> None:
    path = write_config(
        tmp_path,
        'max_rdy_count = 10\nmsg_timeout = "5s"\nsnappy = false\nnsqlookupd_tcp_addresses = ["cfg:1"]\n',
    )
    o = parse_args([f"--config={path}", "--max-rdy-count=20", "--lookupd-tcp-address=flag:1"])
    assert o.max_rdy_count == 20  # flag
    assert o.msg_timeout == 5.0  # config
    assert o.snappy is False  # config
    assert o.nsqlookupd_tcp_addresses == ["flag:1"]  # the flag replaces, not extends
    assert o.max_msg_timeout == 900.0  # default
    # a flag that equals the default still beats the config file
    o = parse_args(["--max-rdy-count=2500", "--config", path])
    assert o.max_rdy_count == 2500
    assert o.msg_timeout == 5.0


def test_unknown_and_flag_only_config_keys_are_ignored(tmp_path: Path) -> None:
    path = write_config(
        tmp_path,
        """
node_id = 7                      # the key is "id", as in Go
lookupd_tcp_address = ["x:1"]    # the key is nsqlookupd_tcp_addresses
verbose = true
worker_id = true
version = true
config = "/elsewhere"
client_timeout = "1s"
no_such_option = 1
[some_table]
x = 1
""",
    )
    o = parse_args(["--config", path])
    defaults = Options()
    assert o.node_id == defaults.node_id
    assert o.nsqlookupd_tcp_addresses == []
    assert (o.verbose, o.worker_id, o.version) == (False, False, False)
    assert o.config == path
    assert o.client_timeout == 60.0
    assert o.explicit == {"config"}


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        (
            "msg_timeout = 1.5",
            "option resolution failed to coerce 1.5 for msg_timeout - "
            "invalid time.Duration value type float64",
        ),
        (
            'msg_timeout = "5"',
            'option resolution failed to coerce 5 for msg_timeout - time: invalid duration ""',
        ),
        (
            'msg_timeout = "5x"',
            'option resolution failed to coerce 5x for msg_timeout - time: unknown unit "x" in duration "5x"',
        ),
        (
            "msg_timeout = true",
            "option resolution failed to coerce true for msg_timeout - invalid time.Duration value type bool",
        ),
        (
            'max_rdy_count = "0x10"',
            "option resolution failed to coerce 0x10 for max_rdy_count - "
            'strconv.ParseInt: parsing "0x10": invalid syntax',
        ),
        (
            "max_rdy_count = 1.0",
            "option resolution failed to coerce 1 for max_rdy_count - invalid int64 value type float64",
        ),
        (
            'snappy = "nope"',
            "option resolution failed to coerce nope for snappy - "
            'strconv.ParseBool: parsing "nope": invalid syntax',
        ),
        (
            'e2e_processing_latency_percentiles = "0.5,x"',
            "option resolution failed to coerce 0.5,x for e2e_processing_latency_percentiles - "
            'strconv.ParseFloat: parsing "x": invalid syntax',
        ),
        ('log_level = "loud"', "failed parsing log_level loud"),
        ("log_level = 2", "failed parsing log_level 2"),
        ('tls_required = "maybe"', "failed parsing tls_required maybe"),
        ('tls_min_version = "ssl3.0"', "failed parsing tls_min_version ssl3.0"),
    ],
)
def test_config_coercion_errors(tmp_path: Path, toml: str, message: str) -> None:
    assert err(["--config", write_config(tmp_path, toml + "\n")]) == message


@pytest.mark.parametrize(
    ("toml", "attr", "value"),
    [
        ("deflate = 0", "deflate", True),  # go-options quirk: integer 0 means true
        ("deflate = 1", "deflate", False),
        ('deflate = "f"', "deflate", False),
        ("tls_required = true", "tls_required", "true"),
        ('tls_required = "tcp-https"', "tls_required", "tcp-https"),
        ("tls_required = false", "tls_required", "false"),
        ('tls_min_version = ""', "tls_min_version", "tls1.0"),
        ('log_level = "WARN"', "log_level", "warn"),
        (
            'e2e_processing_latency_percentiles = "1.0, 0.95"',
            "e2e_processing_latency_percentiles",
            [1.0, 0.95],
        ),
        ("e2e_processing_latency_percentiles = [1, 0.5]", "e2e_processing_latency_percentiles", [1.0, 0.5]),
        ('max_body_size = "-1"', "max_body_size", -1),
        ("sync_timeout = 250", "sync_timeout", 0.25),
        ('sync_timeout = "0"', None, None),  # bare digit strings are rejected, even "0"
        # a non-string for a string option becomes Go's %s rendering, as go-options does
        ("tcp_address = 4150", "tcp_address", "%!s(int64=4150)"),
    ],
)
def test_config_coercions(tmp_path: Path, toml: str, attr: str | None, value: object) -> None:
    path = write_config(tmp_path, toml + "\n")
    if attr is None:
        with pytest.raises(OptionsError):
            parse_args(["--config", path])
        return
    assert getattr(parse_args(["--config", path]), attr) == value


def test_config_tls_client_auth_policy_implies_tls_required(tmp_path: Path) -> None:
    path = write_config(tmp_path, 'tls_client_auth_policy = "require-verify"\n')
    assert parse_args(["--config", path]).tls_required == "true"


def test_config_missing_file(tmp_path: Path) -> None:
    path = str(tmp_path / "missing.cfg")
    assert err(["--config", path]) == (f"failed to load config file {path} - No such file or directory")


def test_config_bad_toml(tmp_path: Path) -> None:
    path = write_config(tmp_path, "msg_timeout = \n")
    assert err(["--config", path]).startswith(f"failed to load config file {path} - ")


def test_empty_config_flag_reads_nothing() -> None:
    assert parse_args(["--config="]) == Options()


# --------------------------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------------------------


def vmsg(**changes: object) -> str:
    opts = dataclasses.replace(Options(), **changes)  # type: ignore[arg-type]
    with pytest.raises(OptionsError) as info:
        validate(opts)
    return str(info.value)


def test_defaults_validate() -> None:
    validate(Options())
    validate(
        parse_args(
            [
                "--max-deflate-level=1",
                "--node-id=1023",
                "--e2e-processing-latency-percentile=1.0,0.5",
                "--auth-http-request-method=post",
            ]
        )
    )


@pytest.mark.parametrize("level", [0, 10, -1])
def test_validate_deflate_level(level: int) -> None:
    assert vmsg(max_deflate_level=level) == "--max-deflate-level must be [1,9]"


@pytest.mark.parametrize("node_id", [-1, 1024, 4095])
def test_validate_node_id(node_id: int) -> None:
    assert vmsg(node_id=node_id) == "--node-id must be [0,1024)"


@pytest.mark.parametrize("required", ["true", "tcp-https"])
def test_validate_tls_required_needs_cert(required: str) -> None:
    assert vmsg(tls_required=required) == ("cannot require TLS client connections without TLS key and cert")


def test_validate_tls_policy_implies_required() -> None:
    opts = Options(tls_client_auth_policy="require")
    with pytest.raises(OptionsError, match="cannot require TLS client connections"):
        validate(opts)
    assert opts.tls_required == "true"
    opts = Options(tls_client_auth_policy="require", tls_cert="c.pem", tls_key="k.pem")
    validate(opts)
    assert opts.tls_required == "true"


def test_validate_tls_cert_and_key_go_together() -> None:
    assert vmsg(tls_cert="c.pem").startswith("failed to build TLS config - ")
    assert vmsg(tls_key="k.pem").startswith("failed to build TLS config - ")
    validate(Options(tls_cert="c.pem", tls_key="k.pem", tls_required="true"))


def test_validate_tls_required_value() -> None:
    assert "--tls-required" in vmsg(tls_required="maybe")


@pytest.mark.parametrize("method", ["GET", "put", ""])
def test_validate_auth_method(method: str) -> None:
    assert vmsg(auth_http_request_method=method) == ("--auth-http-request-method must be post or get")


@pytest.mark.parametrize(
    ("value", "text"), [(0.0, "0"), (1.5, "1.5"), (-0.25, "-0.25"), (2.0, "2"), (1e-05 - 1, "-0.99999")]
)
def test_validate_percentiles(value: float, text: str) -> None:
    assert vmsg(e2e_processing_latency_percentiles=[0.5, value]) == (
        f"invalid E2E processing latency percentile: {text}"
    )


def test_validate_log_level_and_tls_min_version() -> None:
    assert vmsg(log_level="loud") == ("invalid log level 'loud' (debug, info, warn, error, fatal)")
    assert vmsg(tls_min_version="ssl3.0") == 'unknown tlsVersionOption "ssl3.0"'


@pytest.mark.parametrize(
    ("changes", "flag"),
    [
        ({"mem_queue_size": -1}, "--mem-queue-size"),
        ({"max_bytes_per_file": 0}, "--max-bytes-per-file"),
        ({"sync_timeout": 0.0}, "--sync-timeout"),
        ({"statsd_address": "127.0.0.1:8125", "statsd_interval": 0.0}, "--statsd-interval"),
    ],
)
def test_validate_sanity(changes: dict[str, object], flag: str) -> None:
    assert vmsg(**changes).startswith(flag)


def test_validate_allows_zero_statsd_interval_without_statsd() -> None:
    validate(Options(statsd_interval=0.0))


# --------------------------------------------------------------------------------------------
# Unbuilt features
# --------------------------------------------------------------------------------------------


def test_unbuilt_table_names_option_fields() -> None:
    fields = {f.name for f in dataclasses.fields(Options)}
    assert set(UNBUILT_FEATURES) <= fields
    assert all(isinstance(v, str) and v for v in UNBUILT_FEATURES.values())


def test_unbuilt_requested_defaults_empty() -> None:
    assert unbuilt_requested(Options()) == []


@pytest.mark.parametrize(
    ("argv", "flags"),
    [
        (["--tls-cert=c.pem"], []),
        (["--tls-client-auth-policy=require"], []),
        (["--tls-required=tcp-https"], []),
        (["--auth-http-address=a:1"], []),
        (["--statsd-address=127.0.0.1:8125"], []),
        (["--lookupd-tcp-address=a:4160"], []),
        (["--e2e-processing-latency-percentile=0.99"], []),
        (["--enable-experiment=topology-aware-consumption"], ["--enable-experiment"]),
        (
            ["--tls-cert=c", "--tls-key=k", "--enable-experiment=topology-aware-consumption"],
            ["--enable-experiment"],
        ),
    ],
)
def test_unbuilt_requested(argv: list[str], flags: list[str]) -> None:
    assert unbuilt_requested(parse_args(argv)) == flags


@pytest.mark.parametrize(
    "argv",
    [
        ["--snappy=false"],
        ["--deflate=false"],
        ["--max-deflate-level=1"],
        ["--https-address=0.0.0.0:1"],
        ["--statsd-interval=10s"],
        ["--statsd-prefix=x"],
        ["--statsd-mem-stats=false"],
        ["--tls-required=false"],
        ["--tls-min-version=tls1.2"],
        ["--e2e-processing-latency-window-time=1m"],
        ["--auth-http-request-method=post"],
    ],
)
def test_disabling_or_bounding_flags_are_not_unbuilt(argv: list[str]) -> None:
    assert unbuilt_requested(parse_args(argv)) == []


# --------------------------------------------------------------------------------------------
# GET/PUT /config/:opt
# --------------------------------------------------------------------------------------------


def test_config_value_shapes() -> None:
    o = parse_args(
        [
            "--node-id=5",
            "--lookupd-tcp-address=a:4160",
            "--e2e-processing-latency-percentile=0.99,1.0",
            "--tls-min-version=tls1.3",
        ]
    )
    assert config_value(o, "id") == 5
    assert config_value(o, "msg_timeout") == 60 * S
    assert config_value(o, "output_buffer_timeout") == 250_000_000
    assert config_value(o, "min_output_buffer_timeout") == 25_000_000
    assert config_value(o, "max_msg_timeout") == 900 * S
    assert config_value(o, "nsqlookupd_tcp_addresses") == ["a:4160"]
    assert config_value(o, "auth_http_addresses") == []
    assert config_value(o, "e2e_processing_latency_percentiles") == [1.0, 0.99]
    assert config_value(o, "log_level") == 2
    assert config_value(o, "tls_required") == 0
    assert config_value(o, "tls_min_version") == 0x0304
    assert config_value(o, "deflate") is True
    assert config_value(o, "max_rdy_count") == 2500
    assert config_value(o, "statsd_prefix") == "nsq.%s"
    assert config_value(o, "data_path") == ""
    assert config_value(o, "enable_experiment") == []
    assert json.dumps(config_value(o, "nsqlookupd_tcp_addresses")) == '["a:4160"]'
    assert json.dumps(config_value(o, "sync_timeout")) == "2000000000"


@pytest.mark.parametrize(("required", "code"), [("false", 0), ("tcp-https", 1), ("true", 2)])
def test_config_value_tls_required(required: str, code: int) -> None:
    assert config_value(Options(tls_required=required), "tls_required") == code


@pytest.mark.parametrize(
    ("level", "code"), [("debug", 1), ("info", 2), ("warn", 3), ("error", 4), ("fatal", 5)]
)
def test_config_value_log_level(level: str, code: int) -> None:
    assert config_value(Options(log_level=level), "log_level") == code


def test_config_value_returns_a_copy_of_lists() -> None:
    o = Options(nsqlookupd_tcp_addresses=["a:1"])
    value = config_value(o, "nsqlookupd_tcp_addresses")
    assert isinstance(value, list)
    value.append("b:2")
    assert o.nsqlookupd_tcp_addresses == ["a:1"]


@pytest.mark.parametrize(
    "name",
    [
        "node_id",
        "verbose",
        "version",
        "config",
        "worker_id",
        "client_timeout",
        "queue_scan_interval",
        "nope",
        "lookupd_tcp_address",
        "explicit",
        "max-rdy-count",
    ],
)
def test_config_value_unknown(name: str) -> None:
    with pytest.raises(KeyError):
        config_value(Options(), name)


def test_every_cfg_name_has_a_json_value() -> None:
    o = Options()
    for spec in FLAGS:
        if spec.cfg is not None:
            json.dumps(config_value(o, spec.cfg))


def test_set_lookupd_addresses() -> None:
    o = Options()
    set_config_value(o, "nsqlookupd_tcp_addresses", b'["127.0.0.1:4160", "[::1]:4160"]')
    assert o.nsqlookupd_tcp_addresses == ["127.0.0.1:4160", "[::1]:4160"]
    assert config_value(o, "nsqlookupd_tcp_addresses") == ["127.0.0.1:4160", "[::1]:4160"]
    set_config_value(o, "nsqlookupd_tcp_addresses", b" [] ")
    assert o.nsqlookupd_tcp_addresses == []
    set_config_value(o, "nsqlookupd_tcp_addresses", b"null")
    assert o.nsqlookupd_tcp_addresses == []


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"nope",
        b'"a:1"',
        b'{"a": 1}',
        b"[1]",
        b'["a:1", null]',
        b'["noport"]',
        b'["host:"]',
        b'[":4160"]',
        b'["host:99999"]',
        b'["host:0"]',
        b'["::1:4160"]',
        b'["host:http"]',
        b'["a b:1"]',
        b"\xff",
    ],
)
def test_set_lookupd_addresses_invalid(body: bytes) -> None:
    o = Options(nsqlookupd_tcp_addresses=["keep:1"])
    with pytest.raises(InvalidValueError):
        set_config_value(o, "nsqlookupd_tcp_addresses", body)
    assert o.nsqlookupd_tcp_addresses == ["keep:1"]


@pytest.mark.parametrize(("body", "level"), [(b"debug", "debug"), (b"WARN", "warn"), (b"Fatal", "fatal")])
def test_set_log_level(body: bytes, level: str) -> None:
    o = Options()
    set_config_value(o, "log_level", body)
    assert o.log_level == level
    assert config_value(o, "log_level") == {"debug": 1, "warn": 3, "fatal": 5}[level]


@pytest.mark.parametrize("body", [b"loud", b"debug\n", b'"debug"', b"", b"\xff"])
def test_set_log_level_invalid(body: bytes) -> None:
    o = Options()
    with pytest.raises(InvalidValueError):
        set_config_value(o, "log_level", body)
    assert o.log_level == "info"


@pytest.mark.parametrize("name", ["msg_timeout", "id", "verbose", "nope"])
def test_set_other_options_refused(name: str) -> None:
    with pytest.raises(InvalidOptionError) as info:
        set_config_value(Options(), name, b"1")
    assert isinstance(info.value, OptionsError)


# --------------------------------------------------------------------------------------------
# Usage
# --------------------------------------------------------------------------------------------


def test_usage_lists_every_flag_sorted_with_defaults() -> None:
    text = usage()
    assert text.startswith("Usage of nsqd:\n")
    flag_lines = [line.split()[0] for line in text.splitlines() if line.startswith("  -")]
    assert flag_lines == sorted("-" + f.name for f in FLAGS)
    assert '(default "0.0.0.0:4150")' in text
    assert "(default 1m0s)" in text  # msg-timeout
    assert "(default 250ms)" in text  # output-buffer-timeout
    assert "(default 2500)" in text
    assert "(default info)" in text
    assert f"(default {Options().node_id})" in text
    assert "  -deflate\n" in text  # bool flags show no type
    assert "  -msg-timeout duration\n" in text
    assert "  -lookupd-tcp-address value\n" in text


def test_nan_is_not_a_default_anywhere() -> None:
    for spec in FLAGS:
        value = getattr(Options(), spec.attr)
        if isinstance(value, float):
            assert not math.isnan(value)
