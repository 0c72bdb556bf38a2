"""What the NSQ tools (``to_nsq``, ``nsq_tail``, …) share: the flag kinds of the Go apps
(``app.StringArray``, go-nsq's ``ConfigFlag`` for ``--consumer-opt``/``--producer-opt``),
the ``--version`` line, logging to stderr and ``log.Fatal``-style exits.

Exit codes follow the Go tools: 2 for a bad command line (the error, then the usage, as
Go's ``flag`` package prints them), 1 for ``log.Fatal`` (a missing flag, a failed
publish…), 0 for ``-help`` and ``--version``.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Coroutine, Sequence
from typing import Any, TypeVar

from nsqpy import NSQ_VERSION, __version__
from nsqpy.client import ConnectionConfig
from nsqpy.daemon import run_event_loop, setup_logging
from nsqpy.goflags import FlagSet, FlagValueError, HelpRequested, Kind, OptionsError

__all__ = [
    "GO_OPTIONS",
    "STRING_ARRAY",
    "client_config",
    "fatal",
    "first_of",
    "parse_flags",
    "parse_flags_known",
    "run_main",
    "user_agent",
    "version_line",
]

T = TypeVar("T")

log = logging.getLogger("nsqpy.tools")

#: NSQ's ``app.StringArray``: a repeatable string flag, each occurrence one item (no comma
#: splitting, unlike the daemons' lists that ``options.Resolve`` re-splits).
STRING_ARRAY = Kind("strarray", "value", lambda s, cur: [*cur, s], repeatable=True)


def _parse_go_option(text: str, current: list[str]) -> list[str]:
    """go-nsq ``ConfigFlag.Set``: ``name,value``, or ``name`` alone for boolean true;
    checked at once (so a bad option is a command-line error, as in Go)."""
    name, sep, value = text.partition(",")
    item = f"{name},{value}" if sep else f"{name},true"
    try:
        ConnectionConfig.from_go_options([item])
    except ValueError as e:
        # checks between options (go-nsq's Validate) wait until all of them are known
        if not any(m in str(e) for m in _CROSS_CHECKS):
            raise FlagValueError(str(e)) from None
    if name.strip().replace("-", "_") == "tls_root_ca_file" and value:
        try:  # go-nsq reads the CA file when the option is set
            with open(value, "rb"):
                pass
        except OSError as e:
            raise FlagValueError(f"open {value}: {(e.strerror or str(e)).lower()}") from None
    return [*current, item]


#: ConnectionConfig errors about a combination of options, not one value.
_CROSS_CHECKS = ("must be less than read_timeout", "both deflate and snappy", "tls_cert and tls_key")


#: ``--consumer-opt`` / ``--producer-opt``: go-nsq ``Config`` option names (REFERENCE §3.5),
#: the connection features included: ``tls_v1``, ``tls_root_ca_file``, ``tls_cert``,
#: ``tls_key``, ``tls_insecure_skip_verify``, ``tls_min_version``, ``snappy``, ``deflate``,
#: ``deflate_level``, ``auth_secret``, ``sample_rate``, ``output_buffer_size``, …
GO_OPTIONS = Kind("goopts", "value", _parse_go_option, repeatable=True)


def version_line(app: str) -> str:
    """What the Go tools print for ``--version``: ``nsq_tail v1.3.0``."""
    return f"{app} v{NSQ_VERSION}"


def user_agent(app: str) -> str:
    """The IDENTIFY user agent, shaped like the Go tools' ``nsq_tail/1.3.0 go-nsq/1.1.0``."""
    return f"{app}/{NSQ_VERSION} nsqpy/{__version__}"


def parse_flags(flags: FlagSet[T], argv: Sequence[str] | None) -> T | int:
    """Parse the command line (``sys.argv[1:]`` by default); an int is the exit code for
    ``-help`` (0) or a bad command line (2), already reported on stderr."""
    parsed = parse_flags_known(flags, argv)
    return parsed if isinstance(parsed, int) else parsed[0]


def parse_flags_known(flags: FlagSet[T], argv: Sequence[str] | None) -> tuple[T, list[str]] | int:
    """:func:`parse_flags`, and the words after the flags (Go's ``fs.Args()``)."""
    args = sys.argv[1:] if argv is None else list(argv)
    try:
        return flags.parse_known(args)
    except HelpRequested as h:
        sys.stderr.write(h.usage)
        return 0
    except OptionsError as e:
        sys.stderr.write(f"{e}\n{flags.usage()}")
        return 2


def client_config(app: str, options: Sequence[str], **overrides: Any) -> ConnectionConfig:
    """The client configuration from ``--*-opt`` items (already checked one by one), with
    the tool's user agent and ``overrides`` applied last, as the Go tools do. Raises
    ValueError (a combination go-nsq's ``Validate`` refuses, TLS files that cannot be
    loaded)."""
    cfg = ConnectionConfig.from_go_options(list(options))
    cfg = cfg.replace(user_agent=user_agent(app), **overrides)
    cfg.check_supported()
    return cfg


def start(flags: FlagSet[T], argv: Sequence[str] | None, app: str) -> T | int:
    """Every tool's first steps, as Go's: parse the command line, answer ``--version``, set up
    the log. An int is the exit code to return at once."""
    opts = parse_flags(flags, argv)
    if isinstance(opts, int):
        return opts
    if getattr(opts, "version", False):
        print(version_line(app))
        return 0
    setup_tool_logging()
    return opts


def setup_tool_logging() -> None:
    """Log to stderr as the Go tools' ``log`` package does (date and time, no prefix)."""
    setup_logging("", "info")


def fatal(msg: str) -> int:
    """``log.Fatal``: log ``msg`` and return exit code 1."""
    log.critical("%s", msg)
    return 1


async def first_of(stop: asyncio.Event, aw: asyncio.Future[T] | asyncio.Task[T]) -> T | None:
    """Wait for ``aw`` unless ``stop`` is set first (then None; ``aw`` is left running)."""
    if stop.is_set():
        return None
    stopper: asyncio.Future[Any] = asyncio.ensure_future(stop.wait())
    waiting: set[asyncio.Future[Any]] = {stopper, aw}
    try:
        await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopper.cancel()
    if aw.done():
        return aw.result()
    return None


def run_main(coro: Coroutine[Any, Any, int]) -> int:
    """Run the tool's coroutine on the daemons' event loop (uvloop); its result is the exit code."""
    result = [1]

    async def wrapper() -> None:
        result[0] = await coro

    run_event_loop(wrapper())
    return result[0]
