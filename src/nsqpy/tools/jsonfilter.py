"""nsq_to_nsq's JSON rules (``--require-json-field``, ``--require-json-value``,
``--whitelist-json-field``), as NSQ 1.3's ``apps/nsq_to_nsq`` applies them, and the pieces of
Go's ``encoding/json`` they rest on. Pure code: the ``nsq_to_nsq`` tool uses
:class:`JSONFilter`; the Spark ``republish`` job builds its column expressions from the same
key order, string escaping and value parsing.

Go decodes the body with ``json.Unmarshal`` into a ``map[string]interface{}``:

- a body that is not one JSON value, or not an object (an array, a string, a number that
  overflows float64, …), is dropped: logged and FINished (``null`` is an empty object);
- ``--require-json-field``: the top-level field must exist, else the message is dropped;
  with ``--require-json-value`` too, a missing field logs an error and the message is
  requeued with backoff; the value must be a string equal to it, or a number equal to it
  as a float64 when it parses as one (``strconv.ParseFloat``); other values never match;
- ``--whitelist-json-field``: the body becomes the compact JSON object of the listed
  top-level fields present, written as Go's ``json.Marshal`` writes a map: keys sorted by
  bytes, ``<``, ``>``, ``&``, U+2028 and U+2029 escaped, control characters as ``\\u00XX``
  (``\\n``, ``\\r``, ``\\t`` excepted; Go 1.21, NSQ 1.3.0's compiler, writes ``\\b`` and
  ``\\f`` as ``\\u0008``/``\\u000c``), every number a float64 (shortest digits, exponent
  below 1e-6 and from 1e21) except the whitelisted top-level values that are integers,
  written as int64.

Decoding matches Go's on the edges that change bytes: invalid UTF-8 becomes U+FFFD (one per
bad byte), as do lone UTF-16 surrogate escapes; ``NaN``/``Infinity`` are not JSON; every
number is a float64 (an integer past 2^53 loses precision, as in Go). One difference: Go
accepts nesting up to 10000 levels, Python's parser about 1000 (deeper bodies are dropped
as invalid JSON).
"""

from __future__ import annotations

import codecs
import json
import math
import re
from collections.abc import Iterable
from decimal import Decimal
from typing import Any, Final

from nsqpy.govalues import NumError, parse_float

__all__ = [
    "BACKOFF",
    "DROP",
    "HTML_ESCAPES",
    "INVALID",
    "PASS",
    "JSONFilter",
    "decode_object",
    "go_json_float",
    "go_json_string",
    "require_number",
    "whitelist_keys",
]

#: Verdicts of :meth:`JSONFilter.apply`.
PASS: Final = 0  #: publish (the body, possibly rewritten)
DROP: Final = 1  #: filtered out: FIN without publishing
INVALID: Final = 2  #: not a JSON object: logged, FIN without publishing
BACKOFF: Final = 3  #: the required field is missing: logged, REQ with backoff

#: Characters Go's HTML-safe encoder escapes beyond JSON's own (they only occur in strings).
HTML_ESCAPES: Final = (
    ("<", "\\u003c"),
    (">", "\\u003e"),
    ("&", "\\u0026"),
    ("\u2028", "\\u2028"),
    ("\u2029", "\\u2029"),
)

_ESCAPES: Final[dict[str, str]] = {chr(i): f"\\u{i:04x}" for i in range(0x20)}
_ESCAPES.update({"\n": "\\n", "\r": "\\r", "\t": "\\t", '"': '\\"', "\\": "\\\\"})
_ESCAPES.update(HTML_ESCAPES)
_NEEDS_ESCAPE: Final = re.compile('[\x00-\x1f"\\\\<>&\u2028\u2029]')
_SURROGATE: Final = re.compile("[\ud800-\udfff]")
_SURROGATE_ESCAPE: Final = re.compile(r"\\u[dD][89a-fA-F]")


def _escape(m: re.Match[str]) -> str:
    return _ESCAPES[m.group()]


def go_json_string(s: str) -> str:
    """``s`` as a JSON string, written as Go 1.21's ``encoding/json`` writes it."""
    if _NEEDS_ESCAPE.search(s) is None:
        return f'"{s}"'
    return '"' + _NEEDS_ESCAPE.sub(_escape, s) + '"'


def go_json_float(f: float) -> str:
    """A float64 as ``encoding/json`` writes it: shortest digits, ``%f`` style, exponent
    form (``1e+21``, ``1e-7``) below 1e-6 and from 1e21."""
    a = abs(f)
    if a == 0:
        return "-0" if math.copysign(1.0, f) < 0 else "0"
    if 1e-4 <= a < 1e16:  # repr is already positional here
        r = repr(f)
        return r[:-2] if r.endswith(".0") else r
    d = Decimal(repr(f)).normalize()
    if 1e-6 <= a < 1e21:
        return f"{d:f}"
    sign, digits, exp = d.as_tuple()
    assert isinstance(exp, int)
    point = len(digits) + exp - 1
    mant = str(digits[0]) + ("." + "".join(map(str, digits[1:])) if len(digits) > 1 else "")
    return f"{'-' if sign else ''}{mant}e{'-' if point < 0 else '+'}{abs(point)}"


