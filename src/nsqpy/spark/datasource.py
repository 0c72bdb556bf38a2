"""The ``nsq`` format: the Spark data source class and its registration (see :mod:`nsqpy.spark`)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader
from pyspark.sql.types import StructType

from . import SOURCE_COLUMNS, SOURCE_SCHEMA


class NsqDataSource(DataSource):
    """The ``nsq`` format. Read options: topic, channel, nsqlookupdHttpAddresses or
    nsqdTcpAddresses, spoolPath, maxRecordsPerBatch, maxInFlight, msgTimeoutMs,
    maxSpoolRows, numPartitions, batchFillWaitMs (see :mod:`nsqpy.spark.source`). Write options: topic,
    nsqdTcpAddresses, maxMsgSize, maxBodySize (see :mod:`nsqpy.spark.sink`). Both take the
    connection options of :mod:`nsqpy.spark.connopts` (tls, tlsRootCaFile, tlsCert, tlsKey,
    tlsInsecureSkipVerify, tlsMinVersion, snappy, deflate, deflateLevel, authSecret,
    heartbeatIntervalMs, outputBufferSize, outputBufferTimeoutMs, userAgent, dialTimeoutMs;
    sampleRate for reading)."""

    @classmethod
    def name(cls) -> str:
        return "nsq"

    def schema(self) -> str:
        return SOURCE_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        raise ValueError(
            "nsq: batch reads are not supported; read a topic with spark.readStream.format('nsq') "
            "(trigger(availableNow=True) drains what is there and stops)"
        )

    def streamReader(self, schema: StructType) -> Any:
        from .source import NsqStreamReader

        if tuple(schema.fieldNames()) != SOURCE_COLUMNS:
            raise ValueError(f"nsq source: the schema is fixed ({SOURCE_SCHEMA}); do not set one")
        return NsqStreamReader(_options(self.options))

    def writer(self, schema: StructType, overwrite: bool) -> Any:
        from .sink import NsqBatchWriter

        return NsqBatchWriter(_options(self.options), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> Any:
        from .sink import NsqStreamWriter

        return NsqStreamWriter(_options(self.options), schema)


def _options(options: Mapping[str, Any]) -> dict[str, str]:
    return {str(k).lower(): str(v) for k, v in options.items() if v is not None}


def register(spark: Any) -> None:
    """Register the ``nsq`` format with ``spark`` (a SparkSession)."""
    spark.dataSource.register(NsqDataSource)
