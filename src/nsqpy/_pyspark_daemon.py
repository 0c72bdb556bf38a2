"""PySpark's Python worker daemon, importing pyspark from the installed package.

Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` (and py4j's source zip) first on every
Python worker's path. Modules imported from a zip have no bytecode cache, so each worker
process compiles the pyspark modules it needs from source (a second or more of CPU on a small
machine, per worker), and each task's ``importlib.invalidate_caches()`` re-reads the zip's
directory. When the very same pyspark (and py4j) is installed as a package, as with
``pip install pyspark``, this module drops the zips from ``sys.path`` and runs
``pyspark.daemon``; otherwise it runs ``pyspark.daemon`` unchanged.

Spark starts it with ``spark.python.daemon.module=nsqpy._pyspark_daemon``
(:func:`nsqpy.spark.session.make_session` sets it). It must not import pyspark itself
before the path is settled, nor anything heavy: it runs once per worker daemon.
"""

from __future__ import annotations

import importlib.machinery
import os
import runpy
import sys
import zipfile


def _is_spark_zip(path: str) -> bool:
    name = os.path.basename(path)
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


def installed_path(path: list[str]) -> list[str] | None:
    """``path`` without Spark's zips if the same pyspark and py4j are importable without
    them; None to leave the path as it is."""
    zips = [p for p in path if _is_spark_zip(p)]
    if not zips:
        return None
    rest = [p for p in path if not _is_spark_zip(p)]
    for zip_path in zips:
        pkg = "pyspark" if os.path.basename(zip_path) == "pyspark.zip" else "py4j"
        spec = importlib.machinery.PathFinder.find_spec(pkg, rest)
        if spec is None or not spec.submodule_search_locations:
            return None
        pkg_dir = list(spec.submodule_search_locations)[0]
        # the same release: its version module is byte for byte the zip's
        zipped = _zip_member(zip_path, f"{pkg}/version.py")
        if zipped is None or zipped != _read(os.path.join(pkg_dir, "version.py")):
            return None
    return rest


def main() -> None:
    rest = installed_path(sys.path)
    if rest is not None:
        sys.path[:] = rest
    runpy.run_module("pyspark.daemon", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
