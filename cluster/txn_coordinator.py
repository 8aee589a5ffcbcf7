"""The transaction coordinator: :mod:`cluster.txn_state` wired to the log, the leadership layer
and the other brokers.

Theory of operation
-------------------
* **Who coordinates.** A transactional id lives in partition
  :func:`~cluster.txn_state.txn_state_partition` of the compacted internal topic
  ``__transaction_state``; the broker leading that partition coordinates it, exactly as a
  group's coordinator leads its ``__consumer_offsets`` partition (:mod:`cluster.coordinator`).
  On becoming leader (:attr:`cluster.broker.Broker.role_listeners`) a broker *loads* the
  partition: waits until its high watermark covers its log, reads every record and rebuilds a
  :class:`~cluster.txn_state.TxnCoordinatorState` whose coordinator epoch is the partition's
  leader epoch. It then finishes what the old coordinator left: every transaction found in
  PREPARE_COMMIT/PREPARE_ABORT has its markers written and is completed; ONGOING ones go on
  and time out as usual. Losing the leadership (or a leader epoch change) unloads it.
* **Any broker answers.** Clients call any broker. :meth:`TxnCoordinator.call` routes an
  operation to the leader of the id's partition over the brokers' link
  (:meth:`cluster.broker.Broker.coordinator_call`), where :meth:`_serve` runs it; a broker that
  leads the partition but is still loading answers ``COORDINATOR_LOAD_IN_PROGRESS``, one that
  stopped leading ``NOT_COORDINATOR``. :meth:`call` retries those (and
  ``CONCURRENT_TRANSACTIONS``, while a transaction's markers are being written) for up to
  :data:`CALL_RETRY_S`, so an HTTP client sees a coordinator failover as a slower answer, not an
  error it must handle.
* **Prepare -> persist -> apply.** Each operation asks the state machine for a result, appends
  its record to ``__transaction_state`` with ``acks=all`` on this broker (never forwarded: a
  deposed coordinator must not write into the new leader's log), applies it, then answers. A
  write refused before it reached the log (too few in-sync replicas, a record too large) is
  abandoned; any other failure leaves the log's content unknown, so the partition is unloaded
  and loaded again: memory always agrees with the log.
* **Markers.** An end (commit, abort, a timeout, an admin abort, an ``init`` that fences an open
  transaction) is decided once its PREPARE_* record is durable. Then one task per transaction
  writes a COMMIT/ABORT marker on each of its partitions and on the ``__consumer_offsets``
  partition of each of its groups, through each partition's leader
  (:meth:`~cluster.broker.Broker.write_marker`, acks=all), retrying failed ones with backoff
  while this broker coordinates; a partition whose topic is gone is skipped, as in Kafka. Once
  all are written the COMPLETE_* record is appended. An end is answered when its markers are
  written (so a ``read_committed`` reader sees a commit as soon as its producer does), or after
  ``request.timeout.ms`` with ``"completed": false`` (the decision is durable; the markers
  follow). Until COMPLETE_* the next transaction of that id waits (``CONCURRENT_TRANSACTIONS``).
* **Producer ids** come from the metadata store's counter, taken :data:`PID_BLOCK` at a time
  (never reused; a block left at a restart is skipped). The coordinator owns each id's epoch;
  every id it loads or initialises is told to the broker, which fences older epochs of
  non-transactional writes too (:meth:`~cluster.broker.Broker.note_producer_epoch`).
* **Time.** One task wakes every ``transaction.abort.timed.out.transaction.cleanup.interval.ms``
  (10 s) and aborts transactions open past their ``transaction.timeout.ms`` (with an epoch bump,
  fencing their producer) and expires ids idle for ``transactional.id.expiration.ms``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from core_log.batch import Record, build_batch, iter_records
from core_log.errors import ErrorCode, LogbusError, TopicAlreadyExistsError

from .broker import OFFSETS_TOPIC, Acks, Broker, offsets_partition
from .coordinator import Coordinator
from .txn_state import (
    TXN_STATE_TOPIC,
    TxnConfig,
    TxnCoordinatorState,
    TxnMarkers,
    TxnMetadata,
    TxnResult,
    TxnState,
    txn_state_partition,
    validate_transactional_id,
)

log = logging.getLogger("logbus.txn")

TXN_TOPIC_CONFIGS = {"cleanup.policy": "compact", "segment.bytes": 16 * 1024 * 1024}
DEFAULT_TRANSACTION_TIMEOUT_MS = 60_000  # the producer's transaction.timeout.ms
ABORT_INTERVAL_MS = 10_000  # transaction.abort.timed.out.transaction.cleanup.interval.ms
LOAD_READ_BYTES = 1024 * 1024
PID_BLOCK = 100  # producer ids taken from the store at a time
CALL_RETRY_S = 10.0  # how long a call retries a coordinator that is moving or busy
CALL_BACKOFF_S = (0.02, 0.5)
MARKER_BACKOFF_S = (0.05, 2.0)
MAX_LISTED = 10_000  # transactions one list answer carries at most
END_WAIT_S = 30.0  # an end waits this long for its markers (Kafka's request.timeout.ms)
# Retried by :meth:`TxnCoordinator.call`: the coordinator is moving, loading, or finishing the
# previous transaction of the id.
_RETRIED = frozenset(
    {
        ErrorCode.NOT_COORDINATOR,
        ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
        ErrorCode.COORDINATOR_NOT_AVAILABLE,
        ErrorCode.CONCURRENT_TRANSACTIONS,
        ErrorCode.LEADER_NOT_AVAILABLE,
        ErrorCode.NOT_LEADER_OR_FOLLOWER,
    }
)
# Refused before anything reached the log: the result is abandoned, memory stays right.
_NOT_WRITTEN = frozenset(
    {
        ErrorCode.NOT_ENOUGH_REPLICAS,
        ErrorCode.MESSAGE_TOO_LARGE,
        ErrorCode.RECORD_LIST_TOO_LARGE,
        ErrorCode.KAFKA_STORAGE_ERROR,
    }
)
# A marker that needs no retry: the topic is gone, or a newer epoch already ended it there.
_MARKER_DONE = frozenset({ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, ErrorCode.INVALID_PRODUCER_EPOCH})


@dataclass(eq=False)
class _Slot:
    """One ``__transaction_state`` partition led here: loading (``state`` None) or loaded."""

    epoch: int
    state: TxnCoordinatorState | None = None
    task: asyncio.Task[None] | None = None
    completing: dict[str, asyncio.Task[bool]] = field(default_factory=dict)
    marked: dict[str, asyncio.Event] = field(default_factory=dict)  # its markers are written
    adding: dict[str, _Adding] = field(default_factory=dict)  # an add being written, per id


@dataclass(eq=False)
class _Adding:
    """The adds of one producer session that arrived while an add of the id was being written:
    they go in the next write together (a produce to each of 4 partitions costs one
    ``__transaction_state`` write after the first, not three more in a row)."""

    producer: tuple[int, int]
    partitions: set[tuple[str, int]] = field(default_factory=set)
    groups: set[str] = field(default_factory=set)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    error: LogbusError | None = None
    started: bool = False  # being written: later adds wait for the next write


class TxnCoordinator:
    def __init__(
        self,
        broker: Broker,
        groups: Coordinator | None = None,
        *,
        partitions: int = 4,
        config: TxnConfig | None = None,
        abort_interval_ms: int = ABORT_INTERVAL_MS,
    ) -> None:
        self.broker = broker
        self.groups = groups  # the group coordinator: a transaction's offsets
        self.clock = broker.clock
        self.partitions = partitions
        self.config = config or TxnConfig()
        self.abort_interval_ms = abort_interval_ms
        self._slots: dict[int, _Slot] = {}
        self._pids: list[int] = []
        self._pid_lock = asyncio.Lock()
        self._task: asyncio.Task[None] | None = None
        self._create_task: asyncio.Future[None] | None = None
        self._closed = False

    # -- lifecycle -------------------------------------------------------------------------------

    async def start(self) -> None:
        ops: dict[str, Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]] = {
            "txn.init": self._op_init,
            "txn.add": self._op_add,
            "txn.end": self._op_end,
            "txn.admin_abort": self._op_admin_abort,
            "txn.list": self._op_list,
            "txn.describe": self._op_describe,
        }
        if self.groups is not None:
            ops["group.txn_offsets"] = self._op_group_offsets
            self.broker.marker_listeners.append(self._marker_committed)
        self.broker.coordinator_ops.update(ops)
        try:
            self.broker.topic(TXN_STATE_TOPIC)
        except LogbusError:
            if not self.broker.config.clustered:
                await self._create_topic()
        self.broker.role_listeners.append(self._roles_changed)
        self._roles_changed()
        await asyncio.gather(
            *(s.task for s in self._slots.values() if s.task is not None), return_exceptions=True
        )
        self._task = asyncio.create_task(self._expiry_loop(), name="txn-expiry")

    async def close(self) -> None:
        self._closed = True
        tasks: list[asyncio.Future[Any]] = []
        if self._task is not None:
            tasks.append(self._task)
        for slot in self._slots.values():
            if slot.task is not None:
                tasks.append(slot.task)
            tasks.extend(slot.completing.values())
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _create_topic(self) -> None:
        try:
            await self.broker.create_topic(
                TXN_STATE_TOPIC,
                self.partitions,
                self.broker.offsets_replication_factor(),
                configs=TXN_TOPIC_CONFIGS,
            )
        except TopicAlreadyExistsError:  # another broker of the cluster made it first
            await self.broker.refresh_metadata()

    def _known_partitions(self) -> int | None:
        try:
            return self.broker.topic(TXN_STATE_TOPIC).partitions
        except LogbusError:
            return None

    def _partition_count(self) -> int:
        """The topic's partition count; COORDINATOR_NOT_AVAILABLE (its creation started, in a
        cluster) while it does not exist."""
        n = self._known_partitions()
        if n is not None:
            return n
        if self._create_task is None or self._create_task.done():
            self._create_task = asyncio.ensure_future(self._create_topic())
            self._create_task.add_done_callback(_log_failure)
        raise LogbusError(
            f"{TXN_STATE_TOPIC} is being created; try again",
            code=ErrorCode.COORDINATOR_NOT_AVAILABLE,
        )

    # -- loading ---------------------------------------------------------------------------------

    def _roles_changed(self) -> None:
        n = self._known_partitions()
        if self._closed or n is None:
            return
        self.partitions = n
        for p in range(n):
            epoch = self.broker.leader_epoch(TXN_STATE_TOPIC, p)
            slot = self._slots.get(p)
            if slot is not None and slot.epoch == epoch:
                continue
            if slot is not None:
                self._unload(p, f"leadership moved (epoch {slot.epoch} -> {epoch})")
            if epoch is not None:
                self._start_load(p, epoch)

    def _start_load(self, p: int, epoch: int) -> None:
        slot = self._slots[p] = _Slot(epoch)
        slot.task = asyncio.create_task(self._load(p, slot), name=f"txn-load-{p}")

    async def _load(self, p: int, slot: _Slot) -> None:
        records: list[Record] = []
        try:
            part = self.broker.partition(TXN_STATE_TOPIC, p)
            end = part.log_end_offset  # nothing else writes here until the load is done
            while part.high_watermark < end:
                if self._slots.get(p) is not slot:
                    return
                await part.wait_for(part.high_watermark, 1.0)
            offset = part.log_start_offset
            while offset < end:
                result = await part.read(offset, LOAD_READ_BYTES, max_offset=end)
                if not result.data:
                    break
                records.extend(r for r in iter_records(result.data) if offset <= r.offset < end)
                offset = result.next_offset
        except LogbusError as e:  # lost the leadership, storage: the next role check retries
            log.warning("%s-%d: load failed: %s", TXN_STATE_TOPIC, p, e)
            if self._slots.get(p) is slot:
                del self._slots[p]
            return
        if self._slots.get(p) is not slot:
            return
        state = TxnCoordinatorState.load(records, coordinator_epoch=slot.epoch, config=self.config)
        for m in state.transactions.values():
            self.broker.note_producer_epoch(m.producer_id, m.producer_epoch)
        slot.state = state
        pending = state.pending_markers()
        log.info(
            "%s-%d: coordinating %d transactional ids in epoch %d (%d to complete, %d corrupt)",
            TXN_STATE_TOPIC,
            p,
            len(state.transactions),
            slot.epoch,
            len(pending),
            state.corrupt_records,
        )
        for markers in pending:
            self._complete_later(p, slot, markers)

    def _unload(self, p: int, why: str) -> None:
        slot = self._slots.pop(p, None)
        if slot is None:
            return
        log.info("%s-%d: unloading: %s", TXN_STATE_TOPIC, p, why)
        if slot.task is not None:
            slot.task.cancel()
        for t in slot.completing.values():
            t.cancel()

    def _reload(self, p: int, slot: _Slot, why: str) -> None:
        """Memory may disagree with the log (a write's outcome is unknown): load again."""
        if self._slots.get(p) is not slot:
            return
        self._unload(p, why)
        epoch = self.broker.leader_epoch(TXN_STATE_TOPIC, p)
        if epoch is not None and not self._closed:
            self._start_load(p, epoch)

    # -- the calls clients make, on any broker ---------------------------------------------------

    async def call(self, op: str, transactional_id: str, **args: Any) -> dict[str, Any]:
        """Run ``op`` for ``transactional_id`` on its coordinator, wherever it is, retrying for
        up to :data:`CALL_RETRY_S` while the coordinator moves, loads or completes the id's
        previous transaction."""
        validate_transactional_id(transactional_id)
        header = {"transactional_id": transactional_id, **args}

        async def attempt() -> dict[str, Any]:
            p = txn_state_partition(transactional_id, self._partition_count())
            return await self.broker.coordinator_call(TXN_STATE_TOPIC, p, op, header)

        return await _retrying(attempt)

    async def send_offsets(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        group_id: str,
        offsets: dict[tuple[str, int], tuple[int, str]],
        *,
        member_id: str | None = None,
        generation: int | None = None,
    ) -> None:
        """Kafka's sendOffsetsToTransaction: the group joins the transaction (its offsets
        partition gets a marker at the end), then its coordinator writes the offsets as the
        producer's transactional records, applied only by a COMMIT marker."""
        await self.add_offsets(transactional_id, producer_id, producer_epoch, group_id)
        header = {
            "group_id": group_id,
            "producer_id": producer_id,
            "producer_epoch": producer_epoch,
            "offsets": [[t, p, o, m] for (t, p), (o, m) in sorted(offsets.items())],
            "member_id": member_id,
            "generation": generation,
        }

        async def attempt() -> dict[str, Any]:
            try:
                n = self.broker.topic(OFFSETS_TOPIC).partitions
            except LogbusError:
                raise LogbusError(
                    f"{OFFSETS_TOPIC} does not exist yet", code=ErrorCode.COORDINATOR_NOT_AVAILABLE
                ) from None
            p = offsets_partition(group_id, n)
            return await self.broker.coordinator_call(OFFSETS_TOPIC, p, "group.txn_offsets", header)

        await _retrying(attempt)

    async def init_producer(
        self, transactional_id: str, timeout_ms: int = DEFAULT_TRANSACTION_TIMEOUT_MS
    ) -> tuple[int, int]:
        """A producer id and epoch for ``transactional_id``: a new session that fences every
        older one (an open transaction of the id is aborted first)."""
        answer = await self.call("txn.init", transactional_id, timeout_ms=timeout_ms)
        return int(answer["producer_id"]), int(answer["producer_epoch"])

    async def add_partitions(
        self,
        transactional_id: str,
        producer_id: int,
        producer_epoch: int,
        partitions: Iterable[tuple[str, int]],
    ) -> None:
        """Add partitions to the producer's transaction (beginning one): called by the broker
        before it appends the producer's transactional batches (KIP-890's server-side check)."""
        await self.call(
            "txn.add",
            transactional_id,
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            partitions=[[t, p] for t, p in partitions],
        )

    async def add_offsets(
        self, transactional_id: str, producer_id: int, producer_epoch: int, group_id: str
    ) -> None:
        await self.call(
            "txn.add",
            transactional_id,
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            group=group_id,
        )

    async def end(
        self, transactional_id: str, producer_id: int, producer_epoch: int, commit: bool
    ) -> dict[str, Any]:
        """Commit or abort; the answer holds the producer id and epoch for the next
        transaction and whether every marker is written (``completed``)."""
        return await self.call(
            "txn.end",
            transactional_id,
            producer_id=producer_id,
            producer_epoch=producer_epoch,
            commit=commit,
        )

    async def describe(self, transactional_id: str) -> dict[str, Any]:
        """The id's state as :func:`describe` shows it (TRANSACTIONAL_ID_NOT_FOUND if none)."""
        return await self.call("txn.describe", transactional_id)

    async def admin_abort(self, transactional_id: str) -> dict[str, Any]:
        return await self.call("txn.admin_abort", transactional_id)

    async def list_transactions(
        self, states: Iterable[str] | None = None, min_duration_ms: int = 0
    ) -> tuple[list[dict[str, Any]], list[int]]:
        """Every coordinator's transactions (in the given states, open at least
        ``min_duration_ms``), by id; and the ``__transaction_state`` partitions whose
        coordinator could not answer (the list lacks their ids)."""
        n = self._partition_count()
        wanted = None if states is None else sorted(set(states))

        async def one(p: int) -> list[dict[str, Any]] | None:
            try:
                answer = await self.broker.coordinator_call(
                    TXN_STATE_TOPIC,
                    p,
                    "txn.list",
                    {"states": wanted, "min_duration_ms": min_duration_ms},
                )
            except LogbusError:
                return None
            return list(answer["transactions"])

        answers = await asyncio.gather(*(one(p) for p in range(n)))
        listed = sorted(
            (t for a in answers if a is not None for t in a), key=lambda t: t["transactional_id"]
        )
        return listed[:MAX_LISTED], [p for p, a in enumerate(answers) if a is None]

    # -- the coordinator's side ------------------------------------------------------------------

    def _state_of(self, header: dict[str, Any]) -> tuple[int, _Slot, TxnCoordinatorState, str]:
        txn_id = validate_transactional_id(header["transactional_id"])
        p = txn_state_partition(txn_id, self._partition_count())
        slot, state = self._loaded(p, txn_id)
        return p, slot, state, txn_id

    def _loaded(self, p: int, what: str) -> tuple[_Slot, TxnCoordinatorState]:
        slot = self._slots.get(p)
        if slot is not None and slot.state is not None:
            return slot, slot.state
        if slot is not None or self.broker.leader_epoch(TXN_STATE_TOPIC, p) is not None:
            raise LogbusError(
                f"{what!r}: this broker is loading {TXN_STATE_TOPIC}-{p}; try again",
                code=ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
            )
        raise LogbusError(
            f"broker {self.broker.config.broker_id} does not coordinate {what!r}; "
            "its coordinator is moving",
            code=ErrorCode.NOT_COORDINATOR,
        )

    async def _op_init(self, header: dict[str, Any]) -> dict[str, Any]:
        _, slot, _, txn_id = self._state_of(header)
        await self._settle(slot, txn_id)  # the id's last transaction completes first
        p, slot, state, txn_id = self._state_of(header)
        await self._ensure_pids()
        result = state.init_producer_id(
            txn_id, int(header["timeout_ms"]), self.clock.now_ms(), self._take_pid
        )
        await self._persist(p, slot, result)
        if result.markers is not None:  # fenced an open transaction: its abort completes
            self._complete_later(p, slot, result.markers)
        if not result.ok:
            raise result.exception()
        self.broker.note_producer_epoch(result.producer_id, result.producer_epoch)
        return {"producer_id": result.producer_id, "producer_epoch": result.producer_epoch}

    async def _op_add(self, header: dict[str, Any]) -> dict[str, Any]:
        """Add partitions or a group. Adds of one session that arrive while another of its
        adds waits to be written join that write (a produce to each of 4 partitions costs one
        ``__transaction_state`` write, not four in a row, each refused as concurrent); an add
        arriving while the id's previous transaction completes waits for that instead of
        answering ``CONCURRENT_TRANSACTIONS``."""
        _, slot, _, txn_id = self._state_of(header)
        producer = (int(header["producer_id"]), int(header["producer_epoch"]))
        parts = {(str(t), int(n)) for t, n in header.get("partitions", ())}
        groups = {str(header["group"])} if "group" in header else set()
        while (queued := slot.adding.get(txn_id)) is not None:
            if queued.producer == producer and not queued.started:
                queued.partitions |= parts
                queued.groups |= groups
                await queued.done.wait()
                if queued.error is not None:
                    raise queued.error
                return {}
            await queued.done.wait()
            _, slot, _, txn_id = self._state_of(header)
        batch = slot.adding[txn_id] = _Adding(producer, parts, groups)
        try:
            await asyncio.sleep(0)  # adds woken with this one join it
            await self._settle(slot, txn_id)
            batch.started = True
            p, slot, state, txn_id = self._state_of(header)
            await self._add(p, slot, state, txn_id, batch)
        except LogbusError as e:
            batch.error = e
        finally:
            if slot.adding.get(txn_id) is batch:
                del slot.adding[txn_id]
            batch.done.set()
        if batch.error is not None:
            raise batch.error
        return {}

    async def _add(
        self, p: int, slot: _Slot, state: TxnCoordinatorState, txn_id: str, batch: _Adding
    ) -> None:
        """Write ``batch``'s partitions and groups (one record each kind at most)."""
        pid, epoch = batch.producer
        now = self.clock.now_ms()
        result = state.add_partitions(txn_id, pid, epoch, frozenset(batch.partitions), now)
        if result.ok:
            await self._persist(p, slot, result)
            for group in sorted(batch.groups):
                result = state.add_offsets(txn_id, pid, epoch, group, now)
                if not result.ok:
                    break
                await self._persist(p, slot, result)
        if not result.ok:
            batch.error = result.exception()

    async def _settle(self, slot: _Slot, txn_id: str) -> None:
        """Wait (at most :data:`CALL_RETRY_S`) for the id's previous transaction to complete,
        if its markers or COMPLETE record are being written."""
        task = slot.completing.get(txn_id)
        if task is not None and not task.done():
            await asyncio.wait({task}, timeout=CALL_RETRY_S)  # never raises, never cancels it

    async def _op_end(self, header: dict[str, Any]) -> dict[str, Any]:
        p, slot, state, txn_id = self._state_of(header)
        commit = bool(header["commit"])
        await self._ensure_pids()
        result = state.end_txn(
            txn_id,
            int(header["producer_id"]),
            int(header["producer_epoch"]),
            commit,
            self.clock.now_ms(),
            self._take_pid,
        )
        await self._persist(p, slot, result)
        if not result.ok:
            raise result.exception()
        if result.markers is not None:
            self._complete_later(p, slot, result.markers)
        completed = await self._await_completion(slot, txn_id)
        self.broker.note_producer_epoch(result.producer_id, result.producer_epoch)
        return {
            "producer_id": result.producer_id,
            "producer_epoch": result.producer_epoch,
            "completed": completed,
        }

    async def _op_admin_abort(self, header: dict[str, Any]) -> dict[str, Any]:
        p, slot, state, txn_id = self._state_of(header)
        result = state.admin_abort(txn_id, self.clock.now_ms())
        await self._persist(p, slot, result)
        if not result.ok:
            raise result.exception()
        assert result.markers is not None
        self._complete_later(p, slot, result.markers)
        return {
            "producer_id": result.producer_id,
            "producer_epoch": result.producer_epoch,
            "completed": await self._await_completion(slot, txn_id),
        }

    async def _op_describe(self, header: dict[str, Any]) -> dict[str, Any]:
        _, _, state, txn_id = self._state_of(header)
        m = state.transactions.get(txn_id)
        if m is None:
            raise LogbusError(
                f"unknown transactional id {txn_id!r}",
                code=ErrorCode.TRANSACTIONAL_ID_NOT_FOUND,
                transactional_id=txn_id,
            )
        return describe(m, self.clock.now_ms())

    async def _op_group_offsets(self, header: dict[str, Any]) -> dict[str, Any]:
        """On the group's coordinator: write the offsets as the producer's transactional
        records (pending until its marker; :meth:`cluster.coordinator.Coordinator.on_marker`)."""
        assert self.groups is not None
        generation = header.get("generation")
        await self.groups.txn_commit_offsets(
            str(header["group_id"]),
            int(header["producer_id"]),
            int(header["producer_epoch"]),
            {(str(t), int(p)): (int(o), str(m)) for t, p, o, m in header["offsets"]},
            member_id=header.get("member_id"),
            generation=None if generation is None else int(generation),
        )
        return {}

    def _marker_committed(self, topic: str, partition: int, producer_id: int, commit: bool) -> None:
        """A marker is committed on a partition led here: on an offsets partition the group
        coordinator applies (COMMIT) or drops (ABORT) the producer's pending offsets."""
        if topic == OFFSETS_TOPIC and self.groups is not None:
            self.groups.on_marker(partition, producer_id, commit)

    async def _op_list(self, header: dict[str, Any]) -> dict[str, Any]:
        p = int(header["partition"])
        _, state = self._loaded(p, f"{TXN_STATE_TOPIC}-{p}")
        raw = header.get("states")
        states = None if raw is None else [TxnState[s.upper()] for s in raw]
        now = self.clock.now_ms()
        listed = state.list_transactions(now, states, int(header.get("min_duration_ms", 0)))
        return {"transactions": [describe(m, now) for m in listed[:MAX_LISTED]]}

    # -- persist and complete --------------------------------------------------------------------

    async def _persist(self, p: int, slot: _Slot, result: TxnResult) -> None:
        """Append ``result``'s record (if any) with acks=all here, then apply it."""
        if result.record is None:
            return
        state = slot.state
        assert state is not None
        record = result.record
        batch = build_batch([Record(record.value, record.key, timestamp=self.clock.now_ms())])
        try:
            await self.broker.append(
                TXN_STATE_TOPIC, p, batch, Acks.ALL, internal=True, direct=True
            )
        except LogbusError as e:
            if e.code in _NOT_WRITTEN:
                state.abandon(result)
                raise
            self._reload(p, slot, f"a write's outcome is unknown: {e}")
            raise LogbusError(
                f"the coordinator of {result.transactional_id!r} lost its state partition "
                f"mid-write ({e.message}); retry",
                code=ErrorCode.NOT_COORDINATOR,
            ) from e
        except BaseException:
            self._reload(p, slot, "a write was cancelled")
            raise
        if self._slots.get(p) is not slot:
            raise LogbusError(
                f"the coordinator of {result.transactional_id!r} moved; retry",
                code=ErrorCode.NOT_COORDINATOR,
            )
        state.apply(result)

    def _complete_later(self, p: int, slot: _Slot, markers: TxnMarkers) -> None:
        txn_id = markers.transactional_id
        running = slot.completing.get(txn_id)
        if running is not None and not running.done():
            return
        marked = slot.marked[txn_id] = asyncio.Event()
        task = asyncio.create_task(
            self._complete(p, slot, markers, marked), name=f"txn-markers-{txn_id}"
        )
        slot.completing[txn_id] = task

        def done(t: asyncio.Task[bool]) -> None:
            if slot.completing.get(txn_id) is t:
                del slot.completing[txn_id]
            if slot.marked.get(txn_id) is marked:
                del slot.marked[txn_id]
            if not t.cancelled() and t.exception() is not None:
                log.error("transaction %r: completion failed", txn_id, exc_info=t.exception())

        task.add_done_callback(done)

    async def _await_completion(self, slot: _Slot, txn_id: str) -> bool:
        """Wait (at most :data:`END_WAIT_S`) until the transaction's markers are written —
        readers see the outcome then; its COMPLETE record follows — and say whether they are.
        False too when this broker stopped coordinating meanwhile (the unload cancels the
        marker task): the decision is durable and the next coordinator writes the markers, so
        the answer is never the cancelled task's CancelledError (a 500)."""
        task = slot.completing.get(txn_id)
        marked = slot.marked.get(txn_id)
        if task is None or marked is None:
            return True
        waiter = asyncio.ensure_future(marked.wait())
        try:
            await asyncio.wait({task, waiter}, timeout=END_WAIT_S, return_when="FIRST_COMPLETED")
        finally:
            waiter.cancel()
        if marked.is_set():
            return True
        return task.done() and not task.cancelled() and task.exception() is None and task.result()

    async def _complete(
        self, p: int, slot: _Slot, markers: TxnMarkers, marked: asyncio.Event
    ) -> bool:
        """Write every marker of the transaction (then set ``marked``), then its COMPLETE_*
        record; False if this broker stopped coordinating first (the next coordinator finishes
        the job)."""
        if not await self._write_markers(p, slot, markers):
            return False
        marked.set()
        backoff = MARKER_BACKOFF_S[0]
        while self._slots.get(p) is slot and slot.state is not None:
            result = slot.state.complete(markers.transactional_id, self.clock.now_ms())
            if result.error is ErrorCode.CONCURRENT_TRANSACTIONS:
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, MARKER_BACKOFF_S[1])
                continue
            if not result.ok:
                log.warning("transaction %r: %s", markers.transactional_id, result.message)
                return False
            try:
                await self._persist(p, slot, result)
            except LogbusError as e:
                log.warning("transaction %r: complete: %s", markers.transactional_id, e)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, MARKER_BACKOFF_S[1])
                continue
            return True
        return False

    async def _write_markers(self, p: int, slot: _Slot, m: TxnMarkers) -> bool:
        targets = set(m.partitions)
        if m.groups:
            n = self.broker.topic(OFFSETS_TOPIC).partitions
            targets.update((OFFSETS_TOPIC, offsets_partition(g, n)) for g in m.groups)
        backoff = MARKER_BACKOFF_S[0]
        while targets:
            if self._slots.get(p) is not slot:
                return False
            order = sorted(targets)
            outcomes = await asyncio.gather(
                *(
                    self.broker.write_marker(
                        t, n, m.producer_id, m.producer_epoch, m.commit, m.coordinator_epoch
                    )
                    for t, n in order
                ),
                return_exceptions=True,
            )
            for tp, outcome in zip(order, outcomes, strict=True):
                if not isinstance(outcome, BaseException) or (
                    isinstance(outcome, LogbusError) and outcome.code in _MARKER_DONE
                ):
                    targets.discard(tp)
                elif (
                    isinstance(outcome, LogbusError)
                    and outcome.code is ErrorCode.TRANSACTION_COORDINATOR_FENCED
                ):
                    log.warning("transaction %r: fenced by a newer coordinator", m.transactional_id)
                    return False
                elif not isinstance(outcome, Exception):
                    raise outcome
            if targets:
                log.info("transaction %r: %d markers to retry", m.transactional_id, len(targets))
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, MARKER_BACKOFF_S[1])
        return True

    # -- producer ids ----------------------------------------------------------------------------

    async def _ensure_pids(self) -> None:
        if self._pids:
            return
        async with self._pid_lock:
            if not self._pids:
                block = await asyncio.to_thread(self.broker.store.allocate_producer_ids, PID_BLOCK)
                self._pids.extend(reversed(block))

    def _take_pid(self) -> int:
        assert self._pids, "_ensure_pids first"
        return self._pids.pop()

    # -- time ------------------------------------------------------------------------------------

    async def _expiry_loop(self) -> None:
        while not self._closed:
            await asyncio.sleep(self.abort_interval_ms / 1000)
            try:
                await self.expire_now()
            except Exception:  # a storage error: the next round tries again
                log.exception("transaction expiry failed")

    async def expire_now(self) -> int:
        """Abort the timed-out transactions and expire idle ids of every partition loaded
        here; the number of changes started."""
        started = 0
        for p, slot in list(self._slots.items()):
            if slot.state is None:
                continue
            for result in slot.state.expire(self.clock.now_ms()):
                try:
                    await self._persist(p, slot, result)
                except LogbusError as e:
                    log.warning("transaction %r: expiry: %s", result.transactional_id, e)
                    break
                started += 1
                if result.markers is not None:
                    log.info("transaction %r: aborted after its timeout", result.transactional_id)
                    self._complete_later(p, slot, result.markers)
        return started