def _marshal(v: Any) -> str:
    """A decoded JSON value (floats only, no ints) as ``json.Marshal`` writes it."""
    t = type(v)
    if t is str:
        return go_json_string(v)
    if t is float:
        return go_json_float(v)
    if v is None:
        return "null"
    if v is True:
        return "true"
    if v is False:
        return "false"
    if t is dict:
        return "{" + ",".join(f"{go_json_string(k)}:{_marshal(v[k])}" for k in sorted(v)) + "}"
    return "[" + ",".join(map(_marshal, v)) + "]"


_INT64: Final = 1 << 63


def _top_level(v: Any) -> str:
    """A whitelisted top-level value: nsq_to_nsq writes integral float64s as int64 (Go's
    ``int64(f)`` on amd64 gives MinInt64 out of range, so those stay floats)."""
    if type(v) is float and v.is_integer() and -_INT64 <= v < _INT64:
        return str(int(v))
    return _marshal(v)


def whitelist_keys(fields: Iterable[str]) -> list[str]:
    """The whitelisted names in the order Go's map encoder writes them (by UTF-8 bytes,
    which for valid strings is code point order), each once."""
    return sorted(set(fields), key=lambda k: k.encode("utf-8", "surrogateescape"))


def require_number(text: str) -> float | None:
    """``--require-json-value`` as Go compares it with JSON numbers:
    ``strconv.ParseFloat(text, 64)``, or None when it is not a number."""
    try:
        return parse_float(text)
    except NumError:
        return None


# --- decoding ------------------------------------------------------------------------------


def _go_replace(e: UnicodeError) -> tuple[str, int]:
    """Each byte of invalid UTF-8 becomes one U+FFFD, as Go's ``utf8.DecodeRune`` reads it."""
    assert isinstance(e, UnicodeDecodeError)
    return "\ufffd", e.start + 1


codecs.register_error("nsqpy-go-replace", _go_replace)


def _go_number(text: str) -> float:
    f = float(text)
    if math.isinf(f):  # Go: "cannot unmarshal number … into Go value of type float64"
        raise ValueError(f"number {text} out of range")
    return f


def _no_constant(text: str) -> Any:
    raise ValueError(f"invalid character {text[0]!r} looking for beginning of value")


_DECODER: Final = json.JSONDecoder(parse_float=_go_number, parse_int=_go_number, parse_constant=_no_constant)


def _fix_surrogates(v: Any) -> Any:
    """Lone surrogates (from ``\\ud800``-style escapes) become U+FFFD, as Go decodes them."""
    t = type(v)
    if t is str:
        return _SURROGATE.sub("\ufffd", v)
    if t is dict:
        return {_SURROGATE.sub("\ufffd", k): _fix_surrogates(x) for k, x in v.items()}
    if t is list:
        return [_fix_surrogates(x) for x in v]
    return v


def decode_object(body: bytes) -> dict[str, Any] | None:
    """``json.Unmarshal(body, &map[string]interface{})``: the object (``{}`` for ``null``),
    or None when Go's Unmarshal fails (not JSON, not an object, a number out of range)."""
    text = body.decode("utf-8", "nsqpy-go-replace")
    try:
        v = _DECODER.decode(text)
    except (ValueError, RecursionError):
        return None
    if v is None:
        return {}
    if type(v) is not dict:
        return None
    obj: dict[str, Any] = v
    if _SURROGATE_ESCAPE.search(text) is not None:
        obj = _fix_surrogates(obj)
    return obj


class JSONFilter:
    """The three flags of nsq_to_nsq; :meth:`apply` gives a verdict and the body to publish."""

    def __init__(
        self, require_field: str = "", require_value: str = "", whitelist: Iterable[str] = ()
    ) -> None:
        self.require_field = require_field
        self.require_value = require_value
        self.whitelist = whitelist_keys(whitelist)
        #: Go parses bodies only with a required field or a whitelist
        self.active = bool(require_field or self.whitelist)
        self._number = require_number(require_value) if require_value else None

    def apply(self, body: bytes) -> tuple[int, bytes]:
        """``(verdict, body)``: PASS with the body to publish, or DROP/INVALID/BACKOFF."""
        js = decode_object(body)
        if js is None:
            return INVALID, body
        field = self.require_field
        if field:
            if field not in js:
                return (BACKOFF if self.require_value else DROP), body
            if self.require_value and not self._matches(js[field]):
                return DROP, body
        if not self.whitelist:
            return PASS, body
        parts = [f"{go_json_string(k)}:{_top_level(js[k])}" for k in self.whitelist if k in js]
        return PASS, ("{" + ",".join(parts) + "}").encode("utf-8", "surrogatepass")

    def _matches(self, v: Any) -> bool:
        if type(v) is str:
            return bool(v == self.require_value)
        if self._number is not None:
            return type(v) is float and v == self._number
        return False
