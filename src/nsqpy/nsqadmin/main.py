"""The ``nsqadmin`` console script: Go-style flags, logging, run until SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import logging
import signal
import sys

from .. import daemon
from .nsqadmin import NSQAdmin
from .options import HelpRequested, Options, OptionsError, parse_args, usage

log = logging.getLogger("nsqadmin")


async def serve(opts: Options) -> None:
    admin = NSQAdmin(opts)
    await admin.start()
    stop = daemon.stop_on_signals()
    if opts.admin_token_file or opts.htpasswd_file:
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, admin.reload)
    try:
        # the first line on stdout: where to reach it
        print(f"nsqadmin {admin.scheme.upper()} address: {admin.http_addr_str}", flush=True)
        await stop.wait()
    finally:
        await admin.stop()


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
        print(daemon.version_string("nsqadmin"))
        return 0
    level = opts.log_level if opts.log_level.lower() in daemon.LEVELS else "info"
    daemon.setup_logging(opts.log_prefix, level)
    try:
        daemon.run_event_loop(serve(opts))
    except (OptionsError, OSError, ValueError, RuntimeError) as e:
        # Go: logFatal("failed to instantiate nsqadmin - %s", err)
        log.critical("failed to instantiate nsqadmin - %s", e)
        return 1
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
