"""Build a SparkSession that stays on loopback and uses this interpreter for Python workers.

pyspark is an optional dependency (``pip install nsqpy[spark]``); importing this module
without it raises an ImportError that says so.
"""

from __future__ import annotations

import os
import shutil
import sys
from typing import Any

try:
    from pyspark.sql import SparkSession
except ImportError as exc:  # pragma: no cover - depends on the install
    raise ImportError("nsqpy.spark needs pyspark: pip install 'nsqpy[spark]'") from exc


def _is_this_interpreter(python: str) -> bool:
    found = shutil.which(python)
    return found is not None and os.path.abspath(found) == os.path.abspath(sys.executable)


def make_session(
    master: str = "local[*]",
    app_name: str = "nsqpy",
    conf: dict[str, str] | None = None,
    loopback: bool = True,
) -> Any:
    """Return a SparkSession (``getOrCreate``) with the ``nsq`` format registered.

    With ``loopback`` (the default for ``local[...]`` masters) the driver binds to
    127.0.0.1 only. Python workers run this interpreter unless PYSPARK_PYTHON is set.
    """
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = SparkSession.builder.master(master).appName(app_name)
    local = master.startswith("local")
    if loopback and local:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        builder = builder.config("spark.driver.bindAddress", "127.0.0.1").config(
            "spark.driver.host", "127.0.0.1"
        )
    defaults = {
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "4",
        "spark.sql.session.timeZone": "UTC",
    }
    if local and _is_this_interpreter(os.environ["PYSPARK_PYTHON"]):
        # workers import pyspark from the installed package, not (uncompiled, every
        # time) from Spark's pyspark.zip: see nsqpy._pyspark_daemon. Only where the
        # workers are known to run this interpreter, which has nsqpy installed.
        defaults["spark.python.daemon.module"] = "nsqpy._pyspark_daemon"
    defaults.update(conf or {})
    for key, value in defaults.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    from nsqpy.spark import register

    register(spark)
    return spark
