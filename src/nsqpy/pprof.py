"""Python equivalents of Go's ``net/http/pprof`` endpoints (``/debug/pprof``), which tools may
probe on every NSQ daemon: the index, ``cmdline``, ``goroutine`` (thread stacks and asyncio
tasks), ``heap`` (tracemalloc and memory counters) and ``profile`` (cProfile of the loop).
"""

from __future__ import annotations

import asyncio
import gc
import io
import sys
import threading
import traceback
from collections.abc import Callable
from typing import Any

from .httpapi import RAW, TEXT_TYPE, Params, Response, Router, get_param, parse_query, raw_query


def respond_plain(text: str, status: int = 200) -> Response:
    """Text with its type set, as Go's pprof handlers answer."""
    return Response(status, text.encode(), {"Content-Type": TEXT_TYPE})


class Pprof:
    """Python equivalents of Go's ``net/http/pprof`` handlers, answered in plain text:

    the index, ``cmdline`` (argv, NUL-separated), ``goroutine`` (thread stacks and asyncio
    tasks), ``heap`` (tracemalloc top allocation sites when tracing, plus memory and GC
    counters) and ``profile?seconds=N`` (cProfile of the event loop for N seconds, pstats
    text). ``symbol``, ``block`` and ``threadcreate`` have no Python meaning and are not
    routed (404 ``NOT_FOUND``).
    """

    def __init__(
        self,
        app: str,
        mem_stats: Callable[[], dict[str, int]] | None = None,
        extra_index: str = "",
    ) -> None:
        self.app = app
        self.mem_stats = mem_stats
        self.extra_index = extra_index
        self._profiling = False

    def install(self, router: Router, index_path: str = "/debug/pprof/", access: str | None = None) -> None:
        """Route the index at ``index_path`` and the profiles under ``/debug/pprof/``, for
        ``access`` (see :data:`nsqpy.httpapi.ACCESS_LEVELS`)."""
        r = router.route
        r("GET", index_path, self.pprof_index, RAW, logged=False, access=access)
        r("GET", "/debug/pprof/cmdline", self.pprof_cmdline, RAW, logged=False, access=access)
        r("GET", "/debug/pprof/goroutine", self.pprof_goroutine, RAW, logged=False, access=access)
        r("GET", "/debug/pprof/heap", self.pprof_heap, RAW, logged=False, access=access)
        r("GET", "/debug/pprof/profile", self.pprof_profile, RAW, logged=False, access=access)

    async def pprof_index(self, request: Any, params: Params) -> Any:
        return respond_plain(
            "nsqpy debug endpoints (Python equivalents of Go's pprof):\n\n"
            "/debug/pprof/cmdline     the command line, NUL-separated\n"
            "/debug/pprof/goroutine   stacks of every thread and asyncio task\n"
            "/debug/pprof/heap        tracemalloc top allocation sites (when tracing)\n"
            "/debug/pprof/profile     cProfile of the event loop; ?seconds=N (default 30)\n"
            + self.extra_index
        )

    async def pprof_cmdline(self, request: Any, params: Params) -> Any:
        return respond_plain("\x00".join(sys.argv))

    async def pprof_goroutine(self, request: Any, params: Params) -> Any:
        out = io.StringIO()
        frames = sys._current_frames()
        for th in threading.enumerate():
            out.write(f"thread {th.name} (ident {th.ident}{', daemon' if th.daemon else ''}):\n")
            frame = frames.get(th.ident) if th.ident is not None else None
            if frame is not None:
                out.writelines(traceback.format_stack(frame))
            out.write("\n")
        tasks = asyncio.all_tasks()
        out.write(f"asyncio tasks: {len(tasks)}\n\n")
        for task in tasks:
            out.write(f"{task!r}:\n")
            out.writelines(traceback.format_list(_await_stack(task.get_coro())))
            out.write("\n")
        return respond_plain(out.getvalue())

    async def pprof_heap(self, request: Any, params: Params) -> Any:
        import tracemalloc  # (the debug endpoints' modules load with their first use)

        out = io.StringIO()
        if tracemalloc.is_tracing():
            snap = tracemalloc.take_snapshot()
            top = snap.statistics("lineno")
            total = sum(s.size for s in top)
            out.write(f"tracemalloc: {total} bytes in {len(top)} allocation sites\n\n")
            for s in top[:100]:
                out.write(f"{s}\n")
        else:
            out.write(
                f"tracemalloc is not tracing; start {self.app} with PYTHONTRACEMALLOC=1 "
                "(or -X tracemalloc) for allocation sites\n\n"
            )
        counters = (
            self.mem_stats() if self.mem_stats is not None else {"heap_objects": sys.getallocatedblocks()}
        )
        for key, value in counters.items():
            out.write(f"{key} {value}\n")
        out.write(f"gc_count {gc.get_count()}\ngc_threshold {gc.get_threshold()}\n")
        for gen, st in enumerate(gc.get_stats()):
            out.write(f"gc_generation_{gen} {st}\n")
        return respond_plain(out.getvalue())

    async def pprof_profile(self, request: Any, params: Params) -> Any:
        values, _ = parse_query(raw_query(request))
        try:
            seconds = float(get_param(values, "seconds") or "0")
        except ValueError:
            seconds = 0.0
        if not 0 < seconds < float("inf"):
            seconds = 30.0
        import cProfile
        import pstats

        if self._profiling:
            return respond_plain("Could not enable CPU profiling: cpu profiling already in use\n", 500)
        prof = cProfile.Profile()
        try:
            prof.enable()
        except ValueError as e:  # another profiler owns this thread
            return respond_plain(f"Could not enable CPU profiling: {e}\n", 500)
        self._profiling = True
        try:
            await asyncio.sleep(seconds)
        finally:
            prof.disable()
            self._profiling = False
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(100)
        return respond_plain(out.getvalue())


def _await_stack(coro: Any) -> traceback.StackSummary:
    """The frames of a coroutine and everything it awaits (outermost first)."""
    frames = []
    while coro is not None:
        frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
        if frame is not None:
            frames.append((frame, frame.f_lineno))
        coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
    return traceback.StackSummary.extract(iter(frames))
