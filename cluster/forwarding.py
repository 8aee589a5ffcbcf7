"""Requests for partitions led elsewhere: forwarded to the leader over the brokers' h2c link.

A client may send any request to any broker (curl behind a load balancer). The broker that
receives a produce or a read for a partition it does not lead passes it on to the leader over
the same HTTP/2 connection its replica fetchers use, so clients see one cluster; a client that
routes itself sends ``Logbus-Route: direct`` and gets 421 ``NOT_LEADER_OR_FOLLOWER`` naming the
leader instead (:meth:`ReplicaManager.leader_of`).

Theory of operation
-------------------
* **Wire.** Internal paths on the replication listener, each a 4-byte length, a JSON header
  and raw bytes (:func:`cluster.replica_wire.frame`): ``/partition/produce`` (header: topic,
  partition, acks, whether the batches are transactional; then the record batches as the
  client's broker built them, byte for byte), ``/partition/produce-many`` (several such
  produces in one request: header ``sizes``, payload their batches one after the other; the
  answer lists each one's result or error), ``/partition/read`` (offset, max bytes, an
  optional long-poll: the answer carries the batches and the leader's high watermark, log start
  and log end), ``/partition/offset-for-timestamp``, ``/partition/marker`` (a transaction
  coordinator's COMMIT/ABORT marker, acknowledged once committed) and ``/coordinator/call`` (an
  operation for the coordinator on the leader of a state partition: the transaction coordinator,
  or a group's offsets in a transaction). Errors travel as their code, message and detail and
  are raised again on the forwarding broker, so the client gets the leader's answer.
* **Produce.** Batches keep their producer id and sequence, so the leader deduplicates an
  idempotent producer's retry as if the client had sent it directly. A forward that fails
  before the leader appended (the leader moved: ``NOT_LEADER_OR_FOLLOWER`` from the leadership
  check) is retried against the leader named by fresh metadata, at most
  :data:`FORWARD_ATTEMPTS` times; a forward that fails on the network may or may not have
  been written, so it is answered ``NETWORK_EXCEPTION`` (retriable) and never retried blindly.
* **Coalesced produce.** Forwarded produces to one partition (and acks level) that reach the
  forwarder in the same turn of the event loop go to the leader in one request
  (``/partition/produce-many``, up to :data:`FORWARD_GROUP_BYTES`), sent at the end of that
  turn (``call_soon`` twice: two passes of the loop's ready queue, as the client requests one
  read of the sockets brought reach the forwarder over two passes; with one pass 30 % of the
  forwards carried a single produce, 17.5 on average, with two 5 % and 38 on average, under
  64 connections of one-record produces): nothing waits for a timer or for another forward to
  finish, and any number of forwards may be in flight. A forward costs ≈ 250 µs of CPU on the
  two brokers together (HPACK and the ``h2`` state machine, in Python), so its produces share
  that. The leader appends each as if it had come alone (its
  own append, started in arrival order, its own result or error), so the semantics are those
  of separate requests; what is shared is the h2 stream, whose cost (HPACK, the ``h2`` state
  machine, a task on each side) was most of both brokers' CPU per forwarded one-record
  produce: 64 connections of them ran at 0.3x the same produces sent to the leader. A lone
  produce goes alone, as before. Transactional produces are never grouped.
* **Reads.** A broker with no replica reads through :class:`RemotePartition`, which has the
  :class:`core_log.manager.Partition` read API and keeps the state the last answer carried. A
  follower serves what is below its own high watermark from its replica (those batches are
  committed and byte-identical to the leader's) and asks the leader only for the rest and for
  long-polls (:class:`FollowerPartition`), so reads spread over the replicas and a client still
  reads its own acknowledged writes at once.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import Any, Protocol

from core_log.errors import ErrorCode, LogbusError, OffsetOutOfRangeError
from core_log.log import AppendResult, CommittedReadResult, ReadResult
from core_log.manager import Partition
from core_log.txn_index import AbortedTxn

from . import replica_wire as wire
from .h2transport import H2Request, H2Response, H2TransportError
from .replica_manager import NotLeaderError, ReplicaManager
from .replication import NO_LEADER

PRODUCE_PATH = "/partition/produce"
PRODUCE_MANY_PATH = "/partition/produce-many"
READ_PATH = "/partition/read"
TIMESTAMP_PATH = "/partition/offset-for-timestamp"
MARKER_PATH = "/partition/marker"
# A call for a coordinator (transactions, a group's offsets in a transaction), routed to the
# leader of the coordinator's state partition: header ``op`` names the handler registered in
# :attr:`PartitionService.coordinator_ops`.
COORDINATOR_PATH = "/coordinator/call"
PATHS = (PRODUCE_PATH, PRODUCE_MANY_PATH, READ_PATH, TIMESTAMP_PATH, MARKER_PATH, COORDINATOR_PATH)
CONTENT_TYPE = "application/vnd.logbus.partition"
# A forward the leader refused because it no longer leads is retried against the leader named
# by fresh metadata; three attempts ride out one election without looping on a stale store.
FORWARD_ATTEMPTS = 3
# A forwarded produce's caller, waiting for its own result. The produces waiting are bounded by
# the front door: each is a client request in progress, whose body its budget
# (``max_queued_request_bytes``) already holds.
_Waiter = asyncio.Future[AppendResult]
# Batches one grouped forward carries at most (a produce larger than this goes alone), so a
# forward stays well under the link's request limit and one slow group holds little.
FORWARD_GROUP_BYTES = 1024 * 1024
# A long-poll forwarded to the leader waits at most this long per round trip; the caller loops
# for longer waits. It bounds how long a request outlives a leader change.
READ_WAIT_MAX_MS = 5_000
# The client's ``Logbus-Route``: ``direct`` (True) asks for 421 instead of forwarding. The API
# sets it per request; the broker reads it where a partition is reached.
direct_route: ContextVar[bool] = ContextVar("logbus_direct_route", default=False)
ROUTES = ("forward", "direct")
# Header fields of a forwarded read's answer.
_STATE = ("high_watermark", "log_start_offset", "log_end_offset")


class PartitionReader(Protocol):
    """What routes read a partition through: a local replica or a remote leader."""

    topic: str
    partition: int

    @property
    def high_watermark(self) -> int: ...

    @property
    def log_start_offset(self) -> int: ...

    @property
    def log_end_offset(self) -> int: ...

    @property
    def released(self) -> bool: ...

    async def read(
        self,
        offset: int,
        max_bytes: int,
        *,
        max_offset: int | None = None,
        max_records: int | None = None,
    ) -> ReadResult: ...

    async def read_committed(
        self,
        offset: int,
        max_bytes: int,
        *,
        max_offset: int | None = None,
        max_records: int | None = None,
    ) -> CommittedReadResult: ...

    async def wait_for(self, offset: int, timeout_s: float) -> bool: ...

    async def offset_for_timestamp(self, timestamp: int) -> int | None: ...


# -- errors on the wire -------------------------------------------------------------------------


def error_header(e: LogbusError, *, retry_safe: bool = False) -> dict[str, Any]:
    """An error as the wire carries it; ``retry_safe``: nothing was written, another leader
    may be asked."""
    return {
        "error": {
            "code": e.code.name,
            "message": e.message,
            "detail": e.detail,
            "status": e.http_status,
            "retriable": e.retriable,
        },
        "retry_safe": retry_safe,
    }


def encode_error(e: LogbusError, *, retry_safe: bool = False) -> H2Response:
    """An error answer (:func:`error_header`)."""
    header = error_header(e, retry_safe=retry_safe)
    return H2Response(200, [("content-type", CONTENT_TYPE)], wire.frame(header))


def decode_error(d: dict[str, Any]) -> LogbusError:
    code = ErrorCode[d["code"]]
    detail = dict(d.get("detail") or {})
    e: LogbusError
    if code is ErrorCode.OFFSET_OUT_OF_RANGE and {"offset", "log_start_offset"} <= detail.keys():
        e = OffsetOutOfRangeError(
            int(detail["offset"]), int(detail["log_start_offset"]), int(detail["log_end_offset"])
        )
    else:
        e = LogbusError(str(d["message"]), code=code, **detail)
    if d.get("status") != e.http_status:
        e.http_status_override = int(d["status"])
    if d.get("retriable") != e.retriable:
        e.retriable_override = bool(d["retriable"])
    return e


# The fields of an append's result on the wire: AppendResult's, all plain ints and bools.
_RESULT_FIELDS = tuple(f.name for f in dataclasses.fields(AppendResult))


def result_fields(result: AppendResult) -> dict[str, Any]:
    """An append's result as the wire carries it: ``dataclasses.asdict`` without its deep copy
    of every field (5.6 µs a result against 0.4, timeit; the leader answers one per forwarded
    produce)."""
    return {name: getattr(result, name) for name in _RESULT_FIELDS}


def _unavailable(topic: str, partition: int) -> LogbusError:
    return LogbusError(
        f"{topic}-{partition} has no leader now (an election is under way): retry",
        code=ErrorCode.LEADER_NOT_AVAILABLE,
    )


# -- the leader's side ---------------------------------------------------------------------------


class PartitionService:
    """Answers forwarded produces and reads as the leader (mounted on the h2c listener)."""

    def __init__(self, replicas: ReplicaManager) -> None:
        self.replicas = replicas
        # op -> handler(header) -> answer header, for COORDINATOR_PATH (registered by the
        # transaction and group coordinators).
        self.coordinator_ops: dict[str, Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]] = {}
        # Called after a marker is committed here as the leader: (topic, partition, producer
        # id, commit); the group coordinator applies or drops a transaction's offsets.
        self.marker_listeners: list[Callable[[str, int, int, bool], None]] = []

    async def handle(self, request: H2Request) -> H2Response:
        try:
            header, payload = wire.unframe(request.body)
            answer, data = await self.answer(request.path, header, payload)
        except (wire.ReplicaWireError, KeyError, TypeError, ValueError) as e:
            return H2Response(400, [], f"malformed partition request: {e}".encode())
        except LogbusError as e:
            # Not leading (checked before any write): the forwarder may ask the new leader.
            return encode_error(e, retry_safe=isinstance(e, NotLeaderError))
        return H2Response(200, [("content-type", CONTENT_TYPE)], [wire.frame(answer), data])

    async def answer(
        self, path: str, header: dict[str, Any], payload: memoryview
    ) -> tuple[dict[str, Any], bytes]:
        """The answer to one request (also called in-process when the leader is here). A
        request naming this broker leader before it read the row (a topic just created, an
        election just made) is answered once the store has been read again."""
        try:
            return await self._answer(path, header, payload)
        except NotLeaderError:
            await self.replicas.refresh()
            return await self._answer(path, header, payload)

    async def _answer(
        self, path: str, header: dict[str, Any], payload: memoryview
    ) -> tuple[dict[str, Any], bytes]:
        topic, partition = str(header["topic"]), int(header["partition"])
        if path == PRODUCE_PATH:
            return await self._produce(topic, partition, header, payload), b""
        if path == PRODUCE_MANY_PATH:
            return await self._produce_many(topic, partition, header, payload), b""
        if path == READ_PATH:
            return await self._read(topic, partition, header)
        if path == TIMESTAMP_PATH:
            return await self._offset_for_timestamp(topic, partition, header), b""
        if path == MARKER_PATH:
            return await self.marker(topic, partition, header), b""
        if path == COORDINATOR_PATH:
            self.replicas.leader_of(topic, partition)  # not leading: the caller asks the leader
            handler = self.coordinator_ops.get(str(header["op"]))
            if handler is None:
                raise ValueError(f"no coordinator op {header['op']!r}")
            return await handler(header), b""
        raise ValueError(f"no such path {path!r}")

    async def marker(self, topic: str, partition: int, header: dict[str, Any]) -> dict[str, Any]:
        """Append a transaction marker as the leader (acks=all), then tell the listeners."""
        pid, commit = int(header["producer_id"]), bool(header["commit"])
        result = await self.replicas.append_marker(
            topic,
            partition,
            pid,
            int(header["producer_epoch"]),
            commit,
            int(header["coordinator_epoch"]),
        )
        for listener in self.marker_listeners:
            listener(topic, partition, pid, commit)
        return {"result": result_fields(result)}

    async def _produce(
        self, topic: str, partition: int, header: dict[str, Any], payload: memoryview
    ) -> dict[str, Any]:
        result = await self.replicas.append(
            topic,
            partition,
            payload,
            wait_for_isr=bool(header["acks_all"]),
            transactional=bool(header.get("transactional", False)),
        )
        return {"result": result_fields(result)}

    async def _produce_many(
        self, topic: str, partition: int, header: dict[str, Any], payload: memoryview
    ) -> dict[str, Any]:
        """Several forwarded produces, each appended as if it had come alone (started in
        order, concurrently, as separate requests would be; ``acks=all`` waits for the ISR
        once for them all, :meth:`ReplicaManager.append_many`): a result or an error each.
        Not leading at all refuses the whole request (retry-safe: nothing was written)."""
        self.replicas.leader_of(topic, partition)
        sizes = [int(n) for n in header["sizes"]]
        if any(n <= 0 for n in sizes) or sum(sizes) != len(payload):
            raise ValueError(f"sizes {sum(sizes)} bytes, payload {len(payload)}")
        views = []
        start = 0
        for n in sizes:
            views.append(payload[start : start + n])
            start += n
        outcomes = await self.replicas.append_many(
            topic, partition, views, wait_for_isr=bool(header["acks_all"])
        )
        results: list[dict[str, Any]] = []
        for outcome in outcomes:
            if isinstance(outcome, LogbusError):
                results.append(
                    error_header(outcome, retry_safe=isinstance(outcome, NotLeaderError))
                )
            elif isinstance(outcome, BaseException):
                raise outcome
            else:
                results.append({"result": result_fields(outcome)})
        return {"results": results}

    async def _read(
        self, topic: str, partition: int, header: dict[str, Any]
    ) -> tuple[dict[str, Any], bytes]:
        part = self.replicas.leader_of(topic, partition).partition
        wait_ms = min(max(0, int(header.get("wait_ms", 0))), READ_WAIT_MAX_MS)
        wait_offset = header.get("wait_offset")
        if wait_ms and wait_offset is not None:
            await part.wait_for(int(wait_offset), wait_ms / 1000)
            part = self.replicas.leader_of(topic, partition).partition  # still leading?
        state = _state_of(part)
        max_bytes = int(header.get("max_bytes", 0))
        if max_bytes <= 0:
            return {"state": state}, b""
        max_offset = header.get("max_offset")
        max_records = header.get("max_records")  # absent from brokers before it: no bound
        read = part.read_committed if header.get("isolation") == "read_committed" else part.read
        result = await read(
            int(header["offset"]),
            max_bytes,
            max_offset=None if max_offset is None else min(int(max_offset), part.high_watermark),
            max_records=None if max_records is None else max(1, int(max_records)),
        )
        fields = {f.name: getattr(result, f.name) for f in dataclasses.fields(result)}
        fields.pop("data")
        if "aborted_transactions" in fields:  # NamedTuples, which orjson does not encode
            fields["aborted_transactions"] = [list(a) for a in fields["aborted_transactions"]]
        return {"state": state, "read": fields}, result.data

    async def _offset_for_timestamp(
        self, topic: str, partition: int, header: dict[str, Any]
    ) -> dict[str, Any]:
        part = self.replicas.leader_of(topic, partition).partition
        found = await part.offset_for_timestamp(int(header["timestamp"]))
        state = _state_of(part)
        return {"state": state, "offset": found}


def _state_of(part: Partition) -> dict[str, int]:
    state = {k: getattr(part, k) for k in _STATE}
    state["last_stable_offset"] = part.last_stable_offset
    return state


# -- the forwarding side -------------------------------------------------------------------------


class Forwarder:
    """Sends requests for partitions led elsewhere to their leader."""

    def __init__(self, replicas: ReplicaManager, service: PartitionService) -> None:
        self.replicas = replicas
        self.service = service
        self._remotes: dict[tuple[str, int], RemotePartition] = {}
        # (topic, partition, acks_all) -> produces arrived in this turn of the event loop,
        # forwarded together at its end (an entry lives one turn).
        self._produces: dict[tuple[str, int, bool], list[tuple[bytes, _Waiter]]] = {}
        self._forwards: set[asyncio.Task[None]] = set()  # grouped forwards in flight

    async def call(
        self, topic: str, partition: int, path: str, header: dict[str, Any], payload: bytes = b""
    ) -> tuple[dict[str, Any], bytes | memoryview]:
        """One request to the partition's leader; a refusal from a broker that no longer
        leads is retried on the leader fresh metadata names."""
        rm = self.replicas
        header = {"topic": topic, "partition": partition, **header}
        body = wire.frame(header, payload)
        timeout_s = (rm.config.request_timeout_ms + rm.config.socket_timeout_ms) / 1000
        error: LogbusError = _unavailable(topic, partition)
        for attempt in range(FORWARD_ATTEMPTS):
            if attempt:
                await rm.refresh(force=True)
            leader = rm.leader_id(topic, partition)
            if leader == rm.me:  # leadership moved here meanwhile
                try:
                    return await self.service.answer(path, header, memoryview(payload))
                except NotLeaderError as e:
                    error = e
                    continue
            client = rm.client_for(leader) if leader != NO_LEADER else None
            if client is None:
                error = _unavailable(topic, partition)
                continue
            try:
                response = await client.request(
                    "POST",
                    path,
                    headers=[("content-type", CONTENT_TYPE), *rm.request_headers()],
                    body=body,
                    timeout_s=timeout_s,
                )
            except (H2TransportError, OSError, TimeoutError) as e:
                raise LogbusError(
                    f"could not reach broker {leader}, the leader of {topic}-{partition}: "
                    f"{e or type(e).__name__}; a produce may or may not have been written "
                    "(an idempotent producer's retry is safe)",
                    code=ErrorCode.NETWORK_EXCEPTION,
                ) from e
            if response.status != 200:
                raise LogbusError(
                    f"broker {leader} answered a forwarded request {response.status}",
                    code=ErrorCode.NETWORK_EXCEPTION,
                )
            raw = response.body if isinstance(response.body, bytes) else b"".join(response.body)
            try:
                answer, data = wire.unframe(raw)
            except wire.ReplicaWireError as e:
                raise LogbusError(str(e), code=ErrorCode.NETWORK_EXCEPTION) from e
            if "error" not in answer:
                return answer, data
            error = decode_error(answer["error"])
            if not answer.get("retry_safe"):
                raise error
        raise error

    async def append(
        self,
        topic: str,
        partition: int,
        data: bytes | memoryview,
        *,
        acks_all: bool,
        transactional: bool = False,
    ) -> AppendResult:
        if transactional:  # the forwarding broker checked the transaction with its coordinator
            return await self._append_one(topic, partition, bytes(data), acks_all, True)
        key = (topic, partition, acks_all)
        loop = asyncio.get_running_loop()
        waiter: _Waiter = loop.create_future()
        waiting = self._produces.get(key)
        if waiting is None:
            waiting = self._produces[key] = []
            # Two passes of the ready queue, not one (module docstring, "Coalesced produce").
            loop.call_soon(loop.call_soon, self._send, key)
        waiting.append((bytes(data), waiter))
        return await waiter

    async def _append_one(
        self, topic: str, partition: int, data: bytes, acks_all: bool, transactional: bool
    ) -> AppendResult:
        header: dict[str, Any] = {"acks_all": acks_all}
        if transactional:
            header["transactional"] = True
        answer, _ = await self.call(topic, partition, PRODUCE_PATH, header, data)
        return AppendResult(**answer["result"])

    def _send(self, key: tuple[str, int, bool]) -> None:
        """Forward the produces of ``key`` that arrived in this turn and whose callers still
        wait: in requests of up to FORWARD_GROUP_BYTES (at least one produce each)."""
        group: list[tuple[bytes, _Waiter]] = []
        size = 0
        for data, waiter in self._produces.pop(key, []):
            if waiter.done():  # the client went away before it was sent: nothing to send
                continue
            if group and size + len(data) > FORWARD_GROUP_BYTES:
                self._start(key, group)
                group, size = [], 0
            group.append((data, waiter))
            size += len(data)
        if group:
            self._start(key, group)

    def _start(self, key: tuple[str, int, bool], group: list[tuple[bytes, _Waiter]]) -> None:
        task = asyncio.get_running_loop().create_task(self._forward_group(key, group))
        self._forwards.add(task)
        task.add_done_callback(self._forwards.discard)

    async def _forward_group(
        self, key: tuple[str, int, bool], group: list[tuple[bytes, _Waiter]]
    ) -> None:
        topic, partition, acks_all = key
        try:
            if len(group) == 1:
                outcomes: list[AppendResult | BaseException] = []
                try:
                    outcomes.append(
                        await self._append_one(topic, partition, group[0][0], acks_all, False)
                    )
                except Exception as e:
                    outcomes.append(e)
            else:
                outcomes = await self._append_many(topic, partition, group, acks_all)
            for (_, waiter), outcome in zip(group, outcomes, strict=True):
                if waiter.done():
                    continue
                if isinstance(outcome, BaseException):
                    waiter.set_exception(outcome)
                else:
                    waiter.set_result(outcome)
        except BaseException:  # cancelled (the broker stops): no caller may wait for ever
            for _, waiter in group:
                if not waiter.done():
                    waiter.set_exception(
                        LogbusError(
                            f"the forward to the leader of {topic}-{partition} was cancelled; "
                            "the produce may or may not have been written",
                            code=ErrorCode.NETWORK_EXCEPTION,
                        )
                    )
            raise

    async def _append_many(
        self,
        topic: str,
        partition: int,
        group: list[tuple[bytes, _Waiter]],
        acks_all: bool,
    ) -> list[AppendResult | BaseException]:
        """One ``produce-many`` forward; each produce's result or error. One the leader
        refused as not leading (nothing written) is sent again alone, through the retries
        of :meth:`call`."""
        header = {"acks_all": acks_all, "sizes": [len(d) for d, _ in group]}
        try:
            answer, _ = await self.call(
                topic, partition, PRODUCE_MANY_PATH, header, b"".join(d for d, _ in group)
            )
            results = answer["results"]
            if len(results) != len(group):
                raise LogbusError(
                    f"{len(results)} answers to {len(group)} forwarded produces",
                    code=ErrorCode.NETWORK_EXCEPTION,
                )
        except Exception as e:
            return [e] * len(group)
        outcomes: list[AppendResult | BaseException] = []
        for (data, _), r in zip(group, results, strict=True):
            if "error" not in r:
                outcomes.append(AppendResult(**r["result"]))
            elif r.get("retry_safe"):
                try:
                    outcomes.append(await self._append_one(topic, partition, data, acks_all, False))
                except Exception as e:
                    outcomes.append(e)
            else:
                outcomes.append(decode_error(r["error"]))
        return outcomes

    async def append_marker(
        self,
        topic: str,
        partition: int,
        producer_id: int,
        producer_epoch: int,
        commit: bool,
        coordinator_epoch: int,
    ) -> AppendResult:
        """A transaction marker on the partition's leader (here or there), acks=all."""
        header = {
            "producer_id": producer_id,
            "producer_epoch": producer_epoch,
            "commit": commit,
            "coordinator_epoch": coordinator_epoch,
        }
        answer, _ = await self.call(topic, partition, MARKER_PATH, header)
        return AppendResult(**answer["result"])

    async def coordinator_call(
        self, topic: str, partition: int, op: str, header: dict[str, Any]
    ) -> dict[str, Any]:
        """A coordinator operation on the leader of its state partition ``topic``-``partition``."""
        answer, _ = await self.call(topic, partition, COORDINATOR_PATH, {"op": op, **header})
        return answer

    def remote(self, topic: str, partition: int) -> RemotePartition:
        """The one reader of a partition led elsewhere (it keeps the last state seen)."""
        tp = (topic, partition)
        r = self._remotes.get(tp)
        if r is None:
            if len(self._remotes) >= MAX_REMOTE_READERS:
                self._remotes.clear()  # a cache: readers in use keep working
            r = self._remotes[tp] = RemotePartition(self, topic, partition)
        return r

    def forget(self, topic: str, partition: int) -> None:
        r = self._remotes.pop((topic, partition), None)
        if r is not None:
            r.released = True


