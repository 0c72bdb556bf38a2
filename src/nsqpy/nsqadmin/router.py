"""httprouter routes with several parameters (``/api/topics/:topic/:channel``) and a trailing
catch-all (``/static/*asset``), which nsqadmin needs and :class:`nsqpy.httpapi.Router` (one
``:param`` at the end) does not have. Everything else (404/405 JSON bodies, ``Allow``,
``OPTIONS``, the trailing-slash and letter-case redirects, the request log, 500 on a crash) is
the shared router's.
"""

from __future__ import annotations

from aiohttp import web

from ..httpapi import Handler, Params, Response, Router, clean_path

__all__ = ["PatternRouter"]

Route = tuple[Handler, str, bool]
Segments = tuple[str, ...]


def _match(pattern: Segments, parts: list[str], fold: bool = False) -> Params | None:
    """Parameters of ``parts`` (a path split on ``/``) against ``pattern``, or None."""
    params: Params = {}
    for i, seg in enumerate(pattern):
        if seg.startswith("*"):
            rest = "/".join(parts[i:])
            if i >= len(parts) or not rest:
                return None
            params[seg[1:]] = rest
            return params
        if i >= len(parts):
            return None
        part = parts[i]
        if seg.startswith(":"):
            if not part:
                return None
            params[seg[1:]] = part
        elif part != seg and not (fold and part.lower() == seg.lower()):
            return None
    return params if len(parts) == len(pattern) else None


class PatternRouter(Router):
    """:class:`nsqpy.httpapi.Router` whose routes may hold ``:name`` segments anywhere and a
    final ``*name`` segment (the rest of the path, slashes included)."""

    #: nsqadmin's handlers also answer with aiohttp's responses
    response_types: tuple[type, ...] = (Response, web.StreamResponse)

    def __init__(self, log: object) -> None:
        super().__init__(log)  # type: ignore[arg-type]
        #: (segments, method → route), in registration order
        self.patterns: list[tuple[Segments, dict[str, Route]]] = []

    def _add(self, method: str, path: str, route: Route) -> None:
        if "/:" not in path and "/*" not in path:
            self.routes.setdefault(path, {})[method] = route
            return
        segs = tuple(path.split("/"))
        for pattern, table in self.patterns:
            if pattern == segs:
                table[method] = route
                return
        self.patterns.append((segs, {method: route}))

    def _lookup(self, path: str) -> tuple[dict[str, Route] | None, Params]:
        table = self.routes.get(path)
        if table is not None:
            return table, {}
        parts = path.split("/")
        for pattern, ptable in self.patterns:
            params = _match(pattern, parts)
            if params is not None:
                return ptable, params
        return None, {}

    def _fixed_path(self, path: str, method: str) -> str | None:
        """httprouter's redirects: wrong trailing slash, then a case-insensitive match of the
        cleaned path (for the request's method only)."""
        alt = path[:-1] if len(path) > 1 and path.endswith("/") else path + "/"
        if self._has(alt, method):
            return alt
        clean = clean_path(path)
        for cand in (clean, clean[:-1] if len(clean) > 1 and clean.endswith("/") else clean + "/"):
            low = cand.lower()
            for route, table in self.routes.items():
                if method in table and route.lower() == low:
                    return route
            parts = cand.split("/")
            for pattern, ptable in self.patterns:
                if method not in ptable or _match(pattern, parts, fold=True) is None:
                    continue
                fixed = [
                    part if seg.startswith((":", "*")) else seg
                    for seg, part in zip(pattern, parts, strict=False)
                ]
                if pattern[-1].startswith("*"):
                    fixed = [*fixed[:-1], "/".join(parts[len(pattern) - 1 :])]
                return "/".join(fixed)
        return None
