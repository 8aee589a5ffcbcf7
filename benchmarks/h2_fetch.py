"""HTTP/2 (h2c) fetch throughput on one connection, as a ratio to HTTP/1.1 reading the same bytes.

``python -m benchmarks.h2_fetch [--sizes-mib 1 16] [--seconds 3] [--rounds 5] [--json PATH]``

What is compared, and why it is fair:

* One server process (a child, so client and server each get a core as two brokers would)
  listens on two ports on the same event loop: ``cluster.h2transport.H2Server`` (h2c) and a
  minimal keep-alive HTTP/1.1 server (:class:`Http1Server`). Both answer ``GET /<n>`` with
  the same preallocated ``n``-byte body, written as memoryview slices of
  ``send_chunk_bytes`` (1 MiB) with the same transport write-buffer limits and the same
  wait-while-paused rule, so the only difference on the send side is HTTP/2's framing and
  flow control.
* The client (this process, same loop implementation) uses one connection per protocol and
  fetches sequentially (one request in flight, as a replication long-poll does). HTTP/1.1
  is read by :class:`Http1Client`: a ``BufferedProtocol`` that receives the body straight
  into a preallocated buffer and hands back ``bytes`` — the same delivery as ``H2Client``
  (kernel → preallocated buffer → one copy to ``bytes``). It is the fastest reasonable
  HTTP/1.1 read in Python, so the ratio is a lower bound on what h2c costs; an httpx
  HTTP/1.1 figure is printed beside it for scale.
* Each round also records the CPU seconds client and server spent per 10^9 bytes
  (``/proc/<pid>/stat`` and ``time.process_time``): on a machine shared with other work the
  wall-clock figures swing with the load, the CPU cost per byte much less.
* ``h2c_replica_wire`` is the replication fetch's own format over the same h2c connection:
  a ``cluster.replica_wire`` request for 16 partitions, answered with the JSON header and
  16 buffers of batches (slices of the same body: the leader's log reads and the follower's
  appends are not measured), decoded as ``ReplicaManager`` decodes it.
* Rounds alternate protocols (h1, h2, httpx, h1, h2, …) so load from other processes on this
  shared 2-core machine hits both; the figure is each protocol's median round. Every body's
  length is checked; ``--verify`` also compares the bytes.

MB/s are 10^6 bytes of body per second. ``--loop uvloop`` (default, what uvicorn runs the
brokers on) or ``asyncio``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, cast

import httpx

from cluster import replica_wire as wire
from cluster.h2transport import H2Client, H2Limits, H2Request, H2Response, H2Server
from cluster.replication import FetchPosition, PartitionFetchAnswer

MIB = 1024 * 1024
# Partitions per replication fetch in the replica_wire variant: a follower of 16 partitions
# of one leader, each answering an equal share.
REPLICA_PARTITIONS = 16
MAX_BODY_BYTES = 256 * MIB
HEAD_MAX_BYTES = 16 * 1024


def _body(size: int) -> bytes:
    pattern = bytes(range(256))
    return (pattern * (size // 256 + 1))[:size]


class _Bodies:
    """Preallocated response bodies by size, shared by both servers."""

    def __init__(self) -> None:
        self._by_size: dict[int, bytes] = {}

    def get(self, size: int) -> bytes:
        if not 0 <= size <= MAX_BODY_BYTES:
            raise ValueError(size)
        body = self._by_size.get(size)
        if body is None:
            body = self._by_size[size] = _body(size)
        return body


# -- HTTP/1.1, minimal and fast on both ends ------------------------------------------------------
class _Http1ServerConnection(asyncio.Protocol):
    def __init__(self, bodies: _Bodies, limits: H2Limits) -> None:
        self.bodies = bodies
        self.limits = limits
        self.buffer = bytearray()
        self.transport: asyncio.Transport | None = None
        self.writable = asyncio.Event()
        self.writable.set()
        self.queue: asyncio.Queue[int] = asyncio.Queue(maxsize=100)
        self.task: asyncio.Task[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.transport.set_write_buffer_limits(
            high=self.limits.write_buffer_high_bytes, low=self.limits.write_buffer_low_bytes
        )
        self.task = asyncio.get_running_loop().create_task(self._respond_loop())

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if len(self.buffer) > HEAD_MAX_BYTES:
            assert self.transport is not None
            self.transport.abort()
            return
        while (end := self.buffer.find(b"\r\n\r\n")) >= 0:
            head = bytes(self.buffer[:end])
            del self.buffer[: end + 4]
            path = head.split(b" ", 2)[1]
            self.queue.put_nowait(int(path.strip(b"/")))

    def pause_writing(self) -> None:
        self.writable.clear()

    def resume_writing(self) -> None:
        self.writable.set()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.task is not None:
            self.task.cancel()

    async def _respond_loop(self) -> None:
        transport = self.transport
        assert transport is not None
        chunk = self.limits.send_chunk_bytes
        while True:
            size = await self.queue.get()
            view = memoryview(self.bodies.get(size))
            transport.write(b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % size)
            for offset in range(0, size, chunk):
                if not self.writable.is_set():
                    await self.writable.wait()
                transport.write(view[offset : offset + chunk])


class Http1Client(asyncio.BufferedProtocol):
    """Keep-alive HTTP/1.1 GETs on one connection, bodies received in place (see module
    docstring). Expects ``content-length`` responses (what :class:`_Http1ServerConnection`
    sends)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.head = bytearray()
        self.scratch = bytearray(256 * 1024)
        self.body: bytearray | None = None
        self.filled = 0
        self.into_body = False
        self.done: asyncio.Future[bytes] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def get_buffer(self, sizehint: int) -> memoryview:
        if self.body is not None:
            self.into_body = True
            return memoryview(self.body)[self.filled :]
        self.into_body = False
        return memoryview(self.scratch)

    def buffer_updated(self, nbytes: int) -> None:
        if self.into_body:
            self.filled += nbytes
        else:
            self.head += memoryview(self.scratch)[:nbytes]
            end = self.head.find(b"\r\n\r\n")
            if end < 0:
                return
            length = 0
            for line in bytes(self.head[:end]).split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            rest = memoryview(self.head)[end + 4 :]
            self.body = bytearray(length)
            self.body[: len(rest)] = rest
            self.filled = len(rest)
            rest.release()
            self.head.clear()
        if self.body is not None and self.filled == len(self.body):
            body, self.body = self.body, None
            if self.done is not None and not self.done.done():
                self.done.set_result(bytes(body))

    def connection_lost(self, exc: Exception | None) -> None:
        if self.done is not None and not self.done.done():
            self.done.set_exception(ConnectionError("closed"))

    async def get(self, size: int) -> bytes:
        assert self.transport is not None
        self.done = asyncio.get_running_loop().create_future()
        self.transport.write(b"GET /%d HTTP/1.1\r\nhost: bench\r\n\r\n" % size)
        return await self.done


