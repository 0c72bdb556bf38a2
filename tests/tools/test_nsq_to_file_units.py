"""nsq_to_file's pure parts: Go's strftime/time.Format, the file name format, gzip member
framing, Go's path rules and the command-line leftovers."""

from __future__ import annotations

import gzip
import os
import time
import zlib

import pytest

from nsqpy.tools.nsq_to_file import FLAGSET
from nsqpy.tools.nsq_to_file_logger import FileOptions, GzipMember, compute_filename_format, go_clean, go_join
from nsqpy.tools.nsq_to_file_strftime import go_strftime, strftime_to_go_layout

pytestmark = pytest.mark.timeout(30)

#: 2024-01-02 14:24:05.123450 UTC, a Tuesday, day 2 of the year
NS = 1704205445_123450000


@pytest.fixture
def utc(monkeypatch):
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


@pytest.mark.parametrize(
    "fmt, layout, out",
    [
        ("%Y-%m-%d_%H", "2006-01-02_15", "2024-01-02_14"),  # the default
        ("%Y%m%d%H%M%S", "20060102150405", "20240102142405"),
        ("%y %I %p %a %A %b %B", "06 03 PM Mon Monday Jan January", "24 02 PM Tue Tuesday Jan January"),
        ("%Z %z", "MST -0700", "UTC +0000"),
        ("%j %% %", "%j % %", "%j % %"),  # unknown directives stay as they are
        # Go's layout reads literal text too: a "1" is the month, "Janx" is not a month name
        ("log%Y1", "log20061", "log20241"),
        ("%bx", "Janx", "Janx"),
        ("%S.000 %S.99", "05.000 05.99", "05.123 05.12"),
        ("_%Y", "_2006", "_2024"),
        ("at 3PM", "at 3PM", "at 2PM"),
        ("Z07:00 -07", "Z07:00 -07", "Z +00"),
    ],
)
def test_strftime_is_go_layout(utc, fmt, layout, out):
    assert strftime_to_go_layout(fmt) == layout
    assert go_strftime(fmt, NS) == out


def test_strftime_zone_offsets(monkeypatch):
    monkeypatch.setenv("TZ", "Asia/Kolkata")
    time.tzset()
    try:
        assert go_strftime("%H:%M %z %Z", NS) == "19:54 +0530 IST"
    finally:
        monkeypatch.undo()
        time.tzset()


def test_filename_format_rules():
    base = FileOptions(output_dir="/o", work_dir="/o")
    # no gzip, rotation or work dir: <REV> is dropped
    assert compute_filename_format(base, "t", "web1.example.com", 42) == "t.web1.<DATETIME>.log"
    gz = FileOptions(output_dir="/o", work_dir="/o", gzip=True)
    assert compute_filename_format(gz, "t", "h", 1) == "t.h<REV>.<DATETIME>.log.gz"
    custom = FileOptions(
        output_dir="/o",
        work_dir="/w",
        filename_format="<TOPIC>/<HOST>-<PID><REV>.gz",
        host_identifier="<SHORT_HOST>|<HOSTNAME>",
        gzip=True,
    )
    assert compute_filename_format(custom, "t", "a.b.c", 7) == "t/a|a.b.c-7<REV>.gz"
    for opts in (
        FileOptions(gzip=True, filename_format="x.log"),
        FileOptions(rotate_size=1, filename_format="x.log"),
        FileOptions(rotate_interval=1.0, filename_format="x.log"),
        FileOptions(work_dir="/w", output_dir="/o", filename_format="x.log"),
    ):
        with pytest.raises(ValueError, match="missing <REV> in --filename-format"):
            compute_filename_format(opts, "t", "h", 1)


@pytest.mark.parametrize("level, xfl", [(1, 4), (6, 0), (9, 2)])
def test_gzip_member_framing(level, xfl):
    m = GzipMember(level)
    data = m.compress(b"hello\n") + m.compress(b"world\n") + m.close()
    assert data[:10] == b"\x1f\x8b\x08\x00\x00\x00\x00\x00" + bytes([xfl]) + b"\xff"
    assert gzip.decompress(data) == b"hello\nworld\n"
    assert data[-8:] == (zlib.crc32(b"hello\nworld\n").to_bytes(4, "little") + (12).to_bytes(4, "little"))
    empty = GzipMember(level).close()  # Go's Close of an unused writer: a whole empty member
    assert empty[:10] == data[:10] and gzip.decompress(empty) == b""
    assert gzip.decompress(data + empty + data) == b"hello\nworld\n" * 2


def test_go_paths():
    assert go_join("/var/spool/archive/", "a//b/../c") == "/var/spool/archive/a/c"
    assert go_join("", "x") == "x"
    assert go_join("./w", "f") == "w/f"
    assert go_join() == ""
    assert go_clean("//a") == "/a"
    assert go_clean("") == "."


def test_leftover_args():
    def leftover_args(argv: list[str]) -> list[str]:
        return FLAGSET.parse_known(argv)[1]

    assert leftover_args(["--topic", "t", "--gzip", "extra", "x"]) == ["extra", "x"]
    assert leftover_args(["--topic=t", "-gzip", "--", "y"]) == ["y"]
    assert leftover_args(["--topic", "t"]) == []


def test_compute_uses_this_host_and_pid():
    name = compute_filename_format(FileOptions(filename_format="<HOST>:<PID>"), "t")
    assert name == f"{os.uname().nodename.split('.')[0]}:{os.getpid()}"
