"""Spark's Python processes forked from a preloaded interpreter.

On a local master, Spark starts several Python processes per query (the data source's
creation and read planning, each a daemon; the streaming source's runner; the Python
workers' daemon), each a new interpreter that imports pyspark (~0.1 s of CPU), pyarrow and
this package before it does anything: most of them one after another before a query's
first batch, on a machine whose cores the JVM's compiler keeps busy. A fork server started
with the session imports all of that once; the launcher (:mod:`._launch`, Spark's
``PYSPARK_PYTHON``) asks it for each ``python -m pyspark.…`` process, and the server forks
a child that runs the module with the launcher's standard streams (passed over the Unix
socket), environment, working directory, arguments, ignored signals and soft resource
limits, in a process group of its own. The launcher stays as the process Spark knows:
signals sent to it reach the child, and it exits as the child did. The child dies with the
server (``PR_SET_PDEATHSIG``), and is killed when its launcher goes first (SIGKILL cannot be
passed on).

Only what behaves as a new interpreter would is forked: the launcher falls back to running
the interpreter when the process's environment differs from the server's in a variable
the interpreter reads as it starts (see :func:`._launch.fingerprint`). The server ends when
the pipe on its standard input closes (its session's interpreter ended or stopped it).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import gc
import importlib
import io
import os
import resource
import selectors
import signal
import socket
import struct
import subprocess
import sys
import threading
import traceback
from typing import IO, Any

from . import _launch

__all__ = ["ForkServer", "serve", "start"]

#: What the server imports before it forks anything: what Spark's Python processes for the
#: ``nsq`` source and sink import (a module that fails to import is skipped).
PRELOAD = (
    "pyspark",
    "pyspark.daemon",
    "pyspark.worker",
    "pyspark.sql.worker.lookup_data_sources",
    "pyspark.sql.worker.create_data_source",
    "pyspark.sql.worker.plan_data_source_read",
    "pyspark.sql.worker.write_into_data_source",
    "pyspark.sql.worker.commit_data_source_write",
    "pyspark.sql.worker.python_streaming_sink_runner",
    "pyspark.sql.streaming.python_streaming_source_runner",
    "pyarrow",
    "pyarrow.compute",
    "pyarrow.ipc",
    "nsqpy.spark",
    "nsqpy.spark.datasource",
    "nsqpy.spark.source",
    "nsqpy.spark.consumer",
    "nsqpy.spark.sink",
)
_PR_SET_NAME = 15
_PR_SET_PDEATHSIG = 1
#: Where a fork server can work: Linux (prctl's parent-death signal and process names,
#: descriptors passed over Unix sockets). Elsewhere make_session starts none.
SUPPORTED = sys.platform.startswith("linux") and hasattr(socket, "SCM_RIGHTS")
#: The largest request accepted (arguments and environment).
MAX_REQUEST = 1 << 20


def _prctl(option: int, arg: Any) -> bool:
    try:
        return bool(ctypes.CDLL(None).prctl(option, arg, 0, 0, 0) == 0)
    except (OSError, AttributeError):
        return False


def process_name(argv: list[str]) -> str:
    """The name a child takes (``ps -o comm``, top; at most 15 bytes): the module it runs,
    or for a daemon the module its workers run, less its package."""
    module = argv[2] if argv[1] == "pyspark.daemon" and len(argv) > 2 else argv[1]
    return module.rpartition(".")[2][:15]


class _Server:
    """The fork server's loop: requests on the listening socket, signals to pass on and
    launchers that went (their connections), children that ended (SIGCHLD), and the end of
    its session (standard input)."""

    def __init__(self, listener: socket.socket, control: int) -> None:
        self.listener = listener
        self.control = control
        self.sel = selectors.DefaultSelector()
        #: child pid -> its launcher's connection (None once that is gone)
        self.children: dict[int, socket.socket | None] = {}
        self.conns: dict[socket.socket, int] = {}
        # a new interpreter's path after its first entry (the working directory for -m):
        # the server runs without its own working directory on its path (see start)
        self.base_path = list(sys.path)
        self.pid = os.getpid()
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_w, False)
        os.set_blocking(self.wake_r, False)

    def run(self) -> None:
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        self.sel.register(self.listener, selectors.EVENT_READ, self._accept)
        self.sel.register(self.wake_r, selectors.EVENT_READ, self._reap)
        self.sel.register(self.control, selectors.EVENT_READ, self._control)
        while True:
            for key, _ in self.sel.select():
                try:
                    key.data(key.fileobj)
                except Exception:  # noqa: BLE001 - one request's trouble must not end the server
                    _log(f"error: {traceback.format_exc()}")

    # --- events ---

    def _control(self, _fd: Any) -> None:
        if not os.read(self.control, 4096):
            # the session ended: so do the children (their launchers see the connection go)
            for pid in list(self.children):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            os._exit(0)

    def _reap(self, _fd: Any) -> None:
        with contextlib.suppress(OSError):
            while os.read(self.wake_r, 4096):
                pass
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            conn = self.children.pop(pid, None)
            if conn is not None:
                self._forget(conn)
                with contextlib.suppress(OSError):
                    conn.sendall(_launch.MESSAGE.pack(_launch.ENDED, status))
                conn.close()

    def _forget(self, conn: socket.socket) -> None:
        self.conns.pop(conn, None)
        with contextlib.suppress(KeyError, ValueError):
            self.sel.unregister(conn)

    def _from_launcher(self, conn: socket.socket) -> None:
        pid = self.conns.get(conn)
        try:
            data = conn.recv(_launch.MESSAGE.size)
        except OSError:
            data = b""
        if pid is None:
            return
        if len(data) == _launch.MESSAGE.size:
            kind, signum = _launch.MESSAGE.unpack(data)
            if kind == _launch.SIGNAL:
                with contextlib.suppress(OSError, ValueError):
                    os.kill(pid, signum)
                return
        # the launcher is gone (killed: it would have waited for the child): so goes the child
        self._forget(conn)
        self.children[pid] = None
        conn.close()
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)

    def _accept(self, _listener: Any) -> None:
        try:
            conn, _ = self.listener.accept()
        except OSError:
            return
        fds: list[int] = []
        try:
            creds = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
            _, uid, _ = struct.unpack("3i", creds)
            if uid != os.getuid():
                raise ValueError(f"a request from uid {uid}")
            conn.settimeout(5.0)
            request = self._read_request(conn, fds)
            conn.settimeout(None)
            for stream in (sys.stdout, sys.stderr):
                with contextlib.suppress(Exception):
                    stream.flush()
            pid = os.fork()
        except (OSError, ValueError) as exc:
            for fd in fds:
                with contextlib.suppress(OSError):
                    os.close(fd)
            with contextlib.suppress(OSError):
                conn.sendall(_launch.MESSAGE.pack(_launch.REFUSED, 0))
            conn.close()
            _log(f"a request was refused (the launcher runs the interpreter itself): {exc}")
            return
        if pid == 0:  # pragma: no cover - the child's code is tested through its effects
            self._child(*request, fds, conn)
        for fd in fds:
            os.close(fd)
        self.children[pid] = conn
        self.conns[conn] = pid
        with contextlib.suppress(OSError):
            conn.sendall(_launch.MESSAGE.pack(_launch.STARTED, pid))
        self.sel.register(conn, selectors.EVENT_READ, self._from_launcher)

    @staticmethod
    def _read_request(
        conn: socket.socket, fds: list[int]
    ) -> tuple[list[bytes], dict[bytes, bytes], bytes, list[int], dict[int, int]]:
        """Read a request (its descriptors appended to ``fds`` as they come)."""
        data = b""
        need = 4
        while len(data) < need:
            msg, anc, _flags, _addr = conn.recvmsg(65536, socket.CMSG_SPACE(3 * 4))
            for level, kind, payload in anc:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    n = len(payload) // 4
                    fds += struct.unpack(f"{n}i", payload[: 4 * n])
            if not msg:
                raise ValueError("the launcher closed the connection")
            data += msg
            if len(data) >= 4:
                need = 4 + struct.unpack("!I", data[:4])[0]
                if need > MAX_REQUEST:
                    raise ValueError("request too large")
        if len(fds) != 3:
            raise ValueError(f"{len(fds)} descriptors received, 3 expected")
        argv, env, cwd, ignored, limits = _launch.decode_request(data[4:need])
        if len(argv) < 2 or argv[0] != b"-m":
            raise ValueError("not a -m request")
        return argv, env, cwd, ignored, limits

    # --- the child ---

    def _child(
        self,
        argv: list[bytes],
        env: dict[bytes, bytes],
        cwd: bytes,
        ignored: list[int],
        limits: dict[int, int],
        fds: list[int],
        conn: socket.socket,
    ) -> None:
        """Become ``python -m argv[1] argv[2:]`` as the launcher would have run it."""
        code = 1
        interrupted = False
        try:
            _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
            if os.getppid() != self.pid:
                os._exit(1)  # the server ended before the line above
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            for sig in _launch.FORWARDED:
                if sig in ignored:
                    signal.signal(sig, signal.SIG_IGN)
                else:
                    signal.signal(sig, signal.default_int_handler if sig == signal.SIGINT else signal.SIG_DFL)
            os.setpgid(0, 0)
            for res, soft in limits.items():
                _, hard = resource.getrlimit(res)
                if hard != resource.RLIM_INFINITY and (soft == resource.RLIM_INFINITY or soft > hard):
                    soft = hard  # as high as this process may go
                with contextlib.suppress(OSError, ValueError):
                    resource.setrlimit(res, (soft, hard))
            self.sel.close()
            for s in (self.listener, conn, *self.conns):
                s.close()
            for fd in (self.wake_r, self.wake_w, self.control):
                os.close(fd)
            for i, fd in enumerate(fds):
                os.dup2(fd, i)
            for fd in fds:
                if fd > 2:
                    os.close(fd)
            os.environ.clear()
            for k, v in env.items():
                os.environb[k] = v
            os.chdir(cwd)
            _reset_stdio(bool(env.get(b"PYTHONUNBUFFERED")))
            args = [os.fsdecode(a) for a in argv]
            _prctl(_PR_SET_NAME, process_name(args).encode())
            extra = os.environ.get("PYTHONPATH")
            sys.path[:] = [os.getcwd(), *(extra.split(":") if extra else []), *self.base_path]
            sys.argv = ["-m", *args[2:]]
            # a preloaded module runs as __main__ afresh, as under a new interpreter (left in
            # sys.modules, runpy warns that its second copy "may result in unpredictable
            # behaviour"); what it imported stays loaded
            sys.modules.pop(args[1], None)
            code = _run_module(args[1])
        except SystemExit as exc:
            code = _exit_code(exc)
        except KeyboardInterrupt:
            traceback.print_exc()
            interrupted = True
        except BaseException:  # noqa: BLE001 - as the interpreter: report, exit 1 (never return)
            traceback.print_exc()
            code = 1
        finally:
            code = _finish(code)
            if interrupted:  # as the interpreter does: die of the signal
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                os.kill(os.getpid(), signal.SIGINT)
            os._exit(code)


def _log(message: str) -> None:
    with contextlib.suppress(Exception):
        print(f"nsqpy fork server: {message}", file=sys.stderr, flush=True)


def _run_module(module: str) -> int:
    import runpy

    runner = getattr(runpy, "_run_module_as_main", None)
    if runner is not None:
        runner(module, True)
    else:  # pragma: no cover - CPython has it
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    return 0


def _exit_code(exc: SystemExit) -> int:
    code = exc.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    with contextlib.suppress(Exception):
        print(code, file=sys.stderr)
    return 1


def _finish(code: int) -> int:
    """What the interpreter does as it ends: join non-daemon threads, run exit handlers,
    flush the standard streams."""
    try:
        shutdown = getattr(threading, "_shutdown", None)
        if shutdown is not None:
            shutdown()
        atexit._run_exitfuncs()
    except SystemExit as exc:
        code = _exit_code(exc)
    except BaseException:  # noqa: BLE001 - an exit handler's error is reported, as the interpreter does
        traceback.print_exc()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed pipe: nothing more to say
            code = code or 120
    return code


def _reset_stdio(unbuffered: bool) -> None:
    """New sys.stdin/stdout/stderr over descriptors 0-2 (the launcher's), as a new interpreter
    makes them: the encodings of the server's (the same locale), line buffered on a
    terminal, and without buffers with PYTHONUNBUFFERED."""

    def stream(fd: int, old: Any) -> IO[Any]:
        tty = os.isatty(fd)
        encoding = getattr(old, "encoding", None) or "utf-8"
        errors = getattr(old, "errors", None) or ("backslashreplace" if fd == 2 else "strict")
        if fd == 0:
            raw: Any = io.FileIO(fd, "rb", closefd=False)
            return io.TextIOWrapper(
                io.BufferedReader(raw), encoding=encoding, errors=errors, line_buffering=tty
            )
        raw = io.FileIO(fd, "wb", closefd=False)
        buf = raw if unbuffered else io.BufferedWriter(raw)
        return io.TextIOWrapper(
            buf, encoding=encoding, errors=errors, line_buffering=tty or fd == 2, write_through=unbuffered
        )

    # the interpreter's own references too (what it falls back on), as a new one has them
    for fd, name in enumerate(("stdin", "stdout", "stderr")):
        new = stream(fd, getattr(sys, f"__{name}__"))
        setattr(sys, name, new)
        setattr(sys, f"__{name}__", new)


def serve(fd: int) -> None:
    """The server's main: preload, then fork on request (arriving on the listening socket
    ``fd``; they wait in its backlog meanwhile) until standard input closes."""
    listener = socket.socket(fileno=fd)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - preloading is an optimisation
            pass
    gc.collect()
    gc.freeze()
    _Server(listener, 0).run()


class ForkServer:
    """A running fork server (:func:`start`): its socket, the fingerprint file its children's
    launchers compare against, and its process."""

    def __init__(self, proc: subprocess.Popen[bytes], socket_path: str, fingerprint_path: str) -> None:
        self.proc = proc
        self.socket_path = socket_path
        self.fingerprint_path = fingerprint_path

    def stop(self, timeout: float = 5.0) -> None:
        """End the server (its children go with it) and wait for it."""
        with contextlib.suppress(OSError):
            if self.proc.stdin is not None:
                self.proc.stdin.close()
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def start(directory: str, python: str = sys.executable) -> ForkServer | None:
    """Start a fork server for this interpreter with its socket in ``directory`` (private to
    this user); None where it cannot work (not :data:`SUPPORTED`, or no socket there)."""
    if not SUPPORTED:
        return None
    socket_path = os.path.join(directory, "forkserver.sock")
    fingerprint_path = os.path.join(directory, "forkserver.env")
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    # Spark's workers hash strings with the seed it gives them (PYTHONHASHSEED, "0" unless
    # set): the server's children share the server's
    env["PYTHONHASHSEED"] = os.environ.get("PYTHONHASHSEED", "0")
    with open(fingerprint_path, "wb") as f:
        f.write(_launch.fingerprint({os.fsencode(k): os.fsencode(v) for k, v in env.items()}))
    # the socket listens from now on: requests wait in its backlog while the server starts
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        try:
            listener.bind(socket_path)
        except OSError:  # a path too long for a Unix socket, say: Spark starts interpreters
            return None
        listener.listen(64)
        fd = listener.fileno()
        proc = subprocess.Popen(
            # without the working directory on its path: it is the mirror of SPARK_HOME, whose
            # pyspark subpackages (resource, sql, ...) would shadow top-level modules
            [
                python,
                "-c",
                f"import sys; del sys.path[0]; from nsqpy.spark.forkserver import serve; serve({fd})",
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            env=env,
            cwd=directory,
            start_new_session=True,
            pass_fds=(fd,),
        )
    finally:
        listener.close()
    return ForkServer(proc, socket_path, fingerprint_path)
