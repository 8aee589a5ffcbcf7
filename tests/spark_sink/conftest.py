"""One local Spark session and one broker for every Spark test.

Starting a JVM costs seconds, so the session is shared (``local[2,4]``: two threads, and a
failed task is retried — the sink test relies on that). Tests skip only if Java is absent.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.server import BrokerProcess

if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
    pytest.skip("Spark needs Java (JAVA_HOME or java on PATH)", allow_module_level=True)


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    import spark_sink

    session = (
        SparkSession.builder.master("local[2,4]")
        .appName("logbus-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.memory", "1g")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.streaming.stopTimeout", "10s")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.local.dir", str(tmp_path_factory.mktemp("spark-local")))
        .config("spark.sql.warehouse.dir", str(tmp_path_factory.mktemp("warehouse")))
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    spark_sink.register(session)
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="session")
def spark_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BrokerProcess]:
    # Retention runs every 200 ms so the data-loss tests see a range deleted quickly; topics
    # without retention configs are untouched by it.
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("LOGBUS_RETENTION_CHECK_INTERVAL_MS", "200")
        b = BrokerProcess(tmp_path_factory.mktemp("spark-broker") / "data").start()
    try:
        yield b
    finally:
        b.stop()


@pytest.fixture
def http(spark_broker: BrokerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=spark_broker.url, timeout=30.0) as c:
        yield c


@pytest.fixture
def checkpoint(tmp_path: Path) -> str:
    return str(tmp_path / "checkpoint")
