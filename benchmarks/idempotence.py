"""Idempotent produce vs plain produce over HTTP, measured in one run against one broker.

    python -m benchmarks.idempotence [--seconds 5] [--partitions 4] [--data-dir DIR]

Starts a broker (:class:`api.process.BrokerProcess`) and creates one topic per case. An
idempotent batch must carry the next sequence, so a static body replayed by wrk cannot measure
it; both sides of every ratio are therefore sent by the *same* client code: a raw asyncio
HTTP/1.1 client, one keep-alive connection per partition, requests sent one after the other
in order (``acks=1``), for ``--seconds`` or until the pre-built requests run out.

1. binary produce of ~1 MiB batches of 100-byte records (``binary_batch``): plain batches
   (no producer id) vs idempotent ones (producer id and epoch from ``POST /v1/producers``,
   ``base_sequence`` increasing by the record count per partition). The idempotent batches
   are pre-built from the plain one by patching the producer fields and the CRC (checked to
   equal ``build_batch``'s output).
2. JSON produce of 1,000 records of 100-byte values to a partition path: plain vs with the
   producer-session headers (Logbus-Producer-Id/-Epoch/-Sequence, sequence += 1,000).

For reference, wrk replays the plain binary batch on the same number of connections, so the
client's own cost can be judged. MB = 10^6 bytes of request body.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from api.process import BrokerProcess
from benchmarks.http import binary_batch, json_body, run_wrk
from core_log.batch import build_batch, decode_records, with_producer

MB = 1_000_000
TARGET_RATIO = 0.90
BATCH_TYPE = "application/vnd.logbus.batch"
JSON_RECORDS = 1000


@dataclass
class Request:
    body: bytes
    headers: dict[str, str]


@dataclass
class Outcome:
    requests: int
    body_bytes: int
    seconds: float
    per_path: list[int]

    @property
    def mb_s(self) -> float:
        return self.body_bytes / MB / self.seconds


async def _send_all(
    port: int, path: str, content_type: str, requests: list[Request], deadline: float
) -> tuple[int, int]:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    sent = body_bytes = 0
    try:
        for req in requests:
            if time.perf_counter() >= deadline:
                break
            extra = "".join(f"{k}: {v}\r\n" for k, v in req.headers.items())
            head = (
                f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                f"Content-Type: {content_type}\r\n"
                f"Accept: application/json\r\nContent-Length: {len(req.body)}\r\n{extra}\r\n"
            ).encode()
            writer.write(head)
            writer.write(req.body)
            await writer.drain()
            status_line = await reader.readline()
            status = int(status_line.split()[1])
            length = 0
            duplicate = False
            while (line := await reader.readline()) not in (b"\r\n", b""):
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
                elif name.strip().lower() == b"logbus-duplicate":
                    duplicate = True
            reply = await reader.readexactly(length)
            if status != 200 or duplicate:
                raise RuntimeError(f"POST {path}: {status} {reply[:300]!r}")
            sent += 1
            body_bytes += len(req.body)
    finally:
        writer.close()
        await writer.wait_closed()
    return sent, body_bytes


async def _run_case(
    port: int, paths: list[str], content_type: str, per_path: list[list[Request]], seconds: float
) -> Outcome:
    start = time.perf_counter()
    results = await asyncio.gather(
        *(
            _send_all(port, path, content_type, reqs, start + seconds)
            for path, reqs in zip(paths, per_path, strict=True)
        )
    )
    elapsed = time.perf_counter() - start
    return Outcome(
        sum(r[0] for r in results), sum(r[1] for r in results), elapsed, [r[0] for r in results]
    )


def run_case(
    port: int, paths: list[str], content_type: str, per_path: list[list[Request]], seconds: float
) -> Outcome:
    return asyncio.run(_run_case(port, paths, content_type, per_path, seconds))


def _producer(c: httpx.Client) -> tuple[int, int]:
    r = c.post("/v1/producers", json={})
    r.raise_for_status()
    body = r.json()
    return int(body["producer_id"]), int(body["producer_epoch"])


def run(args: argparse.Namespace) -> int:
    started = datetime.datetime.now(datetime.UTC)
    print(f"# idempotence benchmark, {started:%Y-%m-%d %H:%M:%S} UTC")
    print(
        f"# {platform.node()} {platform.machine()} cpus={os.cpu_count()} "
        f"python={platform.python_version()} loadavg={os.getloadavg()}"
    )
    parts = args.partitions
    seconds = args.seconds
    base = Path(args.data_dir)
    base.mkdir(parents=True, exist_ok=True)
    workdir = Path(tempfile.mkdtemp(prefix="idem-", dir=base))
    broker = BrokerProcess(workdir / "data").start()
    port = broker.port
    try:
        topics = ("idem-bin-plain", "idem-bin-idem", "idem-json-plain", "idem-json-idem")
        with httpx.Client(base_url=broker.url, timeout=60) as c:
            for t in topics:
                c.post("/v1/topics", json={"name": t, "partitions": parts}).raise_for_status()
            bin_pid, bin_epoch = _producer(c)
            json_pid, json_epoch = _producer(c)

        def paths(topic: str) -> list[str]:
            return [f"/v1/topics/{topic}/partitions/{p}/records?acks=1" for p in range(parts)]

        # -- binary ---------------------------------------------------------------------------
        plain, n = binary_batch()
        check = with_producer(plain, 7, 3, 11)
        records = decode_records(plain)
        expected = build_batch(records, producer_id=7, producer_epoch=3, base_sequence=11)
        assert check == expected, "patched batch differs from build_batch"
        per_part = args.batches or max(8, int(seconds * 100))
        bin_plain = [[Request(plain, {}) for _ in range(per_part)] for _ in range(parts)]
        print(
            f"binary: {len(plain):,}-byte batches of {n:,} records, "
            f"{per_part} per partition x {parts} partitions pre-built per case"
        )
        # Rounds of plain then idempotent; each round's idempotent batches are built (outside
        # the timed part) with sequences continuing from the previous round.
        bin_rounds: list[tuple[Outcome, Outcome]] = []
        seqs = [0] * parts
        for _ in range(args.rounds):
            bin_idem = [
                [
                    Request(with_producer(plain, bin_pid, bin_epoch, seqs[p] + i * n), {})
                    for i in range(per_part)
                ]
                for p in range(parts)
            ]
            r_plain = run_case(port, paths("idem-bin-plain"), BATCH_TYPE, bin_plain, seconds)
            r_idem = run_case(port, paths("idem-bin-idem"), BATCH_TYPE, bin_idem, seconds)
            for p, sent in enumerate(r_idem.per_path):  # sequences are per partition
                seqs[p] += sent * n
            del bin_idem
            bin_rounds.append((r_plain, r_idem))
        ratios_bin = [i.mb_s / p.mb_s for p, i in bin_rounds]
        ratio_bin = statistics.median(ratios_bin)

        # -- JSON -----------------------------------------------------------------------------
        body = json_body(JSON_RECORDS)
        per_part_json = max(50, int(seconds * 400))
        json_plain = [[Request(body, {}) for _ in range(per_part_json)] for _ in range(parts)]
        json_idem = [
            [
                Request(
                    body,
                    {
                        "Logbus-Producer-Id": str(json_pid),
                        "Logbus-Producer-Epoch": str(json_epoch),
                        "Logbus-Sequence": str(i * JSON_RECORDS),
                    },
                )
                for i in range(per_part_json)
            ]
            for _ in range(parts)
        ]
        j_plain = run_case(port, paths("idem-json-plain"), "application/json", json_plain, seconds)
        j_idem = run_case(port, paths("idem-json-idem"), "application/json", json_idem, seconds)
        ratio_json = j_idem.mb_s / j_plain.mb_s

        # -- wrk reference: the plain binary batch replayed ----------------------------------
        wrk = run_wrk(
            f"{broker.url}{paths('idem-bin-plain')[0]}",
            workdir,
            seconds=seconds,
            connections=parts,
            method="POST",
            body=plain,
            content_type=BATCH_TYPE,
        )
        wrk_mb_s = wrk.requests_per_s * len(plain) / MB
    finally:
        broker.stop()
        shutil.rmtree(workdir, ignore_errors=True)

    def line(label: str, o: Outcome, records_per_request: int) -> str:
        records_s = o.requests / o.seconds * records_per_request
        return (
            f"{label:<44} {o.mb_s:8.1f} MB/s  {records_s:>12,.0f}"
            f" records/s  ({o.requests} requests in {o.seconds:.2f} s)"
        )

    for k, (rp, ri) in enumerate(bin_rounds, 1):
        print(line(f"binary 1 MiB, plain, acks=1 (round {k})", rp, n))
        print(line(f"binary 1 MiB, idempotent, acks=1 (round {k})", ri, n))
        print(f"  round {k} ratio: {ri.mb_s / rp.mb_s:.1%}")
    met = "met" if ratio_bin >= TARGET_RATIO else "NOT met"
    print(f"  median ratio idempotent/plain (binary): {ratio_bin:.1%} (target >= 90%: {met})")
    print(line("JSON 1,000 records, plain, acks=1", j_plain, JSON_RECORDS))
    print(line("JSON 1,000 records, producer session, acks=1", j_idem, JSON_RECORDS))
    met = "met" if ratio_json >= TARGET_RATIO else "NOT met"
    print(f"  ratio idempotent/plain (JSON): {ratio_json:.1%} (target >= 90%: {met})")
    print(
        f"wrk reference, plain binary, {parts} connections, 1 partition: {wrk_mb_s:.1f} MB/s "
        f"(p50 {wrk.latency_p50_ms:.1f} ms)"
    )
    print(f"# loadavg after: {os.getloadavg()}")
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seconds", type=float, default=5.0, help="time bound of each case")
    p.add_argument("--partitions", type=int, default=4, help="partitions = connections")
    p.add_argument("--rounds", type=int, default=2, help="plain/idempotent binary rounds")
    p.add_argument("--batches", type=int, default=0, help="1 MiB batches per partition")
    p.add_argument("--data-dir", type=Path, default=Path("bench-data"))
    return run(p.parse_args())


if __name__ == "__main__":
    sys.exit(main())
