"""Spark ingest: the ``logbus`` source next to Spark reading the same records from a file.

    python -m benchmarks.spark [--records N] [--partitions P] [--repeats R] [--json OUT]

One run, one machine, one ``local[2]`` session: a broker is started on a temporary data
directory, N small JSON click events are produced into a topic of P partitions (binary batches
of 1,000 records, ``acks=1``), and the same events are written one per line to a JSON-lines
file in the same temporary directory. Then, after one untimed warm-up of each, every reading
is timed R times into Spark's ``noop`` sink (which pulls every row and writes nothing):

* ``file_json``: ``spark.read.schema(s).json(file)`` — the file baseline (schema given, so no
  inference pass; the file is split into 4 tasks so both cores work, as the source's 4 do).
* ``file_json_infer``: ``spark.read.json(file)`` with schema inference, Spark's default.
* ``file_text``: ``spark.read.text(file)`` — the bytes of each line, no parsing.
* ``file_json_stream``: ``spark.readStream.schema(s).json(dir)`` with
  ``trigger(availableNow=True)`` — the streaming baseline.
* ``logbus_batch``: ``spark.read.format("logbus")`` (key, value, topic, partition, offset,
  timestamp, timestampType), ``minPartitions=4``.
* ``logbus_stream``: ``readStream.format("logbus")`` with ``trigger(availableNow=True)``.
* ``logbus_parsed``: ``logbus_batch`` + ``from_json(value, s)``, the like-for-like of
  ``file_json`` (both end with the parsed columns).
* ``python_floor``: a Python data source that yields the same rows, already in Arrow (read
  from Arrow IPC files written beforehand), in 4 tasks: Spark's own ceiling for any Python
  data source with this schema, no broker involved.

Figures of merit (target >= 1.0), each the median over the repeats of the ratio of two rates
measured in the same repeat (the machine may be shared; ratios within a repeat are what hold):
``ratio_batch`` = ``logbus_batch`` / ``file_json``, ``ratio_stream`` = ``logbus_stream`` /
``file_json_stream``, and ``ratio_stream_vs_file`` = ``logbus_stream`` / ``file_json``. A
streaming query has a fixed start-up cost (Spark starts a Python process for a Python
source's driver side, ~1.5 s) that a batch read does not pay, so the last one depends on N;
``ratio_stream_triggers`` compares the two streams' micro-batch execution time only
(``triggerExecution`` summed over the query's progress reports), without start-up.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from api.process import BrokerProcess
from core_log.batch import Record, build_batch

TOPIC = "clicks"
PAGES = ("/", "/cart", "/checkout", "/search", "/product/1", "/product/2", "/help")
SCHEMA_DDL = "user STRING, page STRING, ts LONG, n LONG"


def click(i: int, now_ms: int) -> tuple[bytes, bytes]:
    user = f"user-{i % 10_000}"
    value = json.dumps(
        {"user": user, "page": PAGES[i % len(PAGES)], "ts": now_ms + i, "n": i},
        separators=(",", ":"),
    )
    return user.encode(), value.encode()


def load(url: str, path: Path, records: int, partitions: int) -> None:
    """Produce ``records`` events round-robin over the partitions; write the same to ``path``."""
    now_ms = int(time.time() * 1000)
    with httpx.Client(base_url=url, timeout=120.0) as http:
        r = http.post("/v1/topics", json={"name": TOPIC, "partitions": partitions})
        r.raise_for_status()
        pending: dict[int, list[Record]] = {p: [] for p in range(partitions)}
        bodies: dict[int, list[bytes]] = {p: [] for p in range(partitions)}
        with path.open("wb") as f:
            for i in range(records):
                key, value = click(i, now_ms)
                f.write(value + b"\n")
                p = i % partitions
                pending[p].append(Record(value, key, (), now_ms + i))
                if len(pending[p]) == 1000 or i >= records - partitions:
                    bodies[p].append(build_batch(pending[p]))
                    pending[p] = []
                if len(bodies[p]) == 32 or i >= records - partitions:
                    _send(http, p, bodies[p])
                    bodies[p] = []
        for p in range(partitions):
            if pending[p]:
                bodies[p].append(build_batch(pending[p]))
            _send(http, p, bodies[p])
        hw = sum(x["high_watermark"] for x in http.get(f"/v1/topics/{TOPIC}/partitions").json())
        assert hw == records, (hw, records)


def _send(http: httpx.Client, partition: int, batches: list[bytes]) -> None:
    if not batches:
        return
    r = http.post(
        f"/v1/topics/{TOPIC}/partitions/{partition}/records",
        params={"acks": "1"},
        content=b"".join(batches),
        headers={"content-type": "application/vnd.logbus.batch"},
    )
    r.raise_for_status()


def write_floor_files(url: str, records: int, partitions: int, tmp: Path) -> list[str]:
    """The topic's rows as Arrow IPC files (4 of them) for the ``python_floor`` source."""
    import pyarrow as pa  # type: ignore[import-untyped]

    from spark_sink.offsets import OffsetRange
    from spark_sink.options import source_options
    from spark_sink.source import read_range

    opts = source_options({"url": url, "subscribe": TOPIC}, batch=True)
    per = records // partitions
    batches = [
        b
        for p in range(partitions)
        for b in read_range(opts, OffsetRange(TOPIC, p, 0, per + (p < records % partitions)))
    ]
    table = pa.Table.from_batches(batches)
    paths = []
    for i in range(4):
        path = tmp / f"floor-{i}.arrow"
        chunk = table.slice(i * len(table) // 4, (i + 1) * len(table) // 4 - i * len(table) // 4)
        with pa.OSFile(str(path), "wb") as f, pa.ipc.new_file(f, table.schema) as w:
            w.write_table(chunk, max_chunksize=25_000)
        paths.append(str(path))
    return paths


def register_floor(spark: Any, paths: list[str]) -> None:
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    from spark_sink.columns import kafka_schema

    class FloorReader(DataSourceReader):
        def partitions(self) -> list[InputPartition]:
            return [InputPartition(p) for p in paths]

        def read(self, partition: InputPartition) -> Any:
            import pyarrow as pa

            with pa.memory_map(partition.value) as source:
                reader = pa.ipc.open_file(source)
                for i in range(reader.num_record_batches):
                    yield reader.get_batch(i)

    class Floor(DataSource):
        @classmethod
        def name(cls) -> str:
            return "python_floor"

        def schema(self) -> Any:
            return kafka_schema(False)

        def reader(self, schema: Any) -> DataSourceReader:
            return FloorReader()

    spark.dataSource.register(Floor)


def session(tmp: Path) -> Any:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    import spark_sink

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("logbus-bench")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", "2g")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.local.dir", str(tmp / "spark-local"))
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    spark_sink.register(spark)
    return spark


