"""Transactional produce vs plain produce, and read_committed vs read_uncommitted fetch, in one
run against one broker (issue 13's performance targets).

    python -m benchmarks.transactions [--seconds 5] [--partitions 4] [--rounds 3]
                                      [--json docs/bench-transactions.json]

1. **Produce.** JSON requests of 1,000 records of ~100-byte values to partition paths, one
   keep-alive connection per partition, ``acks=all`` on both sides (a transactional produce is
   always acks=all). *Plain*: no producer headers. *Transactional*: one producer session for
   all partitions (``POST /v1/transactions/{id}``); every request carries the session headers
   and its partition's sequence; every ``--commit-ms`` (100 ms) the connections finish the
   request they are sending, the client commits (``POST …/commit``: markers on every partition
   written before it answers), takes the next epoch from the answer and starts the sequences
   at 0 again. The time spent committing counts. *Idempotent*: the same requests with a
   producer session and no transaction (the plain JSON path is the slower one here: it routes
   and builds batches per request). Each round runs the three; the round's ratio is the
   transactional records/s over the faster of plain and idempotent, and the figure is the
   median of the rounds' (target >= 0.7).
2. **Fetch.** The transactional topic, now holding committed transactions and their markers,
   read whole 3 times per measurement (after one untimed measurement of each, to warm the page
   cache) from offset 0 as JSON
   (``max_bytes`` 1 MiB requests on one connection, the client following ``next_offset``) at
   ``read_uncommitted`` and at ``read_committed``, ``--fetch-rounds`` pairs in ABBA order, in
   records/s, and by the broker's CPU time per pass (``/proc/<pid>/stat``: steadier than wall
   time on a shared machine); each ratio is the median of the pairs' (target >= 0.9).

Both sides of each ratio are sent by the same client code in the same run, so the client's own
cost (a raw asyncio HTTP/1.1 client, no JSON decode of answers beyond ``next_offset``) cancels
out of the ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson

from api.process import BrokerProcess
from benchmarks.http import json_body

PRODUCE_TARGET = 0.7
FETCH_TARGET = 0.9
JSON_RECORDS = 1000
FETCH_BYTES = 1024 * 1024


class Conn:
    """One keep-alive HTTP/1.1 connection, one request at a time."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def open(self) -> Conn:
        self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        return self

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            await self.writer.wait_closed()

    async def request(
        self, method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
    ) -> tuple[int, bytes]:
        assert self.reader is not None and self.writer is not None
        extra = "".join(f"{k}: {v}\r\n" for k, v in (headers or {}).items())
        head = (
            f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1:{self.port}\r\n"
            f"Accept: application/json\r\nContent-Length: {len(body)}\r\n{extra}\r\n"
        ).encode()
        self.writer.write(head + body)
        await self.writer.drain()
        status = int((await self.reader.readline()).split()[1])
        length = 0
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        return status, await self.reader.readexactly(length)


@dataclass
class Outcome:
    records: int
    seconds: float
    commits: int = 0

    @property
    def records_s(self) -> float:
        return self.records / self.seconds


def _check(status: int, body: bytes, what: str) -> None:
    if status not in (200, 201):
        raise RuntimeError(f"{what}: {status} {body[:300]!r}")


async def produce_plain(port: int, topic: str, parts: int, seconds: float) -> Outcome:
    body = json_body(JSON_RECORDS)
    conns = [await Conn(port).open() for _ in range(parts)]
    headers = {"Content-Type": "application/json"}
    sent = 0
    start = time.perf_counter()
    deadline = start + seconds

    async def worker(p: int) -> None:
        nonlocal sent
        path = f"/v1/topics/{topic}/partitions/{p}/records?acks=all"
        while time.perf_counter() < deadline:
            status, reply = await conns[p].request("POST", path, body, headers)
            _check(status, reply, path)
            sent += JSON_RECORDS

    await asyncio.gather(*(worker(p) for p in range(parts)))
    elapsed = time.perf_counter() - start
    for c in conns:
        await c.close()
    return Outcome(sent, elapsed)


async def produce_idempotent(port: int, topic: str, parts: int, seconds: float) -> Outcome:
    """The same requests with an idempotent producer session and no transaction: the
    non-transactional path a transactional produce shares (one batch per request)."""
    body = json_body(JSON_RECORDS)
    conns = [await Conn(port).open() for _ in range(parts)]
    status, reply = await conns[0].request(
        "POST", "/v1/producers", b"{}", {"Content-Type": "application/json"}
    )
    _check(status, reply, "producer session")
    session = orjson.loads(reply)
    sent = 0
    start = time.perf_counter()
    deadline = start + seconds

    async def worker(p: int) -> None:
        nonlocal sent
        path = f"/v1/topics/{topic}/partitions/{p}/records?acks=all"
        seq = 0
        while time.perf_counter() < deadline:
            headers = {
                "Content-Type": "application/json",
                "Logbus-Producer-Id": str(session["producer_id"]),
                "Logbus-Producer-Epoch": str(session["producer_epoch"]),
                "Logbus-Sequence": str(seq),
            }
            status, reply = await conns[p].request("POST", path, body, headers)
            _check(status, reply, path)
            seq += JSON_RECORDS
            sent += JSON_RECORDS

    await asyncio.gather(*(worker(p) for p in range(parts)))
    elapsed = time.perf_counter() - start
    for c in conns:
        await c.close()
    return Outcome(sent, elapsed)


