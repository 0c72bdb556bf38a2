"""Go-compatible command lines for the daemons: ``flag`` syntax, ``--config`` TOML files
resolved like ``mreiferson/go-options``, and the ``-help`` text (the Go value syntaxes it
parses and prints are :mod:`nsqpy.govalues`).

Each daemon declares a table of :class:`Flag` (name, options attribute, value :class:`Kind`,
help, config key) and a :class:`FlagSet` around it; ``FlagSet.parse`` fills the daemon's
options dataclass the way the Go daemon does: Go ``flag`` parsing, then the config file for
flags not given on the command line, then the defaults. Durations are float seconds here;
``FlagSet.config_value`` turns values back into Go's JSON shapes (integer nanoseconds, Go
enum ints).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Generic, TypeVar

from nsqpy.govalues import (
    LOG_LEVELS,
    NS_PER_S,
    NumError,
    format_duration,
    format_duration_ns,
    go_float_v,
    go_quote,
    go_sprint_s,
    go_type,
    go_v,
    parse_bool,
    parse_duration,
    parse_duration_ns,
    parse_float,
    parse_int,
    parse_log_level,
    to_ns,
)
from nsqpy.protocol.errors import NSQError

__all__ = [
    "BOOL",
    "DURATION",
    "FLOAT_LIST",
    "INT",
    "LOG_LEVEL",
    "LOG_LEVELS",
    "STRING",
    "STRING_LIST",
    "UNSET",
    "Flag",
    "FlagSet",
    "FlagValueError",
    "HelpRequested",
    "Kind",
    "NumError",
    "OptionsError",
    "flag",
    "flag_nocfg",
    "format_duration",
    "format_duration_ns",
    "go_float_v",
    "go_quote",
    "go_sprint_s",
    "go_type",
    "go_v",
    "parse_bool",
    "parse_duration",
    "parse_duration_ns",
    "parse_float",
    "parse_int",
    "parse_log_level",
]


class OptionsError(NSQError, ValueError):
    """A bad flag, config file or option value; the message is what the Go daemon prints."""


class HelpRequested(NSQError):
    """``-h``/``-help``/``--help`` was given: print :attr:`usage` and exit 0."""

    def __init__(self, usage_text: str) -> None:
        self.usage = usage_text
        super().__init__(usage_text)


# --------------------------------------------------------------------------------------------
# Value kinds
# --------------------------------------------------------------------------------------------


class FlagValueError(Exception):
    """A flag value was rejected; :attr:`reason` is what Go's ``flag`` package prints."""

    def __init__(self, reason: str) -> None:
        self.reason = reason
        super().__init__(reason)


class _Unset:
    def __repr__(self) -> str:
        return "UNSET"


#: Returned by a config coercion to leave the option as if the key were absent.
UNSET: Final[Any] = _Unset()


class _CoerceError(Exception):
    pass


@dataclass(frozen=True, slots=True)
class Kind:
    """How one kind of flag value is parsed, read from a config file, shown and encoded.

    ``parse(text, current)`` is Go's ``flag.Value.Set`` (``current`` is the value so far:
    the default, an earlier occurrence, or the list built so far for repeatable kinds); it
    raises FlagValueError (message printed as is) or ValueError (printed as ``str(exc)``).
    ``coerce(value, default)`` is go-options' coercion of a TOML value; with
    ``via_flag=True`` the config value is formatted with ``%v`` and given to ``coerce`` (or
    ``parse`` when there is none) as text, and a failure is ``failed parsing <key> <value>``
    (how the Go apps validate enum-like keys before ``options.Resolve``). A coercion may
    return :data:`UNSET` to leave the option as if the key were absent.
    """

    name: str
    #: the type word ``-help`` prints after the flag name ("" for boolean-like flags)
    usage_type: str
    parse: Callable[[str, Any], Any]
    coerce: Callable[[Any, Any], Any] | None = None
    via_flag: bool = False
    #: ``-flag`` alone means true, and a value must be attached with ``=``
    boolean: bool = False
    #: each occurrence appends; ``finish`` turns the collected items into the value
    repeatable: bool = False
    finish: Callable[[list[Any]], Any] | None = None
    #: the ``(default …)`` text of ``-help`` ("" hides it)
    default_text: Callable[[Any], str] = lambda v: ""
    #: JSON value of ``GET /config/:opt``
    to_json: Callable[[Any], object] = lambda v: list(v) if isinstance(v, list) else v