def readings(
    spark: Any, url: str, file: Path, tmp: Path, triggers: dict[str, list[float]]
) -> dict[str, Callable[[], None]]:
    """The timed cases; streaming ones also append their micro-batches' execution time
    (``triggerExecution``, which leaves out query start-up and shutdown) to ``triggers``."""
    from pyspark.sql.functions import col, from_json

    def logbus() -> Any:
        return (
            spark.read.format("logbus")
            .option("url", url)
            .option("subscribe", TOPIC)
            .option("minPartitions", "4")
            .load()
        )

    def noop(df: Any) -> None:
        df.write.format("noop").mode("overwrite").save()

    runs = iter(range(1_000_000))

    def stream(name: str, df: Any) -> None:
        q = (
            df.writeStream.format("noop")
            .option("checkpointLocation", str(tmp / f"ck-{next(runs)}"))
            .trigger(availableNow=True)
            .start()
        )
        q.awaitTermination()
        ms = sum(p["durationMs"]["triggerExecution"] for p in q.recentProgress)
        triggers.setdefault(name, []).append(ms / 1000)

    def logbus_stream() -> Any:
        return (
            spark.readStream.format("logbus")
            .option("url", url)
            .option("subscribe", TOPIC)
            .option("startingOffsets", "earliest")
            .option("minPartitions", "4")
            .load()
        )

    return {
        "file_json": lambda: noop(spark.read.schema(SCHEMA_DDL).json(str(file))),
        "file_json_stream": lambda: stream(
            "file_json_stream", spark.readStream.schema(SCHEMA_DDL).json(str(file.parent))
        ),
        "file_json_infer": lambda: noop(spark.read.json(str(file))),
        "file_text": lambda: noop(spark.read.text(str(file))),
        "logbus_batch": lambda: noop(logbus()),
        "logbus_stream": lambda: stream("logbus_stream", logbus_stream()),
        "python_floor": lambda: noop(spark.read.format("python_floor").load()),
        "logbus_parsed": lambda: noop(
            logbus()
            .select(from_json(col("value").cast("string"), SCHEMA_DDL).alias("v"))
            .select("v.*")
        ),
    }


