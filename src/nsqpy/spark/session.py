"""Build a SparkSession that stays on loopback and uses this interpreter for Python workers.

pyspark is an optional dependency (``pip install nsqpy[spark]``); importing this module
without it raises an ImportError that says so.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib.machinery
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import zipfile
from typing import Any

try:
    from pyspark.sql import SparkSession
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError("nsqpy.spark needs pyspark: pip install 'nsqpy[spark]'") from exc

from . import _launch, forkserver
from .forkserver import ForkServer


def _is_this_interpreter(python: str) -> bool:
    found = shutil.which(python)
    return found is not None and os.path.abspath(found) == os.path.abspath(sys.executable)


# --- Python processes import pyspark from the installed package -----------------------------
#
# Spark puts $SPARK_HOME/python/lib/pyspark.zip and py4j's source zip first on the path of
# every Python process it starts: the workers, and per query the data source planners and
# the streaming source's runner. Modules imported from a zip have no bytecode cache, so each
# of those processes compiles the pyspark modules it needs from source: 1.5-2 s of CPU
# apiece on a small machine, several of them before a query's first batch. When the very
# same pyspark and py4j are installed in the interpreter the processes run (``pip install
# pyspark``, PYSPARK_PYTHON = this interpreter, a local master), the JVM is started with a
# SPARK_HOME that is the real one without those two zips (symbolic links to everything
# else), and the processes import the installed, compiled package.


def _is_spark_zip(name: str) -> bool:
    return name == "pyspark.zip" or (name.startswith("py4j-") and name.endswith("-src.zip"))


def _read(path: str) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return None


def _zip_member(zip_path: str, member: str) -> bytes | None:
    try:
        with zipfile.ZipFile(zip_path) as z:
            return z.read(member)
    except (OSError, KeyError, zipfile.BadZipFile):
        return None


def same_release_installed(zip_path: str, path: list[str] | None = None) -> bool:
    """Whether the package in Spark's ``zip_path`` (pyspark.zip or py4j-*-src.zip) is
    importable from ``path`` (default ``sys.path``) without the zip, in the same release
    (its ``version.py`` byte for byte the zip's)."""
    pkg = "pyspark" if os.path.basename(zip_path) == "pyspark.zip" else "py4j"
    search = [p for p in (sys.path if path is None else path) if not _is_spark_zip(os.path.basename(p))]
    spec = importlib.machinery.PathFinder.find_spec(pkg, search)
    if spec is None or not spec.submodule_search_locations:
        return False
    pkg_dir = next(iter(spec.submodule_search_locations))
    zipped = _zip_member(zip_path, f"{pkg}/version.py")
    return zipped is not None and zipped == _read(os.path.join(pkg_dir, "version.py"))


SHADOW_PREFIX = "nsqpy-spark-home-"


def _remove_stale(parent: str) -> None:
    """Remove this user's mirrors left by processes that are gone (killed before their
    exit handlers ran)."""
    try:
        names = os.listdir(parent)
    except OSError:
        return
    for name in names:
        pid = name[len(SHADOW_PREFIX) :].split("-", 1)[0]
        if not name.startswith(SHADOW_PREFIX) or not pid.isdigit():
            continue
        path = os.path.join(parent, name)
        try:
            if os.lstat(path).st_uid != os.getuid():
                continue
            os.kill(int(pid), 0)
            continue  # still running
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)  # links only: rmtree does not follow them
        except OSError:
            continue


def spark_home_without_zips(home: str, parent: str | None = None) -> str | None:
    """A new directory that mirrors the Spark installation ``home`` with symbolic links,
    less ``python/lib``'s pyspark and py4j zips; None (nothing created) when ``home`` has
    no such zips or when a zip's package is not installed here in the same release."""
    lib = os.path.join(home, "python", "lib")
    try:
        zips = [os.path.join(lib, n) for n in os.listdir(lib) if _is_spark_zip(n)]
    except OSError:
        return None
    if not zips or not all(same_release_installed(z) for z in zips):
        return None
    parent = parent or tempfile.gettempdir()
    _remove_stale(parent)
    shadow = tempfile.mkdtemp(prefix=f"{SHADOW_PREFIX}{os.getpid()}-", dir=parent)
    try:
        for level in ("", "python", os.path.join("python", "lib")):
            src = os.path.join(home, level)
            dst = os.path.join(shadow, level)
            os.makedirs(dst, exist_ok=True)
            for name in os.listdir(src):
                if (level == "" and name == "python") or (level == "python" and name == "lib"):
                    continue
                if level.endswith("lib") and _is_spark_zip(name):
                    continue
                os.symlink(os.path.realpath(os.path.join(src, name)), os.path.join(dst, name))
    except OSError:
        shutil.rmtree(shadow, ignore_errors=True)
        return None
    return shadow


