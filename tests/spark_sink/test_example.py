"""The click-stream example runs end to end (Trigger.AvailableNow) on the shared session."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx

from examples.clickstream import pipeline, produce_clicks
from tests.server import BrokerProcess

from .helpers import values


def test_clickstream_example(
    spark: Any, spark_broker: BrokerProcess, http: httpx.Client, tmp_path: Path
) -> None:
    url = spark_broker.url
    # 4 minutes of event time, 3 users: 200 clicks per user per minute; the watermark (newest
    # event minus 1 minute) has passed the end of the first two windows only.
    produce_clicks.produce(url, "ex-clicks", events=2400, minutes=4, users=3)
    pipeline.create_topic(url, "ex-counts")
    for q in pipeline.start(spark, url, "ex-clicks", "ex-counts", tmp_path, available_now=True):
        q.awaitTermination(120)
        assert not q.isActive and q.exception() is None
    rows = spark.read.parquet(str(tmp_path / "parquet")).collect()
    assert sorted((r.user, r.clicks) for r in rows) == sorted(
        [(f"user-{u}", 200) for u in (1, 2, 3)] * 2
    )
    assert len(values(http, "ex-counts")) == 6  # committed by the sink's transactions
