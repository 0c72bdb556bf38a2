"""The ``nsqlookupd`` console script: Go-style flags, logging, run until SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

from .. import daemon
from .nsqlookupd import NSQLookupd
from .options import HelpRequested, Options, OptionsError, parse_args, usage, validate

log = logging.getLogger("nsqlookupd")


def fail(msg: str, code: int = 1) -> int:
    print(f"nsqlookupd: {msg}", file=sys.stderr)
    return code


async def serve(opts: Options) -> None:
    lookupd = NSQLookupd(opts)
    await lookupd.start()
    stop = daemon.stop_on_signals()
    if opts.admin_token_file:
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, lookupd.admin_auth.reload)
    try:
        # the first lines on stdout: where to reach this node
        print(f"nsqlookupd TCP address: {lookupd.tcp_addr_str}", flush=True)
        print(f"nsqlookupd HTTP address: {lookupd.http_addr_str}", flush=True)
        await stop.wait()
    finally:
        await lookupd.stop()


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
        print(daemon.version_string("nsqlookupd"))
        return 0
    try:
        validate(opts)
    except OptionsError as e:
        return fail(str(e))
    daemon.setup_logging(opts.log_prefix, opts.log_level)
    log.info(daemon.version_string("nsqlookupd"))
    try:
        daemon.run_event_loop(serve(opts))
    except (OSError, ValueError, RuntimeError) as e:
        log.critical("failed to instantiate nsqlookupd - %s", e)
        return 1
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
