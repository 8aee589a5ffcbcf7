"""A PySpark 4 Python Data Source named ``logbus``: Structured Streaming source and sink, and a
batch reader and writer, over the broker's HTTP API. See docs/spark.md.

    import spark_sink
    spark_sink.register(spark)
    df = (spark.readStream.format("logbus").option("url", "http://127.0.0.1:8080")
          .option("subscribe", "clicks").load())
"""

from __future__ import annotations

from typing import TYPE_CHECKING

try:
    import pyspark  # noqa: F401 - only to fail early, with the remedy
except ImportError as e:  # the broker installs without Spark (a 1.3 GB virtualenv)
    raise ImportError(
        "spark_sink needs PySpark, which Logbus installs only on request: "
        "pip install 'logbus[spark]' (and Java 17)"
    ) from e

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def register(spark: SparkSession) -> None:
    """Make ``format("logbus")`` available in ``spark`` (once per session)."""
    from .source import LogbusDataSource

    spark.dataSource.register(LogbusDataSource)


__all__ = ["register"]