def run(records: int, partitions: int, repeats: int) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="logbus-spark-bench-"))
    broker = BrokerProcess(tmp / "data").start()
    try:
        (tmp / "jsonl").mkdir()
        file = tmp / "jsonl" / "clicks.jsonl"
        started = time.perf_counter()
        load(broker.url, file, records, partitions)
        load_s = time.perf_counter() - started
        file_bytes = file.stat().st_size
        floor = write_floor_files(broker.url, records, partitions, tmp)
        spark = session(tmp)
        register_floor(spark, floor)
        # Split the file as the source splits the topic: 4 tasks for the 2 cores.
        split = max(1 << 20, file.stat().st_size // 4 + 1)
        spark.conf.set("spark.sql.files.maxPartitionBytes", str(split))
        spark.conf.set("spark.sql.files.openCostInBytes", "0")
        triggers: dict[str, list[float]] = {}
        cases = readings(spark, broker.url, file, tmp, triggers)
        times: dict[str, list[float]] = {name: [] for name in cases}
        for fn in cases.values():  # warm-up: JIT, Python workers, page cache
            fn()
        triggers.clear()
        for _ in range(repeats):
            for name, fn in cases.items():
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
        spark.stop()
    finally:
        broker.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    rates = {name: records / statistics.median(ts) for name, ts in times.items()}

    def ratio(a: str, b: str) -> float:
        return round(
            statistics.median(tb / ta for ta, tb in zip(times[a], times[b], strict=True)), 2
        )

    return {
        "records": records,
        "partitions": partitions,
        "repeats": repeats,
        "file_bytes": file_bytes,
        "load_seconds": round(load_s, 2),
        "seconds": {k: [round(t, 3) for t in v] for k, v in times.items()},
        "records_per_s": {k: round(v) for k, v in rates.items()},
        "ratio_batch": ratio("logbus_batch", "file_json"),
        "ratio_stream": ratio("logbus_stream", "file_json_stream"),
        "ratio_stream_vs_file": ratio("logbus_stream", "file_json"),
        "ratio_parsed": ratio("logbus_parsed", "file_json"),
        "ratio_batch_vs_floor": ratio("logbus_batch", "python_floor"),
        "trigger_seconds": {k: [round(t, 3) for t in v] for k, v in triggers.items()},
        "ratio_stream_triggers": round(
            statistics.median(
                b / a
                for a, b in zip(
                    triggers["logbus_stream"], triggers["file_json_stream"], strict=True
                )
            ),
            2,
        ),
        "load_average": os.getloadavg(),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, "
        f"Python {platform.python_version()}",
    }


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=1_000_000)
    ap.add_argument("--partitions", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", type=Path, help="also write the results to this file")
    ap.add_argument("--plot", type=Path, help="draw records/s per case here (PNG)")
    ap.add_argument("--replot", type=Path, metavar="JSON", help="only draw --plot from a --json")
    args = ap.parse_args(argv)
    if args.replot:
        if not args.plot:
            ap.error("--replot needs --plot")
        plot(json.loads(args.replot.read_text()), args.plot)
        return
    result = run(args.records, args.partitions, args.repeats)
    width = max(map(len, result["records_per_s"]))
    for name, rate in result["records_per_s"].items():
        print(f"{name:<{width}}  {rate:>12,} records/s   {result['seconds'][name]}")
    for key in (
        "ratio_batch",
        "ratio_stream",
        "ratio_stream_vs_file",
        "ratio_parsed",
        "ratio_batch_vs_floor",
        "ratio_stream_triggers",
    ):
        print(f"{key:<22} {result[key]}")
    print(f"load average {result['load_average']}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    if args.plot:
        plot(result, args.plot)


def plot(result: dict[str, Any], path: Path) -> None:
    """Records/s of every case, the logbus ones highlighted, with the paired ratios."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rates = result["records_per_s"]
    fig, ax = plt.subplots(figsize=(10, 0.5 * len(rates) + 1.8))
    names = list(rates)
    colors = ["tab:blue" if n.startswith("logbus") else "tab:gray" for n in names]
    ax.barh(names, [rates[n] / 1e6 for n in names], color=colors)
    for i, n in enumerate(names):
        ax.text(rates[n] / 1e6, i, f"  {rates[n] / 1e6:.2f} M/s", va="center", fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("records/s (millions), median of repeats, into Spark's noop sink")
    ax.set_title(
        f"Spark ingest, local[2], {result['records']:,} records: logbus batch / JSON file = "
        f"{result['ratio_batch']}, stream / JSON file = {result['ratio_stream']} "
        f"(micro-batches vs file stream {result['ratio_stream_triggers']})",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