# --- ... and without reading Spark's jar as a zip ----------------------------------------------
#
# Spark also puts its spark-core jar on the path of every one of those processes (for a
# pyspark packed inside it, which pip's is not). Python then opens the jar as a zip: its
# directory of ~6,000 entries is read in pure Python (~35 ms of CPU) at the process's first
# import, and again for every importlib.invalidate_caches(), which pyspark calls in each
# process before its first task. Measured: 60-100 ms of CPU per process, ten processes per
# cold query (the data source lookup, creation and read planning, each a daemon and its
# fork, the runner, the read workers' daemon and forks), most of them one after another
# before the first batch. With the mirror above, the processes are started through a
# launcher in it (``PYSPARK_PYTHON``, for the JVM and the SparkContext) that drops that jar
# from PYTHONPATH and execs this interpreter. Only for a local master or a standalone one on
# loopback: executors elsewhere could not run a launcher that lives on this machine.
#
# --- ... and forked from an interpreter that has imported them already -------------------------
#
# Each of those processes still paid a new interpreter and pyspark's import (~0.1 s of CPU),
# and the forks of pyarrow and this package: on 2 cores, with the JVM's compiler busy, a
# second or so of a cold query's start. The launcher asks a fork server started with the
# session (:mod:`.forkserver`), which imported all of that once, for each ``-m pyspark.…``
# process, and runs the interpreter itself whenever the server could not stand in for it.

LAUNCHER = "nsqpy-python"
#: Set to 0, make_session starts no fork server (:mod:`.forkserver`): every Python process
#: Spark starts is a new interpreter.
FORK_SERVER_ENV = "NSQPY_FORK_SERVER"


def can_run_launcher(directory: str) -> bool:
    """Whether a launcher written in ``directory`` could run: /bin/sh exists and the file
    system is not mounted noexec."""
    if not os.path.exists("/bin/sh"):
        return False
    try:
        return not os.statvfs(directory).f_flag & os.ST_NOEXEC
    except OSError:
        return False


def python_launcher(directory: str, python: str, fork_server: ForkServer | None = None) -> str | None:
    """Write ``directory/nsqpy-python``: a shell script that runs ``python`` with every
    ``spark-core_*.jar`` entry removed from PYTHONPATH (the others kept, in order), through
    ``fork_server`` when one is given (:mod:`._launch`). Returns its path; None (nothing
    written) where it could not run: a file system mounted noexec, or no /bin/sh."""
    if not can_run_launcher(directory):
        return None
    path = os.path.join(directory, LAUNCHER)
    script = (
        "#!/bin/sh\n"
        "# nsqpy (nsqpy.spark.session): run Python without Spark's spark-core jar on its path\n"
        "set -f\n"
        "kept=\n"
        "first=1\n"
        "IFS=:\n"
        "for entry in $PYTHONPATH; do\n"
        "  case $entry in\n"
        "    */spark-core_*.jar) ;;\n"
        '    *) if [ $first = 1 ]; then kept=$entry; first=0; else kept="$kept:$entry"; fi ;;\n'
        "  esac\n"
        "done\n"
        "unset IFS\n"
        "if [ $first = 0 ]; then PYTHONPATH=$kept; export PYTHONPATH; else unset PYTHONPATH; fi\n"
    )
    if fork_server is None:
        script += f'exec {shlex.quote(python)} "$@"\n'
    else:
        socket_path, fingerprint_path = fork_server.socket_path, fork_server.fingerprint_path
        args = (python, "-IS", _launch.__file__, socket_path, fingerprint_path, python, "pyspark.")
        script += f'exec {" ".join(shlex.quote(a) for a in args)} "$@"\n'
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(script)
        os.chmod(path, 0o755)
    except OSError:
        return None
    return path