# Remote readers cached (one per partition read through this broker); past it the cache starts
# over rather than grow with every partition of a large cluster.
MAX_REMOTE_READERS = 10_000


class RemotePartition:
    """A partition read from its leader on another broker, with the Partition read API.

    The properties give the state the last answer carried (``-1`` before the first):
    :meth:`sync` refreshes them for a caller that checks an offset against them.
    """

    def __init__(self, forwarder: Forwarder, topic: str, partition: int) -> None:
        self.forwarder = forwarder
        self.topic = topic
        self.partition = partition
        self.high_watermark = -1
        self.log_start_offset = -1
        self.log_end_offset = -1
        self.last_stable_offset = -1
        self.released = False

    def _keep(self, state: dict[str, Any]) -> None:
        self.high_watermark = int(state["high_watermark"])
        self.log_start_offset = int(state["log_start_offset"])
        self.log_end_offset = int(state["log_end_offset"])
        self.last_stable_offset = int(state.get("last_stable_offset", self.high_watermark))

    async def sync(self) -> None:
        answer, _ = await self.forwarder.call(self.topic, self.partition, READ_PATH, {})
        self._keep(answer["state"])

    async def read(
        self,
        offset: int,
        max_bytes: int,
        *,
        max_offset: int | None = None,
        max_records: int | None = None,
    ) -> ReadResult:
        header = {
            "offset": offset,
            "max_bytes": max_bytes,
            "max_offset": max_offset,
            "max_records": max_records,
        }
        answer, data = await self.forwarder.call(self.topic, self.partition, READ_PATH, header)
        self._keep(answer["state"])
        return ReadResult(data=bytes(data), **answer["read"])

    async def read_committed(
        self,
        offset: int,
        max_bytes: int,
        *,
        max_offset: int | None = None,
        max_records: int | None = None,
    ) -> CommittedReadResult:
        """:meth:`read` at ``read_committed``, done by the leader (it alone knows the last
        stable offset for certain), with the aborted transactions of the data."""
        header = {
            "offset": offset,
            "max_bytes": max_bytes,
            "max_offset": max_offset,
            "max_records": max_records,
            "isolation": "read_committed",
        }
        answer, data = await self.forwarder.call(self.topic, self.partition, READ_PATH, header)
        self._keep(answer["state"])
        fields = dict(answer["read"])
        aborted = tuple(
            AbortedTxn(*(int(v) for v in row)) for row in fields.pop("aborted_transactions")
        )
        return CommittedReadResult(data=bytes(data), aborted_transactions=aborted, **fields)

    async def wait_for(self, offset: int, timeout_s: float) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        while self.high_watermark <= offset and not self.released:
            remaining_ms = int((deadline - loop.time()) * 1000)
            if remaining_ms <= 0:
                return False
            header = {"wait_offset": offset, "wait_ms": min(remaining_ms, READ_WAIT_MAX_MS)}
            answer, _ = await self.forwarder.call(self.topic, self.partition, READ_PATH, header)
            self._keep(answer["state"])
        return self.high_watermark > offset

    async def offset_for_timestamp(self, timestamp: int) -> int | None:
        answer, _ = await self.forwarder.call(
            self.topic, self.partition, TIMESTAMP_PATH, {"timestamp": timestamp}
        )
        self._keep(answer["state"])
        found = answer["offset"]
        return None if found is None else int(found)


