"""The pure parts of ``nsq_to_nsq``: Go's JSON decoding and encoding edges
(:mod:`nsqpy.tools.jsonfilter`), and timer_metrics fed a batch at a time. (go-hostpool's
choices and timer_metrics' lines are tested with the shared modules, in the nsq_to_http
unit tests.)"""

from __future__ import annotations

import logging
import math
import random

import pytest

from nsqpy.tools.jsonfilter import (
    BACKOFF,
    DROP,
    INVALID,
    PASS,
    JSONFilter,
    decode_object,
    go_json_float,
    go_json_string,
    require_number,
    whitelist_keys,
)
from nsqpy.tools.nsq_to_nsq import BatchTimerMetrics
from nsqpy.tools.timer_metrics import TimerMetrics

pytestmark = pytest.mark.timeout(30)


# --- encoding/json ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "f, text",
    [
        (0.0, "0"),
        (-0.0, "-0"),
        (1.0, "1"),
        (-1.25, "-1.25"),
        (0.1 + 0.2, "0.30000000000000004"),
        (1e-6, "0.000001"),
        (1e-7, "1e-7"),
        (1.5e-7, "1.5e-7"),
        (1e-10, "1e-10"),
        (5e-324, "5e-324"),
        (123456789.123, "123456789.123"),
        (1e20, "100000000000000000000"),
        (2.0**63, "9223372036854776000"),
        (12345678912345678.0, "12345678912345678"),
        (1e21, "1e+21"),
        (-1.5e300, "-1.5e+300"),
        (1.7976931348623157e308, "1.7976931348623157e+308"),
    ],
)
def test_floats_as_go_writes_them(f, text):
    assert go_json_float(f) == text


def test_strings_as_go_1_21_writes_them():
    assert go_json_string("plain é 😀") == '"plain é 😀"'
    assert go_json_string('"\\/') == '"\\"\\\\/"'
    assert go_json_string("\n\r\t\b\f\x00\x1f\x7f") == '"\\n\\r\\t\\u0008\\u000c\\u0000\\u001f\x7f"'
    assert go_json_string("<a>&\u2028\u2029") == '"\\u003ca\\u003e\\u0026\\u2028\\u2029"'


def test_whitelist_keys_sort_by_bytes_once():
    assert whitelist_keys(["b", "a", "é", "Z", "b", "~"]) == ["Z", "a", "b", "~", "é"]


def test_decode_object_is_gos_unmarshal_into_a_map():
    assert decode_object(b"null") == {}
    assert decode_object(b' \t\r\n{"a":1}\n') == {"a": 1.0}
    for bad in (
        b"",
        b"[]",
        b"1",
        b'"s"',
        b"true",
        b'{"a":1}x',
        b'{"a":1}{}',
        b"\xef\xbb\xbf{}",
        b'{"a":NaN}',
        b'{"a":Infinity}',
        b'{"a":-Infinity}',
        b'{"a":1e309}',
        b'{"a":01}',
        b'{"a":"\x01"}',
        b"{'a':1}",
        b'{"a":1,}',
        '{"a":\u0661}'.encode(),
    ):
        assert decode_object(bad) is None, bad
    # every number is a float64; an overflowing one fails, an underflowing one is 0
    assert decode_object(b'{"i":9007199254740993,"u":1e-400}') == {"i": 9007199254740992.0, "u": 0.0}
    # invalid UTF-8: one U+FFFD per byte (Go's utf8.DecodeRune); lone surrogates too
    assert decode_object(b'{"s":"\xe2\x82(\xed\xa0\x80"}') == {"s": "\ufffd\ufffd(\ufffd\ufffd\ufffd"}
    assert decode_object(b'{"\\udc00k":["\\ud800\\ud800","\\ud83d\\ude00"]}') == {
        "\ufffdk": ["\ufffd\ufffd", "\U0001f600"]
    }
    assert decode_object(b'{"a":1,"a":2}') == {"a": 2.0}
    deep = b'{"a":' + b"[" * 500 + b"]" * 500 + b"}"
    assert decode_object(deep) is not None


def test_require_number_is_strconv_parse_float():
    assert require_number("1") == 1.0
    assert require_number("1e3") == 1000.0
    assert require_number("-0.5") == -0.5
    assert math.isnan(require_number("NaN") or 0.0)
    assert require_number("abc") is None
    assert require_number(" 1") is None


def test_filter_verdicts():
    plain = JSONFilter()
    assert not plain.active
    assert not JSONFilter(require_value="x").active
    f = JSONFilter("k", "v")
    assert f.apply(b'{"k":"v","x":1}') == (PASS, b'{"k":"v","x":1}')
    assert f.apply(b'{"k":"w"}') == (DROP, b'{"k":"w"}')
    assert f.apply(b'{"x":1}') == (BACKOFF, b'{"x":1}')
    assert f.apply(b"null") == (BACKOFF, b"null")
    assert f.apply(b"nope") == (INVALID, b"nope")
    assert JSONFilter("k").apply(b'{"x":1}') == (DROP, b'{"x":1}')
    nan = JSONFilter("k", "NaN")
    assert nan.apply(b'{"k":"NaN"}')[0] == PASS
    assert nan.apply(b'{"k":1}')[0] == DROP
    w = JSONFilter(whitelist=["n", "m", "big", "neg", "frac", "s"])
    body = (
        b'{"n":3,"m":-9223372036854775808,"big":9223372036854775807,"neg":-1e19,'
        b'"frac":0.5,"s":{"i":3,"b":[true,false,null]}}'
    )
    assert w.apply(body) == (
        PASS,
        b'{"big":9223372036854776000,"frac":0.5,"m":-9223372036854775808,'
        b'"n":3,"neg":-10000000000000000000,"s":{"b":[true,false,null],"i":3}}',
    )


# --- timer_metrics, a batch at a time ----------------------------------------------------


def lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "nsq_to_nsq"]


def test_batch_records_equal_gos_one_at_a_time(caplog):
    caplog.set_level(logging.INFO)
    rng = random.Random(7)
    batches = [(rng.randrange(1, 10**7) / 1e9, rng.randrange(1, 600)) for _ in range(40)]
    log = logging.getLogger("nsq_to_nsq")
    for every in (250, 5, 3, 1, -1):
        caplog.clear()
        one = TimerMetrics(every, "[x]:", log)
        for seconds, n in batches:
            for _ in range(n):
                one.status_duration(seconds)
        by_one = lines(caplog)
        caplog.clear()
        bulk = BatchTimerMetrics(every, "[x]:", log)
        for seconds, n in batches:
            bulk.record(seconds, n)
        assert lines(caplog) == by_one
        assert (bulk.timings, bulk.position) == (one.timings, one.position)
    caplog.clear()
    off = BatchTimerMetrics(0, "", log)
    off.record(0.5, 1000)
    assert lines(caplog) == [] and off.timings == []
