"""nsqadmin's flags, config file and start-up checks (NSQ 1.3.0 ``apps/nsqadmin`` and
``nsqadmin.New``): names, defaults, repeatable flags, TOML keys, Go's messages."""

from __future__ import annotations

import re

import pytest

from nsqpy.nsqadmin import NSQAdmin
from nsqpy.nsqadmin.options import (
    FLAGS,
    Options,
    OptionsError,
    normalize_base_path,
    parse_args,
    usage,
    validate,
)

pytestmark = pytest.mark.timeout(30)

GO_FLAGS = {
    "config",
    "version",
    "log-level",
    "log-prefix",
    "verbose",
    "http-address",
    "base-path",
    "dev-static-dir",
    "graphite-url",
    "proxy-graphite",
    "statsd-counter-format",
    "statsd-gauge-format",
    "statsd-prefix",
    "statsd-interval",
    "notification-http-endpoint",
    "http-client-connect-timeout",
    "http-client-request-timeout",
    "http-client-tls-insecure-skip-verify",
    "http-client-tls-root-ca-file",
    "http-client-tls-cert",
    "http-client-tls-key",
    "allow-config-from-cidr",
    "acl-http-header",
    "lookupd-http-address",
    "nsqd-http-address",
    "admin-user",
}
OURS = {
    "stats-sample-interval",
    "stats-retention",
    "htpasswd-file",
    "session-timeout",
    "tls-cert",
    "tls-key",
    "admin-token-file",
}


def test_flag_set_and_defaults():
    assert {f.name for f in FLAGS} == GO_FLAGS | OURS
    o = parse_args([])
    assert o.http_address == "0.0.0.0:4171"
    assert o.base_path == "/"
    assert o.log_prefix == "[nsqadmin] " and o.log_level == "info"
    assert (o.statsd_prefix, o.statsd_counter_format, o.statsd_gauge_format) == (
        "nsq.%s",
        "stats.counters.%s.count",
        "stats.gauges.%s",
    )
    assert o.statsd_interval == 60.0
    assert (o.http_client_connect_timeout, o.http_client_request_timeout) == (2.0, 5.0)
    assert o.allow_config_from_cidr == "127.0.0.1/8"
    assert o.acl_http_header == "X-Forwarded-User"
    assert o.admin_users == [] and o.nsqlookupd_http_addresses == []
    assert (o.stats_sample_interval, o.stats_retention) == (5.0, 3600.0)
    text = usage()
    for name in OURS:
        line = re.split(rf"  -{name} \w+\n", text, maxsplit=1)[1].splitlines()[0]
        assert "[nsqpy]" in line
    for name in GO_FLAGS:
        assert f"  -{name}" in text


def test_command_line():
    o = parse_args(
        [
            "--lookupd-http-address=127.0.0.1:4161",
            "-lookupd-http-address",
            "127.0.0.2:4161",
            "--admin-user=ann",
            "--admin-user",
            "bob",
            "--proxy-graphite",
            "--graphite-url=http://graphite:8080",
            "--statsd-interval=10s",
            "--base-path=/nsq",
            "--http-client-request-timeout=1.5s",
            "--log-level=DEBUG",
            "--stats-sample-interval=2s",
            "--stats-retention=2h",
        ]
    )
    assert o.nsqlookupd_http_addresses == ["127.0.0.1:4161", "127.0.0.2:4161"]
    assert o.admin_users == ["ann", "bob"]
    assert o.proxy_graphite is True and o.graphite_url == "http://graphite:8080"
    assert o.statsd_interval == 10.0 and o.http_client_request_timeout == 1.5
    assert o.log_level == "debug"
    assert (o.stats_sample_interval, o.stats_retention) == (2.0, 7200.0)
    with pytest.raises(OptionsError, match="flag provided but not defined: -nope"):
        parse_args(["--nope"])
    with pytest.raises(OptionsError, match='invalid value "soon" for flag -statsd-interval'):
        parse_args(["--statsd-interval=soon"])