# -- the replication fetch's wire format --------------------------------------------------------
def _replica_answer(bodies: _Bodies, req: wire.ReplicaFetchRequest) -> H2Response:
    """What a leader answers (cluster.replica_wire): a JSON header, then every partition's raw
    batches as separate buffers, here slices of one preallocated body (the leader's log reads
    are not part of this measurement)."""
    per_partition = req.partition_max_bytes
    body = memoryview(bodies.get(per_partition * len(req.positions)))
    answers = []
    buffers: list[bytes | memoryview] = []
    for i, (tp, position) in enumerate(req.positions.items()):
        end = position.fetch_offset + 1000
        answers.append((tp, PartitionFetchAnswer(None, end, 0, end, records_bytes=per_partition)))
        buffers.append(body[i * per_partition : (i + 1) * per_partition])
    header = wire.encode_answer(answers)
    return H2Response(200, [("content-type", wire.CONTENT_TYPE)], [header, *buffers])


async def _replica_get(client: H2Client, size: int) -> int:
    """One replication fetch of ``REPLICA_PARTITIONS`` partitions totalling ``size`` bytes of
    batches, decoded as ReplicaManager decodes it; returns the batch bytes received."""
    per_partition = size // REPLICA_PARTITIONS
    req = wire.ReplicaFetchRequest(
        2,
        1,
        0,
        size,
        per_partition,
        {(f"t{i}", 0): FetchPosition(i * 1000, 1, 1) for i in range(REPLICA_PARTITIONS)},
    )
    response = await client.request("POST", wire.PATH, body=wire.encode_request(req), timeout_s=60)
    assert response.status == 200 and isinstance(response.body, bytes)
    return sum(len(data) for _, _, data in wire.decode_answer(response.body))


