"""The launcher of Spark's Python processes on this machine (see :mod:`.forkserver`).

Run as ``python -IS _launch.py SOCKET FINGERPRINT PYTHON PREFIX ARGS...`` by the
``nsqpy-python`` script that ``make_session`` writes (Spark's ``PYSPARK_PYTHON``), once that
has dropped Spark's jar from PYTHONPATH: standard library only, no site, no package
imports, so that it starts in a few milliseconds. ``ARGS`` are the interpreter arguments
Spark gave (``-m pyspark.daemon pyspark.worker``, ...).

A ``-m PREFIX…`` process (``pyspark.``: Spark's own) whose environment matches the fork
server's (FINGERPRINT, see :func:`fingerprint`) is asked of the fork server at SOCKET: it
forks a child of its preloaded interpreter with this process's standard streams,
environment, working directory, arguments, ignored signals and resource limits, and this
process stands in for it until it ends: signals sent to it are passed on, and it exits as
the child did.
Anything else, or a fork server that does not answer, runs the interpreter PYTHON as usual
(exec), so nothing changes but the time it takes.
"""

from __future__ import annotations

import os
import resource
import signal
import socket
import struct
import sys

# typing's imports cost this launcher a few milliseconds of its start: for the type checker only
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Iterable, Mapping
    from typing import NoReturn

#: Besides PYTHON*, the environment variables the interpreter reads as it starts (the locale
#: decides the encodings). PYTHONUNBUFFERED is applied by the fork server's child itself, and
#: PYTHONHASHSEED is compared on its own: unset, the child keeps the server's seed.
_STARTUP_VARS = (b"LANG", b"LC_ALL", b"LC_CTYPE")
#: Signals passed on to the child (SIGKILL cannot be: the fork server kills the child when
#: this process's connection closes before it ended), and whose disposition the child
#: inherits when this process was started with it ignored.
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)
#: Soft resource limits the child takes from this process (the JVM raises its open files'
#: soft limit, and its children inherit that): open files, core and file sizes, memory.
LIMITS = (
    resource.RLIMIT_NOFILE,
    resource.RLIMIT_CORE,
    resource.RLIMIT_FSIZE,
    resource.RLIMIT_AS,
    resource.RLIMIT_DATA,
)
MAGIC = b"NSQPYFS2"
#: Messages from the fork server: the child's pid, its wait status; a refusal.
STARTED, ENDED, REFUSED = b"P", b"X", b"E"
#: A message to it: pass a signal on.
SIGNAL = b"S"
MESSAGE = struct.Struct("!ci")


def fingerprint(environ: Mapping[bytes, bytes]) -> bytes:
    """What of ``environ`` (bytes to bytes) a fork server's children must share with it, as
    bytes: the hash seed, then one ``NAME=value`` per line, sorted: the interpreter's own
    variables (``PYTHON`` and a letter: ``PYTHON_…`` ones are pyspark's) and the locale's,
    PYTHONPATH with only its entries that exist (Spark lists zips that a mirror of its home
    leaves out)."""
    items = []
    for key, value in environ.items():
        if key in (b"PYTHONUNBUFFERED", b"PYTHONHASHSEED"):
            continue
        if key == b"PYTHONPATH":
            value = b":".join(e for e in value.split(b":") if e and os.path.exists(e))
            if not value:
                continue
        if (key.startswith(b"PYTHON") and key[6:7].isalpha()) or key in _STARTUP_VARS:
            items.append(key + b"=" + value)
    return environ.get(b"PYTHONHASHSEED", b"") + b"\n" + b"\n".join(sorted(items))


def matches(environ: Mapping[bytes, bytes], expected: bytes) -> bool:
    """Whether a process with ``environ`` may be forked by the server whose fingerprint is
    ``expected``: the same variables, and the server's hash seed unless it sets none."""
    seed, _, rest = expected.partition(b"\n")
    own_seed, _, own = fingerprint(environ).partition(b"\n")
    return own == rest and own_seed in (b"", seed)


