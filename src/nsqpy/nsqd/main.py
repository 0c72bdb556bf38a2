"""The ``nsqd`` console script: Go-style flags, logging, signals, run until SIGTERM/SIGINT."""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import sys

from .. import daemon
from ..daemon import setup_logging
from .nsqd import NSQD, ShutdownError
from .options import (
    HelpRequested,
    Options,
    OptionsError,
    parse_args,
    unbuilt_requested,
    usage,
    validate,
)


def version_string(app: str = "nsqd") -> str:
    return daemon.version_string(app)


def fail(msg: str, code: int = 1) -> int:
    print(f"nsqd: {msg}", file=sys.stderr)
    return code


async def serve(opts: Options) -> None:
    nsqd = NSQD(opts)
    await nsqd.start()
    stop = daemon.stop_on_signals()
    if opts.admin_token_file:
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, nsqd.admin_auth.reload)
    try:
        # the first lines on stdout: where to reach this node
        print(f"nsqd TCP address: {nsqd.tcp_addr_str}", flush=True)
        if nsqd.http_address is not None:
            print(f"nsqd HTTP address: {nsqd.http_addr_str}", flush=True)
        if nsqd.https_address is not None:
            print(f"nsqd HTTPS address: {nsqd.https_addr_str}", flush=True)
        await stop.wait()
    finally:
        await nsqd.stop()
    if nsqd.shutdown_errors:
        raise ShutdownError(nsqd.shutdown_errors)


def tune_gc() -> None:
    """Keep the cyclic GC off the hot path.

    Queued messages are long-lived, acyclic objects; with millions of them the default
    thresholds make the collector re-walk the whole heap over and over. Freeze what start-up
    allocated and collect young objects less often (measured with bench/run.py).
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 50, 100)


#: blocks below this come from malloc's heap, not a mapping of their own (glibc)
MALLOC_MMAP_THRESHOLD = 32 << 20
#: free memory at the top of the heap kept for reuse, not given back to the system (64 MiB
#: still let a consumer's burst of FINs give back pages the next reads fault in again)
MALLOC_TRIM_THRESHOLD = 128 << 20


def tune_malloc() -> bool:
    """Let large message bodies reuse freed memory (compiled builds on glibc).

    glibc maps a block of 128 KiB or more on its own, and gives freed memory back once a
    few MiB of it sit at the top of the heap: a 1 MiB message allocated and freed after
    another then costs a fresh mapping and 256 page faults each time (a third of nsqd's CPU
    publishing 1 MiB messages, measured with perf). Blocks up to MALLOC_MMAP_THRESHOLD
    come from the heap and up to MALLOC_TRIM_THRESHOLD of it is kept instead.
    """
    from .._speedups import compiled

    if not compiled:
        return False
    from .._speedups._hot import tune_malloc as tune

    return tune(MALLOC_MMAP_THRESHOLD, MALLOC_TRIM_THRESHOLD)


def run(opts: Options) -> None:
    """Run the daemon until a signal, on uvloop when available."""
    tune_malloc()
    tune_gc()
    daemon.run_event_loop(serve(opts))


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