# -- server process ---------------------------------------------------------------------------
async def _serve(loop_name: str, chunk_bytes: int) -> None:
    bodies = _Bodies()
    limits = H2Limits(send_chunk_bytes=chunk_bytes)

    async def handler(request: H2Request) -> H2Response:
        if request.path == wire.PATH:
            return _replica_answer(bodies, wire.decode_request(request.body))
        size = int(request.path.strip("/"))
        return H2Response(200, [], [memoryview(bodies.get(size))])

    h2_server = H2Server(handler, limits=limits)
    await h2_server.start()
    loop = asyncio.get_running_loop()
    h1_server = await loop.create_server(
        lambda: _Http1ServerConnection(bodies, limits), "127.0.0.1", 0
    )
    h1_port = h1_server.sockets[0].getsockname()[1]
    print(json.dumps({"h2": h2_server.port, "h1": h1_port}), flush=True)
    # Serve until stdin closes (the parent exits or closes the pipe).
    await loop.run_in_executor(None, sys.stdin.read)
    h1_server.close()
    await h2_server.close()


# -- client -----------------------------------------------------------------------------------
# A fetch returns the body, or (replica_wire) the number of batch bytes it decoded.
Fetch = Callable[[int], Awaitable[bytes | int]]


def _process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Round:
    mb_per_s: float
    client_cpu_s_per_gb: float
    server_cpu_s_per_gb: float


async def _round(
    fetch: Fetch, size: int, seconds: float, expected: bytes | None, server_pid: int
) -> Round:
    """Sequential fetches of ``size`` bytes for about ``seconds``: throughput, and the CPU
    each side spent per 10^9 bytes (less sensitive than wall time to other load)."""
    total = 0
    server_cpu = _process_cpu_s(server_pid)
    client_cpu = time.process_time()
    start = time.perf_counter()
    deadline = start + seconds
    while True:
        body = await fetch(size)
        got = body if isinstance(body, int) else len(body)
        if got != size or (expected is not None and isinstance(body, bytes) and body != expected):
            raise AssertionError(f"wrong body: {got} bytes, expected {size}")
        total += size
        now = time.perf_counter()
        if now >= deadline:
            gb = total / 1e9
            return Round(
                total / (now - start) / 1e6,
                (time.process_time() - client_cpu) / gb,
                (_process_cpu_s(server_pid) - server_cpu) / gb,
            )


async def _measure(
    args: argparse.Namespace, ports: dict[str, int], server_pid: int
) -> dict[str, Any]:
    loop = asyncio.get_running_loop()
    h2 = H2Client("127.0.0.1", ports["h2"])
    _, h1 = await loop.create_connection(Http1Client, "127.0.0.1", ports["h1"])
    hx = httpx.AsyncClient(base_url=f"http://127.0.0.1:{ports['h1']}", timeout=60)
    fetchers: dict[str, Fetch] = {
        "http1_raw": h1.get,
        "h2c": lambda n: _h2_get(h2, n),
        "h2c_replica_wire": lambda n: _replica_get(h2, n),
    }
    if not args.no_httpx:
        fetchers["http1_httpx"] = lambda n: _httpx_get(hx, n)
    results: dict[str, Any] = {}
    try:
        for size_mib in args.sizes_mib:
            size = int(size_mib * MIB)
            expected = _body(size) if args.verify else None
            for fetch in fetchers.values():  # warm up: connections, allocator, caches
                await _round(fetch, size, 0.3, expected, server_pid)
            rounds: dict[str, list[Round]] = {name: [] for name in fetchers}
            for _ in range(args.rounds):
                for name, fetch in fetchers.items():
                    rounds[name].append(
                        await _round(fetch, size, args.seconds, expected, server_pid)
                    )

            medians = {name: _median(v, "mb_per_s") for name, v in rounds.items()}
            cpu = {
                name: {
                    "client": _median(v, "client_cpu_s_per_gb"),
                    "server": _median(v, "server_cpu_s_per_gb"),
                }
                for name, v in rounds.items()
            }
            entry: dict[str, Any] = {
                "body_bytes": size,
                "mb_per_s": medians,
                "cpu_s_per_gb": cpu,
                "rounds": {name: [asdict(r) for r in v] for name, v in rounds.items()},
                "ratio_h2c_to_http1_raw": medians["h2c"] / medians["http1_raw"],
            }
            if "http1_httpx" in medians:
                entry["ratio_h2c_to_http1_httpx"] = medians["h2c"] / medians["http1_httpx"]
            entry["ratio_h2c_replica_wire_to_http1_raw"] = (
                medians["h2c_replica_wire"] / medians["http1_raw"]
            )
            results[f"{size_mib:g}MiB"] = entry
            _print_entry(size_mib, entry)
    finally:
        await h2.close()
        await hx.aclose()
        h1.transport.close() if h1.transport is not None else None
    return results