def encode_request(
    argv: list[bytes],
    environ: Mapping[bytes, bytes],
    cwd: bytes,
    ignored: Iterable[int] = (),
    limits: Mapping[int, int] | None = None,
) -> bytes:
    """The request a launcher sends (its descriptors 0, 1 and 2 go along): NUL-separated
    fields after their length."""
    lims = b",".join(b"%d:%d" % kv for kv in (limits or {}).items())
    fields = [MAGIC, cwd, b",".join(b"%d" % s for s in ignored), lims, b"%d" % len(argv), *argv]
    fields += [b"%d" % len(environ)] + [k + b"=" + v for k, v in environ.items()]
    body = b"\0".join(fields)
    return struct.pack("!I", len(body)) + body


def decode_request(
    body: bytes,
) -> tuple[list[bytes], dict[bytes, bytes], bytes, list[int], dict[int, int]]:
    """``(argv, environ, cwd, ignored signals, soft resource limits)`` of a request body
    (ValueError if it is not one)."""
    fields = body.split(b"\0")
    try:
        if fields[0] != MAGIC:
            raise ValueError("not a fork server request")
        cwd = fields[1]
        ignored = [int(s) for s in fields[2].split(b",") if s]
        limits = {int(k): int(v) for k, _, v in (x.partition(b":") for x in fields[3].split(b",") if x)}
        n = int(fields[4])
        argv = fields[5 : 5 + n]
        m = int(fields[5 + n])
        items = fields[6 + n :]
    except (IndexError, ValueError):
        raise ValueError("malformed fork server request") from None
    if len(argv) != n or len(items) != m:
        raise ValueError("truncated fork server request")
    env = {}
    for item in items:
        key, sep, value = item.partition(b"=")
        if not sep:
            raise ValueError("bad environment entry in a fork server request")
        env[key] = value
    return argv, env, cwd, ignored, limits


def _exec(python: str, args: list[str]) -> NoReturn:
    os.execv(python, [python, *args])


def _receive(sock: socket.socket) -> tuple[bytes, int] | None:
    """The next message from the fork server: (kind, value); None when it is gone."""
    data = b""
    try:
        while len(data) < MESSAGE.size:
            part = sock.recv(MESSAGE.size - len(data))
            if not part:
                return None
            data += part
    except OSError:
        return None
    kind, value = MESSAGE.unpack(data)
    return kind, value


def main(argv: list[str]) -> NoReturn:
    sock_path, expected, python, prefix = argv[1:5]
    args = argv[5:]
    if len(args) < 2 or args[0] != "-m" or not args[1].startswith(prefix):
        _exec(python, args)
    try:
        with open(expected, "rb") as f:
            want = f.read()
    except OSError:
        _exec(python, args)
    env = dict(os.environb)
    if not matches(env, want):
        _exec(python, args)
    ignored = [s for s in FORWARDED if signal.getsignal(s) == signal.SIG_IGN]
    limits = {r: resource.getrlimit(r)[0] for r in LIMITS}
    request = encode_request([os.fsencode(a) for a in args], env, os.getcwdb(), ignored, limits)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(sock_path)
        sock.sendmsg([request], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, struct.pack("3i", 0, 1, 2))])
    except OSError:
        sock.close()
        _exec(python, args)
    started = _receive(sock)
    if started is None or started[0] != STARTED:
        sock.close()
        _exec(python, args)  # refused, or the server is gone: nothing was started
    # the child has this process's streams now: holding them open would keep the JVM from
    # seeing the end of the child's output when it ends
    null = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(null, fd)
    os.close(null)

    def forward(signum: int, frame: object) -> None:
        try:
            sock.send(MESSAGE.pack(SIGNAL, signum))
        except OSError:
            pass

    for sig in FORWARDED:
        signal.signal(sig, forward)
    ended = _receive(sock)
    if ended is None or ended[0] != ENDED:
        os._exit(1)  # the fork server went away (its children go with it)
    status = ended[1]
    if os.WIFSIGNALED(status):
        signal.signal(os.WTERMSIG(status), signal.SIG_DFL)
        os.kill(os.getpid(), os.WTERMSIG(status))
    os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 1)


if __name__ == "__main__":
    main(sys.argv)
