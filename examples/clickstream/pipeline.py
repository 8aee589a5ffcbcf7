"""Clicks per user per minute: Logbus → Spark Structured Streaming → Parquet and Logbus.

    python -m examples.clickstream.pipeline [--url URL (default $LOGBUS_URL)] [--topic clicks]
        [--out-topic clicks-per-minute] [--dir ./clickstream-out] [--available-now]
        [--replication-factor N]

Reads ``--topic`` with the ``logbus`` source, parses the JSON clicks, counts them per user in
1-minute event-time windows with a 1-minute watermark, and writes each finished window twice:
as Parquet under ``--dir/parquet`` and as JSON records keyed by user into ``--out-topic``
(exactly once per micro-batch, through the sink's Idempotency-Keys). Checkpoints live under
``--dir/checkpoints``: run it again and it carries on where it stopped. A window is written
once the watermark (the newest event time seen minus one minute) has passed its end.

``--available-now`` processes what is in the topic and stops (then prints the Parquet
contents); without it the queries run every 5 seconds until Ctrl-C.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

CLICK_SCHEMA = "user STRING, page STRING, ts LONG"


def windowed_counts(spark: Any, url: str, topic: str) -> Any:
    """The streaming DataFrame of (window_start, window_end, user, clicks)."""
    from pyspark.sql import functions as F

    clicks = (
        spark.readStream.format("logbus")
        .option("url", url)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .load()
        .select(F.from_json(F.col("value").cast("string"), CLICK_SCHEMA).alias("c"))
        .select("c.user", (F.col("c.ts") / 1000).cast("timestamp").alias("event_time"))
    )
    return (
        clicks.withWatermark("event_time", "1 minute")
        .groupBy(F.window("event_time", "1 minute"), "user")
        .count()
        .select(
            F.col("window.start").alias("window_start"),
            F.col("window.end").alias("window_end"),
            "user",
            F.col("count").alias("clicks"),
        )
    )


def start(
    spark: Any, url: str, topic: str, out_topic: str, out_dir: Path, available_now: bool
) -> list[Any]:
    """Start the two queries (Parquet, Logbus); returns them."""
    from pyspark.sql import functions as F

    counts = windowed_counts(spark, url, topic)
    as_records = counts.select(
        F.col("user").alias("key"),
        F.to_json(F.struct("window_start", "window_end", "user", "clicks")).alias("value"),
    )
    trigger = {"availableNow": True} if available_now else {"processingTime": "5 seconds"}
    to_parquet = (
        counts.writeStream.format("parquet")
        .outputMode("append")
        .option("path", str(out_dir / "parquet"))
        .option("checkpointLocation", str(out_dir / "checkpoints" / "parquet"))
        .trigger(**trigger)
        .start()
    )
    to_logbus = (
        as_records.writeStream.format("logbus")
        .outputMode("append")
        .option("url", url)
        .option("topic", out_topic)
        .option("checkpointLocation", str(out_dir / "checkpoints" / "logbus"))
        .trigger(**trigger)
        .start()
    )
    return [to_parquet, to_logbus]


def create_topic(url: str, name: str, replication_factor: int | None = None) -> None:
    """Create the output topic (1 partition) unless it exists."""
    import httpx

    spec: dict[str, object] = {"name": name, "partitions": 1}
    if replication_factor is not None:
        spec["replication_factor"] = replication_factor
    r = httpx.post(f"{url}/v1/topics", json=spec, timeout=30.0)
    if r.status_code not in (201, 409):
        r.raise_for_status()


def build_parser() -> argparse.ArgumentParser:
    """The command line (tests/test_compose.py parses docker-compose.yml's job with it)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--url",
        default=os.environ.get("LOGBUS_URL", "http://127.0.0.1:8080"),
        help="broker URL (default: %(default)s, taken from $LOGBUS_URL when set)",
    )
    ap.add_argument("--topic", default="clicks")
    ap.add_argument("--out-topic", default="clicks-per-minute")
    ap.add_argument("--dir", type=Path, default=Path("clickstream-out"))
    ap.add_argument("--available-now", action="store_true")
    ap.add_argument(
        "--replication-factor",
        type=int,
        help="of --out-topic if it is created (default: the broker's; 3 in a cluster)",
    )
    return ap


def main() -> None:
    args = build_parser().parse_args()

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    import spark_sink

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("clickstream")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    spark_sink.register(spark)
    create_topic(args.url, args.out_topic, args.replication_factor)
    queries = start(spark, args.url, args.topic, args.out_topic, args.dir, args.available_now)
    try:
        for q in queries:
            q.awaitTermination()
    except KeyboardInterrupt:
        for q in queries:
            q.stop()
    rows = spark.read.parquet(str(args.dir / "parquet")).orderBy("window_start", "user")
    print(f"{rows.count()} (window, user) counts in {args.dir / 'parquet'}; the first ones:")
    rows.show(10, truncate=False)
    spark.stop()


if __name__ == "__main__":
    main()