def _jvm_running() -> bool:
    from pyspark import SparkContext

    return SparkContext._gateway is not None


# --- the JVM in a session of its own ----------------------------------------------------------
#
# pyspark starts the JVM (spark-submit, which execs java) as a child of this process, in this
# process's process group. A signal sent to the whole group (Ctrl-C in a terminal, `timeout`,
# `kill -- -PGID`, a supervisor stopping a process group) then reaches the JVM too, and a
# SIGTERM runs its shutdown hooks: the SparkContext stops under the running query, which
# fails with py4j errors before this process has handled the signal. So the JVM is started
# in a new session (setsid: its own process group, no controlling terminal) and only this
# process decides when it stops. It still cannot outlive this process: pyspark gives it a
# pipe as stdin and the JVM exits when that pipe reaches EOF, which happens whenever this
# process ends, however it ends (SIGKILL included), because nothing else holds the pipe.
# At exit, stop_jvm closes the pipe and waits for the JVM, so it is gone when this process
# is. (A systemd unit's cgroup still holds it: KillMode=control-group is unaffected.)

#: The py4j gateway of the JVM this interpreter started (None: none, or one that someone else
#: started, e.g. spark-submit running this program); ``.proc`` is the JVM's Popen.
_own_gateway: Any = None


def _launch_jvm(options: dict[str, str]) -> None:
    """Start the JVM (spark-submit with ``options`` as ``--conf``, as SparkContext would) in a
    new session, and the SparkContext on it."""
    global _own_gateway
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    conf = SparkConf()
    conf.setAll(list(options.items()))
    _own_gateway = launch_gateway(  # type: ignore[no-untyped-call]  # pyspark's is untyped
        conf, popen_kwargs={"start_new_session": True}
    )
    # registered after the SPARK_HOME mirror's removal: exit handlers run last-in first-out,
    # so the JVM has exited before the links it reads jars through go
    atexit.register(stop_jvm)
    try:
        SparkContext(conf=conf, gateway=_own_gateway)
    except BaseException:
        stop_jvm()
        raise


def jvm_pid() -> int | None:
    """The process id of the JVM this interpreter started and that still runs, else None."""
    proc = getattr(_own_gateway, "proc", None)
    return proc.pid if proc is not None and proc.poll() is None else None


def stop_jvm(timeout: float = 30.0) -> None:
    """Stop the active SparkContext, if any, and the JVM this interpreter started, and wait
    until that has exited (``timeout`` s, then SIGKILL). A later make_session starts a new
    JVM. Does nothing when this interpreter did not start the JVM."""
    global _own_gateway
    from pyspark import SparkContext

    gateway, _own_gateway = _own_gateway, None
    if gateway is None:
        return
    active = SparkContext._active_spark_context
    if active is not None:
        with contextlib.suppress(Exception):  # the JVM goes anyway
            active.stop()
    with SparkContext._lock:
        if SparkContext._gateway is gateway:
            SparkContext._gateway = None
            SparkContext._jvm = None
    with contextlib.suppress(Exception):
        gateway.shutdown()  # py4j's connections and its callback server (foreachBatch)
    proc = gateway.proc
    if proc is None:
        return
    with contextlib.suppress(OSError):
        proc.stdin.close()  # EOF: the gateway server exits (System.exit: shutdown hooks run)
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _on_loopback(master: str) -> bool:
    """Whether a standalone master URL (``spark://host:port[,host:port]``) is on loopback: the
    driver then binds to 127.0.0.1 too (its executors are on this machine)."""
    if not master.startswith("spark://"):
        return False
    hosts = [hp.rpartition(":")[0] for hp in master.removeprefix("spark://").split(",")]
    return all(h in ("127.0.0.1", "localhost", "[::1]") for h in hosts)


#: Spark's log (log4j2) while this package starts the JVM: its messages at ``level`` and
#: above on stderr, as Spark's default profile writes them, without that profile's banner
#: ("Using Spark's default log4j profile", "Setting default log level"); Hadoop's notice that
#: it has no native library for this platform is not a warning of anything to fix
LOG4J2 = """\
# written by nsqpy.spark.session.make_session
rootLogger.level = {level}
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{{yy/MM/dd HH:mm:ss}} %p %c{{1}}: %m%n%ex
logger.hadoop_native.name = org.apache.hadoop.util.NativeCodeLoader
logger.hadoop_native.level = error
"""