class FollowerPartition:
    """A partition this broker follows: committed batches from the local replica, the rest
    and long-polls from the leader."""

    def __init__(self, local: PartitionReader, remote: RemotePartition) -> None:
        self.local = local
        self.remote = remote
        self.topic = local.topic
        self.partition = local.partition

    @property
    def high_watermark(self) -> int:
        return max(self.local.high_watermark, self.remote.high_watermark)

    @property
    def log_start_offset(self) -> int:
        if self.remote.log_start_offset < 0:
            return self.local.log_start_offset
        return max(self.local.log_start_offset, self.remote.log_start_offset)

    @property
    def log_end_offset(self) -> int:
        return max(self.local.log_end_offset, self.remote.log_end_offset)

    @property
    def released(self) -> bool:
        return self.local.released or self.remote.released

    async def sync(self) -> None:
        await self.remote.sync()

    async def read(
        self,
        offset: int,
        max_bytes: int,
        *,
        max_offset: int | None = None,
        max_records: int | None = None,
    ) -> ReadResult:
        local_hw = self.local.high_watermark
        if self.local.log_start_offset <= offset < local_hw and max_offset is None:
            result = await self.local.read(offset, max_bytes, max_records=max_records)
            # The leader's high watermark, when known, is the truth a reader should see.
            return dataclasses.replace(result, high_watermark=self.high_watermark)
        return await self.remote.read(
            offset, max_bytes, max_offset=max_offset, max_records=max_records
        )

    async def read_committed(
        self,
        offset: int,
        max_bytes: int,
        *,
        max_offset: int | None = None,
        max_records: int | None = None,
    ) -> CommittedReadResult:
        # From the leader: the local replica's last stable offset may trail the leader's.
        return await self.remote.read_committed(
            offset, max_bytes, max_offset=max_offset, max_records=max_records
        )

    async def wait_for(self, offset: int, timeout_s: float) -> bool:
        if self.high_watermark > offset:
            return True
        return await self.remote.wait_for(offset, timeout_s)

    async def offset_for_timestamp(self, timestamp: int) -> int | None:
        return await self.remote.offset_for_timestamp(timestamp)


async def synced(reader: PartitionReader) -> PartitionReader:
    """``reader`` with its state fresh (a round trip to the leader when it is remote)."""
    if isinstance(reader, RemotePartition | FollowerPartition):
        await reader.sync()
    return reader