def _own_num(parse: Callable[[str], Any]) -> Callable[[str, Any], Any]:
    """A ``flag`` package built-in type: strconv's detail is hidden behind its own words."""

    def set_value(text: str, current: Any) -> Any:
        try:
            return parse(text)
        except NumError as exc:
            raise FlagValueError(exc.flag_reason) from None

    return set_value


def _parse_duration_flag(text: str, current: Any) -> float:
    try:
        return parse_duration_ns(text) / NS_PER_S
    except ValueError:
        raise FlagValueError("parse error") from None


def _coerce_bool(v: Any, default: Any) -> bool:
    if isinstance(v, bool):
        return v
    if isinstance(v, str):
        return parse_bool(v)
    if isinstance(v, int):
        # go-options maps integers to `v == 0`, i.e. 0 is true; kept for compatibility
        return v == 0
    raise _CoerceError(f"invalid bool value type {go_type(v)}")


def _coerce_int(v: Any, default: Any) -> int:
    if isinstance(v, bool):
        raise _CoerceError("invalid int64 value type bool")
    if isinstance(v, int):
        if not -(1 << 63) <= v < 1 << 63:
            raise NumError("ParseInt", str(v), True)
        return v
    if isinstance(v, str):
        return parse_int(v, base0=False)
    raise _CoerceError(f"invalid int64 value type {go_type(v)}")


def _coerce_duration(v: Any, default: Any) -> float:
    if isinstance(v, bool):
        raise _CoerceError("invalid time.Duration value type bool")
    if isinstance(v, int):
        return v / 1000  # go-options reads integers as milliseconds
    if isinstance(v, str):
        if re.fullmatch(r"[0-9]+", v):
            # go-options' legacy bare-integer path needs a per-field unit that the 1.x
            # daemons no longer declare, so it always fails like this
            raise _CoerceError('time: invalid duration ""')
        return parse_duration_ns(v) / NS_PER_S
    raise _CoerceError(f"invalid time.Duration value type {go_type(v)}")


def _coerce_str_list(v: Any, default: Any) -> list[str]:
    if isinstance(v, str):
        return v.split(",")
    if isinstance(v, list):
        if not all(isinstance(x, str) for x in v):
            raise _CoerceError("list items must be strings")
        return list(v)
    return []


def _coerce_float_list(v: Any, default: Any) -> list[float]:
    if isinstance(v, str):
        return [parse_float(part.strip()) for part in v.split(",")]
    if isinstance(v, list):
        out: list[float] = []
        for x in v:
            if isinstance(x, bool) or not isinstance(x, int | float):
                raise _CoerceError("list items must be numbers")
            out.append(float(x))
        return out
    return []


def _parse_float_items(text: str, current: Any) -> list[float]:
    # a Var type: strconv's error is printed as is
    return [*current, *(parse_float(part) for part in text.split(","))]


BOOL: Final = Kind(
    "bool",
    "",
    _own_num(parse_bool),
    _coerce_bool,
    boolean=True,
    default_text=lambda v: "true" if v else "",
)
INT: Final = Kind(
    "int",
    "int",
    _own_num(lambda s: parse_int(s, base0=True)),
    _coerce_int,
    default_text=lambda v: str(v) if v else "",
)
STRING: Final = Kind(
    "string",
    "string",
    lambda s, cur: s,
    lambda v, d: go_sprint_s(v),
    default_text=lambda v: go_quote(v) if v else "",
)
DURATION: Final = Kind(
    "duration",
    "duration",
    _parse_duration_flag,
    _coerce_duration,
    default_text=lambda v: format_duration(v) if v else "",
    to_json=to_ns,
)
#: A repeatable string flag (NSQ's ``StringArray``): the value is re-split on commas, as
#: ``options.Resolve`` reads it back through ``String()``.
STRING_LIST: Final = Kind(
    "strlist",
    "value",
    lambda s, cur: [*cur, s],
    _coerce_str_list,
    repeatable=True,
    finish=lambda items: ",".join(items).split(","),
)
#: A repeatable, comma-separated float flag (NSQ's ``FloatArray``): kept sorted high to
#: low and printed with ``%f`` (6 decimals).
FLOAT_LIST: Final = Kind(
    "floatlist",
    "value",
    _parse_float_items,
    _coerce_float_list,
    repeatable=True,
    finish=lambda items: [float(f"{v:f}") for v in sorted(items, reverse=True)],
)
LOG_LEVEL: Final = Kind(
    "log_level",
    "value",
    lambda s, cur: parse_log_level(s),
    via_flag=True,
    default_text=str,
    to_json=lambda v: LOG_LEVELS[v.lower()],
)


