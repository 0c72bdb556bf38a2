"""nsqpy on Spark: the ``nsq`` data source (stream reader, batch and stream writer).

``register(spark)`` makes ``spark.readStream.format("nsq")``, ``df.write.format("nsq")``
and ``df.writeStream.format("nsq")`` available (``make_session`` calls it). Needs the
``spark`` extra (pyspark, pyarrow); without it this package still imports (``nsq_spark
--help`` works), and ``NsqDataSource`` and ``register`` raise an ImportError saying so.
"""

from __future__ import annotations

from typing import Any

#: The rows the ``nsq`` source produces (DDL). ``id`` is the 16-character message id,
#: ``timestamp`` nsqd's message timestamp, ``nsqd_address`` the ``host:port`` it came from.
SOURCE_SCHEMA = (
    "id STRING, timestamp TIMESTAMP, attempts INT, body BINARY, topic STRING, "
    "channel STRING, nsqd_address STRING"
)
SOURCE_COLUMNS = ("id", "timestamp", "attempts", "body", "topic", "channel", "nsqd_address")

__all__ = ["SOURCE_COLUMNS", "SOURCE_SCHEMA", "NsqDataSource", "register"]

try:
    from .datasource import NsqDataSource, register
except ImportError as exc:  # pragma: no cover - depends on the install
    if not (exc.name or "").startswith(("pyspark", "pyarrow", "py4j")):
        raise
    _missing: ImportError | None = exc
else:
    _missing = None


def __getattr__(name: str) -> Any:
    if name in ("NsqDataSource", "register") and _missing is not None:
        raise ImportError("nsqpy.spark needs pyspark: pip install 'nsqpy[spark]'") from _missing
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