def write_log_config(spark_home: str, level: str) -> bool:
    """``spark_home/conf/log4j2.properties`` (Spark's conf directory when nothing else is
    set) for ``level`` (log4j's name: warn, info, debug…), unless the installation has a
    conf directory of its own (its settings are the user's). Whether it was written."""
    conf = os.path.join(spark_home, "conf")
    if os.path.lexists(conf):
        return False
    os.makedirs(conf)
    with open(os.path.join(conf, "log4j2.properties"), "w", encoding="utf-8") as f:
        f.write(LOG4J2.format(level=level))
    return True


def make_session(
    master: str = "local[*]",
    app_name: str = "nsqpy",
    conf: dict[str, str] | None = None,
    loopback: bool = True,
    log_level: str = "warn",
) -> Any:
    """Return a SparkSession (``getOrCreate``) with the ``nsq`` format registered.

    With ``loopback`` (the default for ``local[...]`` masters and a standalone master on
    127.0.0.1) the driver binds to 127.0.0.1 only. Python workers run this interpreter
    unless PYSPARK_PYTHON is set; when they do, on a local or standalone master, the
    Python processes on this machine import pyspark from the installed package, and on a
    local master or a standalone one on loopback they run without Spark's jar on their
    path (see above). Spark logs at ``log_level`` (log4j's levels) and above, without its
    start-up banner, when this call starts the JVM on this machine (and neither
    SPARK_CONF_DIR nor the installation has a conf directory).
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    options = {"spark.master": master, "spark.app.name": app_name}
    local = master.startswith("local")
    if loopback and (local or _on_loopback(master)):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        options.update({"spark.driver.bindAddress": "127.0.0.1", "spark.driver.host": "127.0.0.1"})
    options.update(
        {
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",
            "spark.sql.shuffle.partitions": "4",
            "spark.sql.session.timeZone": "UTC",
        }
    )
    options.update(conf or {})
    builder = SparkSession.builder
    for key, value in options.items():
        builder = builder.config(key, value)
    launch = not _jvm_running() and "PYSPARK_GATEWAY_PORT" not in os.environ
    shadow = None
    saved_home = os.environ.get("SPARK_HOME")
    saved_python = os.environ.get("PYSPARK_PYTHON")
    # the mirror serves this machine's Python processes (a standalone cluster's executors use
    # their worker's SPARK_HOME; YARN and Kubernetes ship pyspark's zip from SPARK_HOME)
    same_machine = local or master.startswith("spark://")
    if same_machine and _is_this_interpreter(os.environ["PYSPARK_PYTHON"]) and launch:
        from pyspark.find_spark_home import _find_spark_home

        shadow = spark_home_without_zips(_find_spark_home())
        if shadow is not None:
            # links only (rmtree does not follow them); the JVM reads jars through them
            # for as long as it runs, so they go when this interpreter exits
            atexit.register(shutil.rmtree, shadow, True)
            os.environ["SPARK_HOME"] = shadow
            if not os.environ.get("SPARK_CONF_DIR"):
                try:
                    write_log_config(shadow, log_level)
                except OSError:
                    pass  # Spark's default profile, banner and all
            launcher = None
            if local or _on_loopback(master):
                wanted = os.environ.get(FORK_SERVER_ENV, "1") != "0"
                server = forkserver.start(shadow) if wanted and can_run_launcher(shadow) else None
                if server is not None:
                    atexit.register(server.stop)  # after the JVM's stop (last in, first out)
                launcher = python_launcher(shadow, sys.executable, server)
            if launcher is not None:
                # the JVM (data source lookup) and the SparkContext (every Python function)
                # read it when they start; the user's environment gets its own value back
                os.environ["PYSPARK_PYTHON"] = launcher
    try:
        if launch:
            _launch_jvm(options)  # in a session of its own (see above)
        spark = builder.getOrCreate()
    finally:
        if shadow is not None:  # only the JVM and the SparkContext (started by now) needed them
            for name, saved in (("SPARK_HOME", saved_home), ("PYSPARK_PYTHON", saved_python)):
                if saved is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = saved
    spark.sparkContext.setLogLevel(log_level.upper())
    from nsqpy.spark import register

    register(spark)
    return spark