async def _retrying(attempt: Callable[[], Awaitable[dict[str, Any]]]) -> dict[str, Any]:
    """``attempt()``, again with backoff for up to :data:`CALL_RETRY_S` while it fails with a
    retriable coordinator error (:data:`_RETRIED`)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + CALL_RETRY_S
    backoff = CALL_BACKOFF_S[0]
    while True:
        try:
            return await attempt()
        except LogbusError as e:
            if e.code not in _RETRIED or loop.time() + backoff > deadline:
                raise
        await asyncio.sleep(backoff)
        backoff = min(backoff * 2, CALL_BACKOFF_S[1])


def describe(m: TxnMetadata, now_ms: int) -> dict[str, Any]:
    """A transaction as the admin API shows it."""
    topics: dict[str, list[int]] = {}
    for t, p in sorted(m.partitions):
        topics.setdefault(t, []).append(p)
    return {
        "transactional_id": m.transactional_id,
        "producer_id": m.producer_id,
        "producer_epoch": m.producer_epoch,
        "state": m.state.name.lower(),
        "timeout_ms": m.timeout_ms,
        "start_ms": m.start_ms if m.start_ms >= 0 else None,
        "duration_ms": m.duration_ms(now_ms),
        "partitions": [{"topic": t, "partitions": ps} for t, ps in topics.items()],
        "groups": sorted(m.groups),
    }


def _log_failure(task: asyncio.Future[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("creating %s failed: %s", TXN_STATE_TOPIC, task.exception())
