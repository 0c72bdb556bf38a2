"""Topic and channel name rules (NSQ's ``internal/protocol/names.go``)."""

from __future__ import annotations

import re

EPHEMERAL_SUFFIX = "#ephemeral"
_NAME_RE = re.compile(r"[.a-zA-Z0-9_-]+(#ephemeral)?")


def is_valid_name(name: str) -> bool:
    """1–64 characters of ``[.a-zA-Z0-9_-]``, optionally ending in ``#ephemeral``."""
    return 0 < len(name) <= 64 and _NAME_RE.fullmatch(name) is not None


is_valid_topic_name = is_valid_name
is_valid_channel_name = is_valid_name


def is_ephemeral(name: str) -> bool:
    return name.endswith(EPHEMERAL_SUFFIX)
