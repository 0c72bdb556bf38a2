"""make_session's set-up: on a local master, the Python processes Spark starts (workers, the
data source planners, the streaming source's runner) import pyspark from the installed
package (compiled once, cached) rather than from Spark's pyspark.zip, and run without Spark's
spark-core jar on their path (Python would read it as a zip)."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import pyspark
import pytest
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from nsqpy.spark.session import (
    LAUNCHER,
    _is_this_interpreter,
    python_launcher,
    same_release_installed,
    spark_home_without_zips,
)

SITE = str(Path(pyspark.__file__).parent.parent)
HOME = Path(pyspark.__file__).parent  # pip's layout: the package is SPARK_HOME
ZIPS = HOME / "python" / "lib"


def _fake_zip(path: Path, pkg: str, version: bytes) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{pkg}/__init__.py", b"")
        z.writestr(f"{pkg}/version.py", version)
    return str(path)


def test_same_release_installed(tmp_path: Path) -> None:
    real = sorted(str(p) for p in ZIPS.glob("*.zip"))
    assert any(p.endswith("pyspark.zip") for p in real) and any("py4j-" in p for p in real)
    for z in real:
        assert same_release_installed(z, [z, SITE])
    # a zip of another release
    other = _fake_zip(tmp_path / "other" / "pyspark.zip", "pyspark", b'__version__ = "0.0.1"\n')
    assert not same_release_installed(other, [other, SITE])
    # no installed pyspark besides the zip (a cluster node with SPARK_HOME only)
    same = (HOME / "version.py").read_bytes()
    only_zip = _fake_zip(tmp_path / "only" / "pyspark.zip", "pyspark", same)
    assert not same_release_installed(only_zip, [only_zip, str(tmp_path / "empty")])


def test_spark_home_without_zips(tmp_path: Path) -> None:
    shadow = spark_home_without_zips(str(HOME), str(tmp_path))
    assert shadow is not None
    try:
        s = Path(shadow)
        for name in ("bin", "jars", "version.py"):
            assert (s / name).is_symlink() and (s / name).resolve() == (HOME / name).resolve()
        assert not (s / "python").is_symlink() and not (s / "python" / "lib").is_symlink()
        assert not list((s / "python" / "lib").glob("*.zip"))
        assert (s / "bin" / "spark-submit").exists()
    finally:
        shutil.rmtree(shadow)
    assert (HOME / "bin" / "spark-submit").exists()  # removing the links left the real files

    # another release's zip: nothing is created
    fake = tmp_path / "fake-home"
    (fake / "jars").mkdir(parents=True)
    _fake_zip(fake / "python" / "lib" / "pyspark.zip", "pyspark", b'__version__ = "0.0.1"\n')
    before = set(tmp_path.iterdir())
    assert spark_home_without_zips(str(fake), str(tmp_path)) is None
    assert set(tmp_path.iterdir()) == before
    # no zips at all: nothing to do
    assert spark_home_without_zips(str(tmp_path / "no-such-home"), str(tmp_path)) is None


def test_mirrors_of_processes_that_are_gone_are_removed(tmp_path: Path) -> None:
    import subprocess

    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
    ).stdout.strip()
    stale = tmp_path / f"nsqpy-spark-home-{gone}-abc"
    (stale / "python").mkdir(parents=True)
    (stale / "jars").symlink_to(HOME / "jars")
    alive = tmp_path / f"nsqpy-spark-home-{os.getpid()}-def"
    alive.mkdir()
    other = tmp_path / "nsqpy-spark-home-x"
    other.mkdir()
    shadow = spark_home_without_zips(str(HOME), str(tmp_path))
    assert shadow is not None and Path(shadow).name.startswith(f"nsqpy-spark-home-{os.getpid()}-")
    assert not stale.exists() and alive.exists() and other.exists()
    assert (HOME / "jars").is_dir()  # the link went, not what it pointed to
    shutil.rmtree(shadow)


def test_is_this_interpreter() -> None:
    assert _is_this_interpreter(sys.executable)
    assert not _is_this_interpreter(os.path.join(os.path.dirname(sys.executable), "no-such-python"))


def test_workers_import_pyspark_from_the_package(spark: Any) -> None:
    def where(_: Any) -> Any:
        import pyspark as p

        yield p.__file__

    files = set(spark.sparkContext.parallelize(range(4), 2).mapPartitions(where).collect())
    assert files == {pyspark.__file__}, files
    # the user's environment is as it was
    assert os.environ.get("SPARK_HOME", "") == "" or "nsqpy-spark-home-" not in os.environ["SPARK_HOME"]
    assert os.environ["PYSPARK_PYTHON"] == sys.executable


def test_planner_processes_import_pyspark_from_the_package(spark: Any) -> None:
    # defined here, so that it is pickled by value to the planner process
    class _WhereSource(DataSource):
        """A data source whose schema, computed in Spark's planner process, names the file
        that process imported pyspark from."""

        @classmethod
        def name(cls) -> str:
            return "nsqpy_test_where"

        def schema(self) -> str:
            import pyspark as p

            return "from_package BOOLEAN" if ".zip" not in p.__file__ else "from_zip BOOLEAN"

    spark.dataSource.register(_WhereSource)
    assert spark.read.format("nsqpy_test_where").load().schema.names == ["from_package"]


def test_the_jvm_has_a_session_of_its_own(spark: Any) -> None:
    """Signals to this process's group (Ctrl-C, ``timeout``, ``kill -- -PGID``) do not reach
    the JVM: it leads a session and process group of its own."""
    from nsqpy.spark.session import jvm_pid

    pid = jvm_pid()
    assert pid is not None
    assert os.getsid(pid) == pid and os.getpgid(pid) == pid
    assert os.getpgid(pid) != os.getpgid(0)


def _run_launcher(launcher: str, pythonpath: str | None) -> str | None:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    code = "import os, sys; print(repr(os.environ.get('PYTHONPATH')), sys.executable)"
    out = subprocess.run([launcher, "-c", code], env=env, capture_output=True, text=True, check=True)
    value, python = out.stdout.strip().rsplit(" ", 1)
    assert python == sys.executable
    return ast.literal_eval(value)  # type: ignore[no-any-return]


def test_python_launcher_drops_only_the_spark_core_jar(tmp_path: Path) -> None:
    launcher = python_launcher(str(tmp_path), sys.executable)
    assert launcher == str(tmp_path / LAUNCHER)
    jar = "/opt/spark/jars/spark-core_2.13-4.3.0.jar"
    assert _run_launcher(launcher, jar) is None
    assert _run_launcher(launcher, None) is None
    # the other entries stay, in order, spaces, globs and other jars included
    assert _run_launcher(launcher, f"/a b/c:{jar}:/d*:/e.jar") == "/a b/c:/d*:/e.jar"
    assert _run_launcher(launcher, f":/a::{jar}:/b") == ":/a::/b"


def test_python_launcher_not_written_where_it_could_not_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    class NoExec:
        f_flag = os.ST_NOEXEC

    monkeypatch.setattr(os, "statvfs", lambda _path: NoExec())
    assert python_launcher(str(tmp_path), sys.executable) is None
    assert not (tmp_path / LAUNCHER).exists()


def _ask_spark_processes(spark: Any, name: str, probe: Any) -> tuple[str, list[str]]:
    """What ``probe()`` (pickled by value) answers in the planner process that asks a data
    source for its schema, and in the read workers of its two partitions."""

    class _ProbeReader(DataSourceReader):
        def partitions(self) -> list[InputPartition]:
            return [InputPartition(0), InputPartition(1)]

        def read(self, partition: InputPartition) -> Any:
            yield (probe(),)

    class _ProbeSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return name

        def schema(self) -> str:
            return f"`{probe()}` STRING"

        def reader(self, schema: Any) -> DataSourceReader:
            return _ProbeReader()

    spark.dataSource.register(_ProbeSource)
    df = spark.read.format(name).load()
    return df.schema.names[0], [r[0] for r in df.collect()]


def test_python_processes_run_without_the_spark_core_jar(spark: Any) -> None:
    # defined here, so that it is pickled by value to Spark's Python processes
    def _no_spark_jar() -> str:
        """'clean' when this process has no spark-core jar on sys.path and no zip importer
        (which would have read a zip's directory), else what it has."""
        import sys as s

        jars = [p for p in s.path if "spark-core_" in p]
        zips = [k for k, v in s.path_importer_cache.items() if type(v).__name__ == "zipimporter"]
        return "clean" if not jars and not zips else f"{jars} {zips}"

    assert _ask_spark_processes(spark, "nsqpy_test_jar", _no_spark_jar) == ("clean", ["clean", "clean"])


def test_python_processes_are_forked_from_the_preloaded_interpreter(spark: Any) -> None:
    """The data source's planner and the read workers are children of the session's fork
    server (nsqpy.spark.forkserver), not new interpreters: they keep its command line, and
    pyspark is imported already."""

    def _origin() -> str:
        import os as o

        with open(f"/proc/{o.getpid()}/cmdline", "rb") as f:
            cmdline = f.read()
        with open(f"/proc/{o.getpid()}/comm") as f:
            comm = f.read().strip()
        return f"forked:{comm}" if b"nsqpy.spark.forkserver" in cmdline else "new"

    planner, workers = _ask_spark_processes(spark, "nsqpy_test_origin", _origin)
    assert planner == "forked:create_data_sou"
    assert workers == ["forked:worker", "forked:worker"]


def test_log_config_written_into_a_mirror_without_conf(tmp_path: Path) -> None:
    """Spark's log at the level asked, without its banner, in a mirror that has no conf
    directory; an installation's own conf directory (a link in the mirror) is left alone."""
    from nsqpy.spark.session import write_log_config

    assert write_log_config(str(tmp_path), "warn")
    text = (tmp_path / "conf" / "log4j2.properties").read_text()
    assert "rootLogger.level = warn" in text and "NativeCodeLoader" in text
    assert "%d{yy/MM/dd HH:mm:ss}" in text  # braces of the pattern survive the formatting
    theirs = tmp_path / "home" / "conf"
    theirs.mkdir(parents=True)
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    (mirror / "conf").symlink_to(theirs)
    assert not write_log_config(str(mirror), "info")
    assert list(theirs.iterdir()) == []
