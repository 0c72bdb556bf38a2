"""The ``nsqd`` console script: Go-style flags, logging, signals, run until SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import gc
import logging
import platform
import signal
import sys

from .. import NSQ_VERSION, __version__
from .nsqd import NSQD
from .options import (
    HelpRequested,
    Options,
    OptionsError,
    parse_args,
    unbuilt_requested,
    usage,
    validate,
)

LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warn": logging.WARNING,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "fatal": logging.CRITICAL,
}


def version_string(app: str = "nsqd") -> str:
    return f"{app} v{NSQ_VERSION} (nsqpy {__version__}, python {platform.python_version()})"


def setup_logging(prefix: str, level: str) -> None:
    """Log to stderr in NSQ's shape: ``[nsqd] 2006/01/02 15:04:05.000000 INFO: ...``."""
    handler = logging.StreamHandler(sys.stderr)
    fmt = logging.Formatter(
        prefix.replace("%", "%%") + "%(asctime)s.%(msecs)03d000 %(levelname)s: %(message)s",
        datefmt="%Y/%m/%d %H:%M:%S",
    )
    handler.setFormatter(fmt)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(LEVELS.get(level.lower(), logging.INFO))
    logging.addLevelName(logging.WARNING, "WARN")
    logging.addLevelName(logging.CRITICAL, "FATAL")
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)


def fail(msg: str, code: int = 1) -> int:
    print(f"nsqd: {msg}", file=sys.stderr)
    return code


async def serve(opts: Options) -> None:
    nsqd = NSQD(opts)
    await nsqd.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    # the first lines on stdout: where to reach this node
    print(f"nsqd TCP address: {nsqd.tcp_addr_str}", flush=True)
    if nsqd.http_address is not None:
        print(f"nsqd HTTP address: {nsqd.http_addr_str}", flush=True)
    try:
        await stop.wait()
    finally:
        await nsqd.stop()


def tune_gc() -> None:
    """Keep the cyclic GC off the hot path.

    Queued messages are long-lived, acyclic objects; with millions of them the default
    thresholds make the collector re-walk the whole heap over and over. Freeze what start-up
    allocated and collect young objects less often (measured with bench/run.py).
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 50, 100)


def run(opts: Options) -> None:
    """Run the daemon until a signal, on uvloop when available."""
    tune_gc()
    try:
        import uvloop

        uvloop.run(serve(opts))
    except ImportError:  # pragma: no cover - uvloop is a dependency on Linux
        asyncio.run(serve(opts))


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    try:
        opts = parse_args(args)
    except HelpRequested as h:
        print(str(h), file=sys.stderr)
        return 0
    except OptionsError as e:
        # as Go's flag package: the error, then the usage, exit 2
        print(f"{e}\n{usage()}", file=sys.stderr)
        return 2
    if opts.version:
        print(version_string())
        return 0
    try:
        validate(opts)
    except OptionsError as e:
        return fail(str(e))
    unbuilt = unbuilt_requested(opts)
    if unbuilt:
        return fail(
            "not supported yet by this nsqd: "
            + ", ".join(unbuilt)
            + " (the feature is not built; remove the flag to start)"
        )
    setup_logging(opts.log_prefix, opts.log_level)
    logging.getLogger("nsqd").info(version_string())
    try:
        run(opts)
    except (OSError, ValueError, RuntimeError) as e:
        logging.getLogger("nsqd").critical("%s", e)
        return 1
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
