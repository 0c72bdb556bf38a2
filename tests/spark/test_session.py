"""make_session's worker set-up: Python workers import pyspark from the installed package
(compiled once, cached) rather than from Spark's pyspark.zip."""

from __future__ import annotations

import os
import sys
import zipfile
from pathlib import Path
from typing import Any

import pyspark

from nsqpy._pyspark_daemon import installed_path
from nsqpy.spark.session import _is_this_interpreter

SITE = str(Path(pyspark.__file__).parent.parent)
ZIPS = Path(pyspark.__file__).parent / "python" / "lib"


def _fake_zip(tmp_path: Path, name: str, pkg: str, version: bytes) -> str:
    path = tmp_path / name
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{pkg}/__init__.py", b"")
        z.writestr(f"{pkg}/version.py", version)
    return str(path)


def test_installed_path_drops_the_zips_only_for_the_same_release(tmp_path: Path) -> None:
    real = sorted(str(p) for p in ZIPS.glob("*.zip"))
    assert any(p.endswith("pyspark.zip") for p in real)
    # the pip-installed layout: the zips ship inside the very same package
    assert installed_path([*real, SITE]) == [SITE]
    assert installed_path([SITE]) is None  # nothing to drop
    # a zip of another release: leave the path alone
    other = _fake_zip(tmp_path, "pyspark.zip", "pyspark", b'__version__ = "0.0.1"\n')
    assert installed_path([other, SITE]) is None
    # no installed pyspark besides the zip (a cluster node with SPARK_HOME only)
    same = (Path(pyspark.__file__).parent / "version.py").read_bytes()
    only_zip = _fake_zip(tmp_path / "", "pyspark.zip", "pyspark", same)
    assert installed_path([only_zip, str(tmp_path / "empty")]) is None


def test_is_this_interpreter() -> None:
    assert _is_this_interpreter(sys.executable)
    assert not _is_this_interpreter(os.path.join(os.path.dirname(sys.executable), "no-such-python"))


def test_workers_import_pyspark_from_the_package(spark: Any) -> None:
    assert spark.conf.get("spark.python.daemon.module") == "nsqpy._pyspark_daemon"

    def where(_: Any) -> Any:
        import pyspark as p

        yield p.__file__

    files = set(spark.sparkContext.parallelize(range(4), 2).mapPartitions(where).collect())
    assert files == {pyspark.__file__}, files