def test_config_file(tmp_path):
    cfg = tmp_path / "nsqadmin.cfg"
    cfg.write_text(
        'nsqlookupd_http_addresses = ["10.0.0.1:4161", "10.0.0.2:4161"]\n'
        'admin_users = ["ops"]\n'
        'http_client_connect_timeout = "3s"\n'
        'notification_http_endpoint = "http://hooks/nsq"\n'
        'log_level = "warn"\n'
        'acl_http_header = "X-User"\n'
        'stats_retention = "30m"\n'
    )
    o = parse_args([f"--config={cfg}", "--admin-user=root"])
    assert o.nsqlookupd_http_addresses == ["10.0.0.1:4161", "10.0.0.2:4161"]
    assert o.admin_users == ["root"]  # the command line wins
    assert o.http_client_connect_timeout == 3.0
    assert o.notification_http_endpoint == "http://hooks/nsq"
    assert o.log_level == "warn" and o.acl_http_header == "X-User"
    assert o.stats_retention == 1800.0
    bad = tmp_path / "bad.cfg"
    bad.write_text('log_level = "chatty"\n')
    with pytest.raises(OptionsError, match="failed parsing log_level chatty"):
        parse_args([f"--config={bad}"])


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({}, "--nsqd-http-address or --lookupd-http-address required"),
        (
            {"nsqd_http_addresses": ["127.0.0.1:4151"], "nsqlookupd_http_addresses": ["a:1"]},
            "use --nsqd-http-address or --lookupd-http-address not both",
        ),
        (
            {"nsqd_http_addresses": ["127.0.0.1:4151"], "http_client_tls_cert": "c.pem"},
            "--http-client-tls-key must be specified with --http-client-tls-cert",
        ),
        (
            {"nsqd_http_addresses": ["127.0.0.1:4151"], "http_client_tls_key": "k.pem"},
            "--http-client-tls-cert must be specified with --http-client-tls-key",
        ),
        (
            {"nsqd_http_addresses": ["127.0.0.1:4151"], "http_client_tls_root_ca_file": "/no"},
            "failed to read TLS root CA file /no - open /no: no such file or directory",
        ),
        (
            {"nsqlookupd_http_addresses": ["127.0.0.1"]},
            "failed to resolve --lookupd-http-address (127.0.0.1) - address 127.0.0.1: "
            "missing port in address",
        ),
        (
            {"nsqd_http_addresses": ["127.0.0.1:99999"]},
            "failed to resolve --nsqd-http-address (127.0.0.1:99999) - address 127.0.0.1:99999: invalid port",
        ),
        (
            {"nsqd_http_addresses": ["127.0.0.1:4151"], "allow_config_from_cidr": "nope"},
            "failed to parse --allow-config-from-cidr (nope) - invalid CIDR address: nope",
        ),
        (
            {"nsqd_http_addresses": ["127.0.0.1:4151"], "log_level": "loud"},
            "invalid log level 'loud' (debug, info, warn, error, fatal)",
        ),
    ],
)
def test_validation_messages(kw, message):
    with pytest.raises(OptionsError) as e:
        validate(Options(**kw))
    assert str(e.value) == message


def test_root_ca_file_must_hold_certificates(tmp_path):
    pem = tmp_path / "ca.pem"
    pem.write_text("not a certificate\n")
    with pytest.raises(OptionsError, match=f"failed to AppendCertsFromPEM {pem}"):
        validate(Options(nsqd_http_addresses=["127.0.0.1:4151"], http_client_tls_root_ca_file=str(pem)))


@pytest.mark.parametrize(
    ("given", "normal"),
    [
        ("", "/"),
        ("/", "/"),
        ("admin", "/admin"),
        ("/admin/", "/admin"),
        ("//a//b/../c/", "/a/c"),
        ("/a/./b", "/a/b"),
    ],
)
def test_base_path_normalized(given, normal):
    assert normalize_base_path(given) == normal


async def test_in_process_start_reports_go_errors():
    with pytest.raises(OptionsError, match="required"):
        async with NSQAdmin(Options(http_address="127.0.0.1:0")):
            pass
    admin = NSQAdmin(
        http_address="127.0.0.1:0", nsqd_http_addresses=["127.0.0.1:4151"], stats_sample_interval=0
    )
    async with admin:
        assert admin.http_port > 0 and admin.http_addr_str == f"127.0.0.1:{admin.http_port}"
        with pytest.raises(RuntimeError, match=r"listen \(.*\) failed - listen tcp"):
            async with NSQAdmin(http_address=admin.http_addr_str, nsqd_http_addresses=["127.0.0.1:4151"]):
                pass