async def produce_transactional(
    port: int, topic: str, parts: int, seconds: float, commit_ms: float, txn_id: str
) -> Outcome:
    body = json_body(JSON_RECORDS)
    conns = [await Conn(port).open() for _ in range(parts)]
    control = await Conn(port).open()
    status, reply = await control.request(
        "POST", f"/v1/transactions/{txn_id}", b"{}", {"Content-Type": "application/json"}
    )
    _check(status, reply, "begin")
    session = orjson.loads(reply)
    pid, epoch = int(session["producer_id"]), int(session["producer_epoch"])
    committed = commits = 0
    start = time.perf_counter()
    deadline = start + seconds
    while time.perf_counter() < deadline:
        phase_end = min(deadline, time.perf_counter() + commit_ms / 1000)
        sent = [0] * parts

        async def worker(
            p: int,
            pid: int = pid,
            epoch: int = epoch,
            phase_end: float = phase_end,
            sent: list[int] = sent,
        ) -> None:
            path = f"/v1/topics/{topic}/partitions/{p}/records"
            seq = 0
            while True:
                headers = {
                    "Content-Type": "application/json",
                    "Logbus-Transactional-Id": txn_id,
                    "Logbus-Producer-Id": str(pid),
                    "Logbus-Producer-Epoch": str(epoch),
                    "Logbus-Sequence": str(seq),
                }
                status, reply = await conns[p].request("POST", path, body, headers)
                _check(status, reply, path)
                seq += JSON_RECORDS
                sent[p] += JSON_RECORDS
                if time.perf_counter() >= phase_end:
                    return

        await asyncio.gather(*(worker(p) for p in range(parts)))
        doc = orjson.dumps({"producer_id": pid, "producer_epoch": epoch})
        status, reply = await control.request(
            "POST", f"/v1/transactions/{txn_id}/commit", doc, {"Content-Type": "application/json"}
        )
        _check(status, reply, "commit")
        answer = orjson.loads(reply)
        if not answer["completed"]:
            raise RuntimeError("a commit answered before its markers were written")
        pid, epoch = int(answer["producer_id"]), int(answer["producer_epoch"])
        committed += sum(sent)
        commits += 1
    elapsed = time.perf_counter() - start
    for c in (*conns, control):
        await c.close()
    return Outcome(committed, elapsed, commits)


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` so far (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


FETCH_PASSES = 3  # whole reads per measurement: CPU time is counted in 10 ms ticks


def fetch_pass(port: int, pid: int, isolation: str) -> tuple[Outcome, float]:
    """:data:`FETCH_PASSES` whole reads of the partition (records and seconds summed), and the
    broker's CPU seconds they took."""
    before = cpu_seconds(pid)
    records, seconds = 0, 0.0
    for _ in range(FETCH_PASSES):
        one = asyncio.run(fetch_all(port, "txn", 0, isolation))
        records, seconds = records + one.records, seconds + one.seconds
    return Outcome(records, seconds), cpu_seconds(pid) - before


async def fetch_all(port: int, topic: str, partition: int, isolation: str) -> Outcome:
    conn = await Conn(port).open()
    offset = records = 0
    start = time.perf_counter()
    while True:
        path = (
            f"/v1/topics/{topic}/partitions/{partition}/records?offset={offset}"
            f"&max_bytes={FETCH_BYTES}&isolation={isolation}"
        )
        status, reply = await conn.request("GET", path)
        _check(status, reply, path)
        doc = orjson.loads(reply)
        records += len(doc["records"])
        if doc["next_offset"] == offset:
            break
        offset = doc["next_offset"]
        if offset >= doc["high_watermark"]:
            break
    elapsed = time.perf_counter() - start
    await conn.close()
    return Outcome(records, elapsed)


def run(args: argparse.Namespace) -> dict[str, Any]:
    started = datetime.datetime.now(datetime.UTC)
    print(f"# transactions benchmark, {started:%Y-%m-%d %H:%M:%S} UTC")
    print(
        f"# {platform.node()} {platform.machine()} cpus={os.cpu_count()} "
        f"python={platform.python_version()} loadavg={os.getloadavg()}"
    )
    parts = args.partitions
    base = Path(args.data_dir)
    base.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="txn-bench-", dir=base))
    broker = BrokerProcess(workdir / "data").start()
    port = broker.port
    rounds: list[dict[str, Any]] = []
    fetches: list[dict[str, Any]] = []
    try:
        with httpx.Client(base_url=broker.url, timeout=60) as c:
            for t in ("plain", "idem", "txn"):
                c.post("/v1/topics", json={"name": t, "partitions": parts}).raise_for_status()
        for k in range(args.rounds):
            plain = asyncio.run(produce_plain(port, "plain", parts, args.seconds))
            idem = asyncio.run(produce_idempotent(port, "idem", parts, args.seconds))
            txn = asyncio.run(
                produce_transactional(
                    port, "txn", parts, args.seconds, args.commit_ms, f"bench-{k}"
                )
            )
            # Against the faster of the two non-transactional runs: the stricter ratio.
            ratio = txn.records_s / max(plain.records_s, idem.records_s)
            rounds.append(
                {
                    "plain": asdict(plain),
                    "idempotent": asdict(idem),
                    "transactional": asdict(txn),
                    "ratio": ratio,
                }
            )
            print(
                f"round {k + 1}: plain {plain.records_s:>9,.0f}, idempotent "
                f"{idem.records_s:>9,.0f}, transactional {txn.records_s:>9,.0f} records/s "
                f"({txn.commits} commits); ratio to the faster {ratio:.3f}"
            )
        assert broker.proc is not None
        pid = broker.proc.pid
        fetch_pass(port, pid, "read_uncommitted")  # warm: page cache, code
        fetch_pass(port, pid, "read_committed")
        for k in range(args.fetch_rounds):
            # ABBA order: a load that drifts during the run favours neither
            order = ("read_uncommitted", "read_committed")
            passes = {iso: fetch_pass(port, pid, iso) for iso in order[:: 1 if k % 2 == 0 else -1]}
            (unc, unc_cpu), (com, com_cpu) = passes["read_uncommitted"], passes["read_committed"]
            if com.records != unc.records:
                raise RuntimeError(f"read_committed saw {com.records}, uncommitted {unc.records}")
            ratio = com.records_s / unc.records_s
            cpu_ratio = unc_cpu / com_cpu if com_cpu > 0 else float("nan")
            fetches.append(
                {
                    "read_uncommitted": {**asdict(unc), "broker_cpu_s": unc_cpu},
                    "read_committed": {**asdict(com), "broker_cpu_s": com_cpu},
                    "ratio": ratio,
                    "cpu_ratio": cpu_ratio,
                }
            )
            print(
                f"fetch {k + 1}: read_uncommitted {unc.records_s:>10,.0f} records/s "
                f"({unc_cpu * 1000:.0f} ms broker CPU), read_committed {com.records_s:>10,.0f} "
                f"records/s ({com_cpu * 1000:.0f} ms), {com.records:,} records; ratio "
                f"{ratio:.3f}, by broker CPU {cpu_ratio:.3f}"
            )
    finally:
        broker.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    produce_ratio = statistics.median(r["ratio"] for r in rounds)
    fetch_ratio = statistics.median(f["ratio"] for f in fetches)
    fetch_cpu_ratio = statistics.median(f["cpu_ratio"] for f in fetches)
    for label, ratio, target in (
        ("transactional / non-transactional produce", produce_ratio, PRODUCE_TARGET),
        ("read_committed / read_uncommitted fetch", fetch_ratio, FETCH_TARGET),
        ("the same by broker CPU per pass", fetch_cpu_ratio, FETCH_TARGET),
    ):
        met = "met" if ratio >= target else "MISSED"
        print(f"{label}: median {ratio:.3f} (target >= {target}: {met})")
    print(f"# loadavg after: {os.getloadavg()}")
    return {
        "started": started.isoformat(),
        "host": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "seconds": args.seconds,
        "partitions": parts,
        "commit_ms": args.commit_ms,
        "records_per_request": JSON_RECORDS,
        "produce_rounds": rounds,
        "fetch_rounds": fetches,
        "produce_ratio": produce_ratio,
        "produce_target": PRODUCE_TARGET,
        "fetch_ratio": fetch_ratio,
        "fetch_cpu_ratio": fetch_cpu_ratio,
        "fetch_target": FETCH_TARGET,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seconds", type=float, default=5.0, help="time bound of each produce case")
    p.add_argument("--partitions", type=int, default=4, help="partitions = connections")
    p.add_argument("--rounds", type=int, default=3, help="alternating rounds of each pair")
    p.add_argument("--commit-ms", type=float, default=100.0, help="commit every this many ms")
    p.add_argument("--fetch-rounds", type=int, default=8, help="read_uncommitted/committed pairs")
    p.add_argument("--data-dir", default=tempfile.gettempdir())
    p.add_argument("--json", help="write the figures here")
    args = p.parse_args(argv)
    result = run(args)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
