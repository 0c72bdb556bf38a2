"""Optional compiled twins of nsqd's per-message loops, and the switch between them.

``_hot`` (``_hot.c``, plain C on the CPython API) is built by the package's own build when a
C compiler is there (``setup.py``: an optional extension, so a failed build never breaks the
install). Each of its functions has a pure-Python reference beside the code it speeds up,
which stays the definition of the behaviour; the tests run both.

:data:`compiled` says which one runs: False when ``NSQPY_PURE_PYTHON`` is set (to anything
but ``""`` or ``0``), or when ``_hot`` is missing or stale (a warning says so, once, at
import). The callers import ``_hot``'s functions only when :data:`compiled` is true.
"""

from __future__ import annotations

import importlib
import os
import warnings

#: Set it (e.g. ``NSQPY_PURE_PYTHON=1``) to run the pure-Python hot paths.
PURE_PYTHON_ENV = "NSQPY_PURE_PYTHON"

#: The C module's API version this Python code speaks (``_hot.c``'s HOT_API_VERSION).
API_VERSION = 5


def _wanted() -> bool:
    return os.environ.get(PURE_PYTHON_ENV, "").strip() in ("", "0")


def _load() -> tuple[bool, str]:
    """(compiled, why not)."""
    if not _wanted():
        return False, f"{PURE_PYTHON_ENV} is set"
    try:
        _hot = importlib.import_module(__name__ + "._hot")
    except ImportError as e:
        why = f"the compiled hot paths are not built ({e})"
    else:
        if getattr(_hot, "API_VERSION", None) != API_VERSION:
            why = "the compiled hot paths (nsqpy._speedups._hot) are a stale build"
        else:
            from ..protocol.frames import (
                FRAME_TYPE_MESSAGE,
                MESSAGE_BODY_OFFSET,
                MESSAGE_HEADER_SIZE,
                MESSAGE_ID_OFFSET,
                MSG_ID_LENGTH,
            )

            try:
                _hot.set_layout(
                    MSG_ID_LENGTH,
                    MESSAGE_HEADER_SIZE,
                    FRAME_TYPE_MESSAGE,
                    MESSAGE_ID_OFFSET,
                    MESSAGE_BODY_OFFSET,
                )
            except ValueError as e:
                why = f"the compiled hot paths do not match protocol/frames.py ({e})"
            else:
                return True, ""
    warnings.warn(
        f"nsqpy: {why}; running the pure-Python ones (reinstall with a C compiler "
        "to build them: pip install --force-reinstall nsqpy)",
        RuntimeWarning,
        stacklevel=2,
    )
    return False, why


#: True when the compiled functions run, False for the pure-Python references.
compiled, reason = _load()


def describe() -> str:
    """One line for the daemon's start-up log."""
    return "compiled (C)" if compiled else f"pure Python ({reason})"