def _median(rounds: list[Round], attr: str) -> float:
    return float(statistics.median(float(getattr(r, attr)) for r in rounds))


async def _h2_get(client: H2Client, size: int) -> bytes:
    response = await client.request("GET", f"/{size}", timeout_s=60)
    assert response.status == 200 and isinstance(response.body, bytes)
    return response.body


async def _httpx_get(client: httpx.AsyncClient, size: int) -> bytes:
    response = await client.get(f"/{size}")
    return response.content


def _print_entry(size_mib: float, entry: dict[str, Any]) -> None:
    m = entry["mb_per_s"]
    line = (
        f"{size_mib:g} MiB bodies, one connection: h2c {m['h2c']:.0f} MB/s, "
        f"HTTP/1.1 (raw) {m['http1_raw']:.0f} MB/s -> ratio {entry['ratio_h2c_to_http1_raw']:.2f}"
    )
    if "http1_httpx" in m:
        line += f"; HTTP/1.1 (httpx) {m['http1_httpx']:.0f} MB/s"
    ratio = entry["ratio_h2c_replica_wire_to_http1_raw"]
    line += (
        f"; replication fetch ({REPLICA_PARTITIONS} partitions, replica_wire) over h2c "
        f"{m['h2c_replica_wire']:.0f} MB/s -> ratio {ratio:.2f}"
    )
    print(line, flush=True)
    for name, cpu in entry["cpu_s_per_gb"].items():
        print(
            f"    {name:12} CPU per GB: client {cpu['client']:.2f} s, server {cpu['server']:.2f} s",
            flush=True,
        )


def _run(coro_factory: Callable[[], Awaitable[Any]], loop_name: str) -> Any:
    if loop_name == "uvloop":
        import uvloop

        return uvloop.run(coro_factory())  # type: ignore[arg-type]
    return asyncio.run(coro_factory())  # type: ignore[arg-type]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.h2_fetch", description=__doc__)
    parser.add_argument("--sizes-mib", type=float, nargs="+", default=[1, 16])
    parser.add_argument("--seconds", type=float, default=2.0, help="per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--loop", choices=["uvloop", "asyncio"], default="uvloop")
    parser.add_argument(
        "--chunk-mib",
        type=float,
        default=H2Limits().send_chunk_bytes / MIB,
        help="largest write (h2c: DATA frame) both servers make (default: H2Limits')",
    )
    parser.add_argument("--verify", action="store_true", help="compare every body's bytes")
    parser.add_argument("--no-httpx", action="store_true")
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.serve:
        _run(lambda: _serve(args.loop, int(args.chunk_mib * MIB)), args.loop)
        return
    child = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "benchmarks.h2_fetch",
            "--serve",
            "--loop",
            args.loop,
            "--chunk-mib",
            str(args.chunk_mib),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        ports = json.loads(child.stdout.readline())
        results = _run(lambda: _measure(args, ports, child.pid), args.loop)
    finally:
        with contextlib.suppress(OSError):
            if child.stdin is not None:
                child.stdin.close()
        try:
            child.wait(timeout=10)
        except subprocess.TimeoutExpired:
            child.kill()
    if args.json:
        report = {
            "benchmark": "h2_fetch",
            "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "loop": args.loop,
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "load_avg_1m": os.getloadavg()[0],
            "seconds_per_round": args.seconds,
            "rounds": args.rounds,
            "chunk_bytes": int(args.chunk_mib * MIB),
            "results": results,
        }
        args.json.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