# --------------------------------------------------------------------------------------------
# Flags and flag sets
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Flag:
    """One command-line flag."""

    name: str  #: flag name without dashes, e.g. ``"max-rdy-count"``
    attr: str  #: options field
    kind: Kind  #: value syntax
    help: str
    #: Config-file and ``/config/:opt`` key; None for flags outside Go's ``Options``
    #: struct (``--version``, ``--config``, ``--verbose``…).
    cfg: str | None


def flag(name: str, kind: Kind, help_text: str, attr: str = "", cfg: str = "") -> Flag:
    """A flag whose config key is its name with ``_`` (unless ``cfg`` says otherwise)."""
    attr = attr or name.replace("-", "_")
    return Flag(name, attr, kind, help_text, cfg or name.replace("-", "_"))


def flag_nocfg(name: str, kind: Kind, help_text: str) -> Flag:
    """A flag that is not an option (no config key, no ``/config/:opt``)."""
    return Flag(name, name.replace("-", "_"), kind, help_text, None)


T = TypeVar("T")


@dataclass(slots=True)
class _CommandLine:
    """Values seen on the command line, before config-file resolution."""

    values: dict[str, Any] = field(default_factory=dict)
    lists: dict[str, list[Any]] = field(default_factory=dict)


class FlagSet(Generic[T]):
    """A program's flags over its options dataclass (which must have an ``explicit`` set
    field, filled with the attributes given by a flag or the config file)."""

    def __init__(self, program: str, flags: Sequence[Flag], make_options: Callable[[], T]) -> None:
        self.program = program
        self.flags = tuple(flags)
        self.make_options = make_options
        self.by_name: dict[str, Flag] = {f.name: f for f in self.flags}
        self.by_cfg: dict[str, Flag] = {f.cfg: f for f in self.flags if f.cfg is not None}
        self.by_attr: dict[str, Flag] = {f.attr: f for f in self.flags}

    # --- command line ---------------------------------------------------------------------

    def parse(self, argv: Sequence[str]) -> T:
        """Parse a command line (without the program name) and its ``--config`` file.

        Go ``flag`` syntax: ``-f v``, ``--f v``, ``-f=v``, ``--f=v``; bool flags only take
        ``-f`` or ``-f=value``; parsing stops at the first non-flag word or ``--``. A flag
        given on the command line beats the config file, which beats the default.
        """
        return self.parse_known(argv)[0]

    def parse_known(self, argv: Sequence[str]) -> tuple[T, list[str]]:
        """:meth:`parse`, and the words after the flags (Go's ``flag.Args()``: from the
        first non-flag word on, or after ``--``)."""
        opts = self.make_options()
        line = _CommandLine()
        seen: set[str] = set()
        args = list(argv)
        i = 0
        while i < len(args):
            word = args[i]
            if len(word) < 2 or word[0] != "-":
                break
            dashes = 1
            if word[1] == "-":
                dashes = 2
                if len(word) == 2:
                    i += 1  # "--" ends the flags and is not an argument
                    break
            name = word[dashes:]
            if not name or name[0] in "-=":
                raise OptionsError(f"bad flag syntax: {word}")
            i += 1
            has_value = False
            value = ""
            eq = name.find("=", 1)
            if eq != -1:
                name, value, has_value = name[:eq], name[eq + 1 :], True
            spec = self.by_name.get(name)
            if spec is None:
                if name in ("h", "help"):
                    raise HelpRequested(self.usage())
                raise OptionsError(f"flag provided but not defined: -{name}")
            if spec.kind.boolean:
                try:
                    self._set(spec, value if has_value else "true", line, opts)
                except FlagValueError as exc:
                    raise OptionsError(
                        f"invalid boolean value {go_quote(value)} for -{name}: {exc.reason}"
                    ) from None
            else:
                if not has_value:
                    if i >= len(args):
                        raise OptionsError(f"flag needs an argument: -{name}")
                    value = args[i]
                    i += 1
                try:
                    self._set(spec, value, line, opts)
                except FlagValueError as exc:
                    raise OptionsError(
                        f"invalid value {go_quote(value)} for flag -{name}: {exc.reason}"
                    ) from None
            seen.add(spec.attr)
        for attr, items in line.lists.items():
            finish = self.by_attr[attr].kind.finish
            line.values[attr] = finish(items) if finish is not None else items

        from_config: dict[str, Any] = {}
        config_path = line.values.get("config", "")
        if config_path:
            from_config = self.load_config(config_path, exclude=seen, defaults=opts)

        for attr, val in (*from_config.items(), *line.values.items()):
            setattr(opts, attr, val)
        opts.explicit = seen | set(from_config)  # type: ignore[attr-defined]
        return opts, args[i:]

    @staticmethod
    def _set(spec: Flag, value: str, line: _CommandLine, opts: Any) -> None:
        """Go ``flag.Value.Set`` for one occurrence of a flag."""
        kind = spec.kind
        try:
            if kind.repeatable:
                line.lists[spec.attr] = kind.parse(value, line.lists.get(spec.attr, []))
            else:
                current = line.values.get(spec.attr, getattr(opts, spec.attr))
                line.values[spec.attr] = kind.parse(value, current)
        except FlagValueError:
            raise
        except ValueError as exc:
            raise FlagValueError(str(exc)) from None

    # --- config file ----------------------------------------------------------------------

    def load_config(self, path: str, *, exclude: set[str], defaults: Any) -> dict[str, Any]:
        """Read the TOML file and coerce each known key not already given as a flag.

        Unknown keys are ignored, as the Go daemons do.
        """
        import tomllib  # (only with --config: not in a daemon started without one)

        try:
            with open(path, "rb") as fh:
                raw = tomllib.load(fh)
        except OSError as exc:
            raise OptionsError(f"failed to load config file {path} - {exc.strerror or exc}") from None
        except tomllib.TOMLDecodeError as exc:
            raise OptionsError(f"failed to load config file {path} - {exc}") from None

        out: dict[str, Any] = {}
        for key, v in raw.items():
            spec = self.by_cfg.get(key)
            if spec is None or spec.attr in exclude:
                continue
            kind = spec.kind
            default = getattr(defaults, spec.attr)
            if kind.via_flag:
                text = go_v(v)
                try:
                    value = (kind.coerce or kind.parse)(text, default)
                except (FlagValueError, ValueError):
                    raise OptionsError(f"failed parsing {key} {text}") from None
            else:
                assert kind.coerce is not None, kind.name
                try:
                    value = kind.coerce(v, default)
                except (_CoerceError, ValueError) as exc:
                    raise OptionsError(
                        f"option resolution failed to coerce {go_v(v)} for {key} - {exc}"
                    ) from None
            if value is not UNSET:
                out[spec.attr] = value
        return out

    # --- usage and values -----------------------------------------------------------------

    def usage(self) -> str:
        """The ``-help`` text: every flag, sorted like Go's, with its default."""
        defaults = self.make_options()
        lines = [f"Usage of {self.program}:"]
        for spec in sorted(self.flags, key=lambda f: f.name):
            type_name = spec.kind.usage_type
            lines.append(f"  -{spec.name}" + (f" {type_name}" if type_name else ""))
            default = spec.kind.default_text(getattr(defaults, spec.attr))
            lines.append(f"    \t{spec.help}" + (f" (default {default})" if default else ""))
        return "\n".join(lines) + "\n"

    def config_value(self, opts: Any, name: str) -> object:
        """The value of config-named option ``name`` as Go's ``GET /config/:opt`` encodes it
        (durations as integer nanoseconds, enums as Go ints). KeyError for unknown names."""
        spec = self.by_cfg.get(name)
        if spec is None:
            raise KeyError(name)
        return spec.kind.to_json(getattr(opts, spec.attr))
