"""Types of the compiled twins of nsqd's per-message loops (``_hot.c``)."""

from collections import deque
from collections.abc import Callable
from typing import Any, TypeVar

M = TypeVar("M")

API_VERSION: int

def set_message_type(cls: type[Any], /) -> None: ...
def set_layout(
    id_length: int, header_size: int, frame_type: int, id_offset: int, body_offset: int, /
) -> None: ...
def decode_mpub(body: bytes | bytearray, max_msg_size: int, max_body_size: int, /) -> list[bytes] | None: ...
def new_messages(
    bodies: list[bytes], ts: int, seq: int, node: int, twepoch: int, timestamp: int, defer: float, /
) -> list[Any] | None: ...
def copy_messages(msgs: list[M], /) -> list[M]: ...
def send_batch(
    queue: deque[M],
    n: int,
    owner: object,
    in_flight: dict[bytes, M],
    entries: deque[tuple[float, M]],
    deadline: float,
    now: float,
    out: list[bytes],
    sample: int = 0,
    randrange: Callable[[int], int] | None = None,
    expire_before: int = 0,
    max_attempts: int = 0,
    rejected: list[M] | None = None,
    /,
) -> tuple[int, int] | None: ...
def expire_front(
    entries: deque[tuple[float, M]], now: float, owner: object, in_flight: dict[bytes, M], /
) -> list[M]: ...
def fin_run(buf: bytearray, pos: int, in_flight: dict[bytes, Any], owner: object, /) -> tuple[int, int]: ...
def parse_line(buf: bytearray, pos: int, /) -> tuple[list[bytes], int] | None: ...
def encode_messages(msgs: list[Any], /) -> list[bytes] | None: ...
def decode_records(records: list[bytes], /) -> list[Any] | None: ...
def frame_records(records: list[bytes], start: int, stop: int, /) -> bytes: ...
def split_records(
    buf: bytes,
    off: int,
    pos: int,
    limit: int,
    want: int,
    min_size: int,
    max_size: int,
    out: list[bytes],
    /,
) -> tuple[int, int, int, int, int | None]: ...
def scan_frames(
    data: bytes, max_size: int, /
) -> tuple[int, list[bytes], bytes, bytes, bytes, int, list[tuple[int, bytes]]] | None: ...
def tune_malloc(mmap_threshold: int, trim_threshold: int, /) -> bool: ...
