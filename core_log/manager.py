"""Every partition log under one data directory, for asyncio callers.

Theory of operation
-------------------
* Layout: ``{data_dir}/{topic}-{partition}/`` per partition, ``{data_dir}/.clean_shutdown``
  written by :meth:`LogManager.close` and removed at start (its absence means recovery).
* Event loop discipline: small appends and reads (< 256 KiB) run inline — a page-cache write
  costs microseconds, less than a thread hop — unless the partition lock is busy (a worker may
  hold it across an fsync) or the append would roll a segment; then, like larger ones, every
  fsync, timestamp lookup and compaction, they run in the named pools of
  :mod:`core_log.executors` (fsync, compaction, reads, appends), never asyncio's shared one.
  Appends of compressed producer batches go to the appends pool too, whose validation
  decompresses them (a few hundred bytes may expand to the 16 MiB cap; an 8 KB batch of a
  250 MiB record blocked the loop 1-2 s before the cap and the thread).
* Group commit: :meth:`Partition.sync` starts one fsync if none is running and otherwise waits
  for the running one; when it ends, every append that landed meanwhile is covered by the next
  single fsync. Eight concurrent durable writers therefore share fsyncs instead of queueing.
  A gathered run of durable appends waits as one (:meth:`Partition._when_synced`): its
  requests are answered together when the fsync covering the run ends, each once.
* High watermark: a standalone broker (``auto_high_watermark``) moves it to the log end after
  each append and each fsync, but never past an append that must be fsynced first
  (``durable``, or ``flush.messages`` reached) until an fsync covers it — so an ``acks=1``
  append cannot expose an ``acks=all`` one still being fsynced; it never moves backwards. A
  replicated partition leaves it to the replication layer (:meth:`Partition.set_high_watermark`).
* Long-polls: :meth:`Partition.wait_for` parks a future per waiter, resolved when the high
  watermark moves; no polling, and the number of waiters per partition is bounded. A
  ``read_committed`` waiter waits for the last stable offset, which moves only with the high
  watermark (a marker is stable once the high watermark passes it), so the same wake-ups serve.
* Transactions: :meth:`Partition.append` takes ``transactional=True`` once the broker checked
  the transaction with its coordinator; :meth:`Partition.append_marker` writes COMMIT/ABORT
  markers, queued behind pending appends like any append; :meth:`Partition.read_committed`
  and :attr:`Partition.last_stable_offset` serve ``read_committed`` readers
  (:mod:`core_log.isolation` filters what they get).
* Storage failures (:mod:`core_log.logdir`): a failed fsync, or a write that cannot be undone,
  takes the data directory offline — every partition answers KAFKA_STORAGE_ERROR, pending
  acknowledgements fail, and nothing more is written until a restart recovers the logs; a
  full-disk append that was undone fails alone.
* Background: a flusher honours ``flush.ms``; a janitor applies retention and ``segment.ms``
  rolls and writes checkpoints (every ``retention_check_interval_ms``, 5 min); the cleaner
  compacts the compacted logs that are due (dirtiest first, :mod:`core_log.cleaner`) and looks
  again after ``log.cleaner.backoff.ms`` (15 s), as Kafka's cleaner thread does. Each pass is
  bounded in cost.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import os
import re
import shutil
import threading
import uuid
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from . import executors
from .batch import (
    BatchHeader,
    any_compressed,
    any_compressed_or_producer,
    offsets_spanned,
    records_in,
)
from .checkpoint import fsync_dir
from .cleaner import DEFAULT_MAX_KEYS, CleanResult, cleaning_priority
from .clock import Clock, SystemClock
from .config import LogConfig
from .datadir import DataDirLock
from .errors import (
    InvalidTopicError,
    KafkaStorageError,
    TopicAlreadyExistsError,
    UnknownTopicOrPartitionError,
)
from .executors import StorageExecutors
from .handles import HandleCache
from .isolation import IsolationLevel
from .limits import (
    CREATE_CHUNK_PARTITIONS,
    DEFAULT_MAX_OPEN_SEGMENT_HANDLES,
    MAX_WAITERS_PER_PARTITION,
    OFF_LOOP_IO_BYTES,
)
from .log import AppendResult, CommittedReadResult, PartitionLog, ReadResult, RetentionResult
from .logdir import LogDirectory
from .producer_state import DEFAULT_PRODUCER_ID_EXPIRATION_MS

log = logging.getLogger("logbus.storage")
_Read = TypeVar("_Read", bound=ReadResult)
T = TypeVar("T")

CLEAN_SHUTDOWN_FILE = ".clean_shutdown"
DEFAULT_CLEANER_BACKOFF_MS = 15_000  # Kafka's log.cleaner.backoff.ms
DELETE_SUFFIX = "-delete"
MAX_TOPIC_NAME_CHARS = 249
_TOPIC_NAME = re.compile(r"[a-zA-Z0-9._-]+")
_PARTITION_DIR = re.compile(r"^(?P<topic>[a-zA-Z0-9._-]+)-(?P<partition>\d+)$")


@contextlib.contextmanager
def _collector_paused() -> Iterator[None]:
    """No cyclic garbage collection while many partitions are made, and what exists then is
    frozen out of later collections (``gc.freeze``): the broker's partitions live as long as
    the process. Full collections walked the growing heap again and again, holding the GIL:
    creating 10,000 partitions took 7.7 s with event-loop stalls of 0.2-0.5 s, and 2.3 s with
    none without them. Objects are still freed by reference counting."""
    if not gc.isenabled():  # paused already (nested, or by the caller)
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.freeze()


def _erase(directories: list[Path]) -> None:
    for directory in directories:
        shutil.rmtree(directory, ignore_errors=True)


def validate_topic_name(name: str) -> None:
    """Kafka's rules: ``[a-zA-Z0-9._-]``, 1..249 characters, not ``.`` or ``..``."""
    if not name or len(name) > MAX_TOPIC_NAME_CHARS:
        raise InvalidTopicError(f"topic name must be 1..{MAX_TOPIC_NAME_CHARS} characters")
    if name in (".", ".."):
        raise InvalidTopicError(f"topic name cannot be {name!r}")
    if not _TOPIC_NAME.fullmatch(name):
        raise InvalidTopicError(
            f"topic name {name!r} may contain only ASCII letters, digits, '.', '_' and '-'"
        )


@dataclass(slots=True)
class _PendingAppend:
    data: bytes | memoryview
    leader_epoch: int
    as_follower: bool
    durable: bool
    small: bool  # may run inline
    transactional: bool = False
    # (producer id, producer epoch, commit, coordinator epoch) of a marker; ``data`` is unused
    marker: tuple[int, int, bool, int] | None = None
    future: asyncio.Future[AppendResult] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )

    def try_on(self, log: PartitionLog) -> AppendResult | None:
        if self.marker is not None:
            return log.try_append_marker(
                *self.marker, leader_epoch=self.leader_epoch, durable=self.durable
            )
        return log.try_append(
            self.data,
            leader_epoch=self.leader_epoch,
            as_follower=self.as_follower,
            durable=self.durable,
            transactional=self.transactional,
        )

    def run_on(self, log: PartitionLog) -> AppendResult:
        if self.marker is not None:
            return log.append_marker(
                *self.marker, leader_epoch=self.leader_epoch, durable=self.durable
            )
        return log.append(
            self.data,
            leader_epoch=self.leader_epoch,
            as_follower=self.as_follower,
            durable=self.durable,
            transactional=self.transactional,
        )


@dataclass(slots=True)
class _Gathered:
    """One request's checked batches waiting to be appended with others (see
    :meth:`Partition.append`)."""

    view: memoryview
    headers: list[BatchHeader]
    leader_epoch: int
    durable: bool
    # Resolved with the request's AppendResult, or with ``answer(its first offset)``.
    future: asyncio.Future[Any]
    answer: Callable[[int], Any] | None = None


async def answered_by(append: Awaitable[AppendResult], answer: Callable[[int], T]) -> T:
    """``answer`` of the first offset of ``append`` (:meth:`Partition.append_built` where the
    append cannot be gathered)."""
    return answer((await append).base_offset)


def _answer_run(run: list[_Gathered], outcome: AppendResult | BaseException) -> None:
    """Each request of an append run its own offsets, or the run's error."""
    if isinstance(outcome, BaseException):
        for g in run:
            if g.future.done():
                continue
            if isinstance(outcome, asyncio.CancelledError):
                g.future.cancel()
            else:
                g.future.set_exception(outcome)
        return
    offset = outcome.base_offset
    for g in run:
        headers = g.headers
        if len(headers) == 1:  # one batch a request (most): no generators
            [h] = headers
            span = h.last_offset_delta + 1
            records = h.record_count
        else:
            span = offsets_spanned(headers)
            records = records_in(headers)
        if g.future.done():  # its caller went away; its records are written all the same
            pass
        elif g.answer is not None:  # a built append: its caller's answer, no AppendResult
            try:
                g.future.set_result(g.answer(offset))
            except Exception as e:  # the rest of the run is still answered
                g.future.set_exception(e)
        else:
            g.future.set_result(
                AppendResult(
                    base_offset=offset,
                    last_offset=offset + span - 1,
                    batches=len(headers),
                    records=records,
                    size_bytes=len(g.view),
                    log_append_time_ms=outcome.log_append_time_ms,
                    sync_required=outcome.sync_required,
                )
            )
        offset += span


class Partition:
    """Async facade over one :class:`PartitionLog`. Methods run on the event loop.

    Appends, reads and waits raise KAFKA_STORAGE_ERROR once the partition's log directory is
    offline (:mod:`core_log.logdir`); a storage error in one of them takes it offline.
    """

    def __init__(
        self,
        topic: str,
        partition: int,
        log: PartitionLog,
        auto_hw: bool,
        pools: StorageExecutors,
        log_dir: LogDirectory | None = None,
    ) -> None:
        self.topic = topic
        self.partition = partition
        self.log = log
        self.auto_high_watermark = auto_hw
        self.log_dir = log_dir or LogDirectory(log.directory.parent)
        self.pools = pools
        # Appends that could not run inline wait here, in arrival order, for one drain task;
        # while any waits, later appends queue too, so none overtakes an earlier one.
        self._pending: deque[_PendingAppend] = deque()
        self._drainer: asyncio.Task[None] | None = None
        # Producer batches that arrived in this turn of the event loop, appended together at
        # its end (one lock, one write, one index update for them all).
        self._gathered: list[_Gathered] = []
        self._waiters: set[asyncio.Future[None]] = set()
        # Group commit: the fsync in flight, and what waits for one to cover an offset.
        self._fsync: asyncio.Future[int] | None = None
        self._after_fsync: list[tuple[int, Callable[[BaseException | None], None]]] = []
        self.last_flush_ms = log.clock.monotonic_ms()
        self.checkpointed: tuple[int, int, int] = (-1, -1, -1)
        self.released = False

    @property
    def high_watermark(self) -> int:
        return self.log.high_watermark

    @property
    def log_end_offset(self) -> int:
        return self.log.log_end_offset

    @property
    def log_start_offset(self) -> int:
        return self.log.log_start_offset

    @property
    def last_stable_offset(self) -> int:
        """The LSO (:attr:`PartitionLog.last_stable_offset`): ``read_committed`` readers stop
        there."""
        return self.log.last_stable_offset

    async def append(
        self,
        data: bytes | memoryview,
        *,
        leader_epoch: int = 0,
        as_follower: bool = False,
        durable: bool = False,
        inline_max_bytes: int = OFF_LOOP_IO_BYTES - 1,
        transactional: bool = False,
        checked: list[BatchHeader] | None = None,
    ) -> AppendResult:
        """Append whole batches; with ``durable`` (or when ``flush.messages`` is reached) wait
        for an fsync covering them. Advances the high watermark in standalone mode, never past
        an append that must be fsynced first (:attr:`PartitionLog.committable_offset`).

        ``inline_max_bytes``: appends up to this size run on the event loop when the log's lock
        is free and nothing would block (:meth:`PartitionLog.try_append`); larger ones in the
        appends pool. A caller raises it where a thread hop costs more than the write (a
        follower's replication append: see cluster.replica_manager).

        ``transactional``: accept transactional data batches (:meth:`PartitionLog.append`);
        the caller has checked the transaction with its coordinator.

        ``checked``: the headers of batches the caller built itself and knows pass the
        producer checks (:func:`core_log.batch.built_headers`): they are not walked again."""
        self.log_dir.check()
        if not as_follower and not transactional and len(data) <= inline_max_bytes:
            if checked is not None:
                return await self._gather(data, leader_epoch, durable, inline_max_bytes, checked)
            # Compressed: its check decompresses (off the loop). A producer id: its own
            # append (a duplicate answers for its whole request). Read from the headers, so
            # neither is checked twice.
            if not any_compressed_or_producer(data):
                return await self._gather(data, leader_epoch, durable, inline_max_bytes)
        try:
            result = await self._append_alone(
                data, leader_epoch, as_follower, durable, inline_max_bytes, transactional
            )
        except (KafkaStorageError, OSError) as e:
            raise self._storage_failure(e) from e
        return await self._after_append(result)

    async def _append_alone(
        self,
        data: bytes | memoryview,
        leader_epoch: int,
        as_follower: bool,
        durable: bool,
        inline_max_bytes: int,
        transactional: bool,
    ) -> AppendResult:
        """An append of its own: inline when it is small and nothing waits, else queued."""
        small = len(data) <= inline_max_bytes and (as_follower or not any_compressed(data))
        if small and not self._pending:
            result = self.log.try_append(
                data,
                leader_epoch=leader_epoch,
                as_follower=as_follower,
                durable=durable,
                transactional=transactional,
            )
            if result is not None:
                return result
        return await self._queued(
            _PendingAppend(data, leader_epoch, as_follower, durable, small, transactional)
        )

    async def _gather(
        self,
        data: bytes | memoryview,
        leader_epoch: int,
        durable: bool,
        max_bytes: int,
        checked: list[BatchHeader] | None = None,
    ) -> AppendResult:
        """Append a producer's small batches together with the others that arrive in the same
        turn of the event loop, and return this request's own offsets.

        Under many concurrent small produces to one partition (64 connections of one record
        each), every append took the log's lock, checked the segment, wrote, updated the
        indexes and the high watermark on its own — ≈ 40 µs a request. Appended together
        they share all of that and one ``pwritev``, and their fsync (``acks=all``) as before.
        Each request's batches are checked first, so a bad one fails alone. Batches with a
        producer id (idempotent, transactional) keep their own append: a duplicate answers
        for its whole request.

        The request's future is answered once for the whole append: after the write, or —
        ``durable`` — after the fsync that covers the run (:meth:`_when_synced`) and the high
        watermark moved past it. Before, each ``acks=all`` request woke up after the write,
        then waited for the fsync on its own (``sync``: a shield, a callback, a second resume
        of the whole request's coroutine chain): 447 k against 389 k instructions a request
        for ``acks=1`` (``benchmarks.request_cost --callgrind``)."""
        if checked is None:
            view, headers = self.log.split(data)
        else:
            view, headers = memoryview(data), checked
        future: asyncio.Future[AppendResult] | None = self._joined(
            view, headers, leader_epoch, durable, max_bytes, None
        )
        if future is None:
            return await self._append_pending(
                _PendingAppend(view, leader_epoch, False, durable, True)
            )
        return await future

    def append_built(
        self,
        data: bytes,
        checked: list[BatchHeader],
        answer: Callable[[int], T],
        *,
        leader_epoch: int = 0,
        durable: bool = False,
    ) -> Awaitable[T]:
        """:meth:`append` of batches the broker built with their ``checked`` headers (neither
        follower nor transactional), answered by ``answer(first offset)`` once :meth:`append`
        would have returned, as something to await: where the batches can be gathered (most
        one-record produces) the gathered append's future, resolved with the answer by the run
        that writes them — no coroutine of :meth:`append` and :meth:`_gather`, no
        :class:`AppendResult`, nor the caller's own coroutine to turn it into its answer in
        the request's chain — else :meth:`append`'s coroutine (:func:`answered_by`). The same
        checks, order and outcome as :meth:`append`; ``answer`` must not raise (if it does,
        that is what the await raises). KAFKA_STORAGE_ERROR is raised here when the log
        directory is offline."""
        self.log_dir.check()
        if len(data) < OFF_LOOP_IO_BYTES:
            view = memoryview(data)
            future = self._joined(
                view, checked, leader_epoch, durable, OFF_LOOP_IO_BYTES - 1, answer
            )
            if future is not None:
                return future
        append = self.append(data, leader_epoch=leader_epoch, durable=durable, checked=checked)
        return answered_by(append, answer)

    def _joined(
        self,
        view: memoryview,
        headers: list[BatchHeader],
        leader_epoch: int,
        durable: bool,
        max_bytes: int,
        answer: Callable[[int], Any] | None,
    ) -> asyncio.Future[Any] | None:
        """The future of checked batches gathered into this turn's append (:meth:`_gather`),
        or None where they cannot be (:meth:`PartitionLog.gatherable`)."""
        if not self.log.gatherable(headers):
            return None
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        if not self._gathered:
            loop.call_soon(self._write_gathered, max_bytes)
        self._gathered.append(_Gathered(view, headers, leader_epoch, durable, future, answer))
        return future

    def _write_gathered(self, max_bytes: int) -> None:
        """Append what :meth:`_gather` collected: consecutive requests of the same leader epoch
        and durability, up to ``max_bytes`` at a time, each run as one append."""
        gathered, self._gathered = self._gathered, []
        run: list[_Gathered] = []
        size = epoch = 0
        durable = False
        for g in gathered:  # once for every request of a turn: no tuples, no second pass
            if g.future.done():  # its caller went away: never appended
                continue
            n = len(g.view)
            if run and (g.leader_epoch != epoch or g.durable != durable or size + n > max_bytes):
                self._append_run(run)
                run, size = [], 0
            if not run:
                epoch, durable = g.leader_epoch, g.durable
            run.append(g)
            size += n
        if run:
            self._append_run(run)

    def _append_run(self, run: list[_Gathered]) -> None:
        first = run[0]
        if len(run) == 1:
            view, headers = first.view, first.headers
        else:
            view = memoryview(b"".join([g.view for g in run]))
            headers = [h for g in run for h in g.headers]
        try:
            result = None
            if not self._pending:
                result = self.log.try_append_split(
                    view, headers, leader_epoch=first.leader_epoch, durable=first.durable
                )
        except Exception as e:  # every request of the run gets the error
            _answer_run(run, self._run_failure(e))
            return
        if result is not None:
            self._run_written(run, result)
            return
        # It must wait (the lock, a roll, an fsync): queued as one append, in order.
        pending = _PendingAppend(view, first.leader_epoch, False, first.durable, True)
        self._pending.append(pending)
        if self._drainer is None or self._drainer.done():
            self._drainer = asyncio.create_task(
                self._drain(), name=f"append {self.topic}-{self.partition}"
            )
        pending.future.add_done_callback(lambda done: self._queued_run_done(run, done))

    def _queued_run_done(self, run: list[_Gathered], done: asyncio.Future[AppendResult]) -> None:
        if done.cancelled():
            _answer_run(run, asyncio.CancelledError())
        elif (error := done.exception()) is not None:
            _answer_run(run, self._run_failure(error))
        else:
            self._run_written(run, done.result())

    def _run_written(self, run: list[_Gathered], result: AppendResult) -> None:
        """A run is in the log: its requests are answered now, or once an fsync covers it."""
        self._advance_high_watermark()  # long-polls wake now, not once each caller resumes
        if not result.sync_required:
            _answer_run(run, result)
            return

        def answer(error: BaseException | None) -> None:
            _answer_run(run, result if error is None else error)

        self._when_synced(result.last_offset + 1, answer)

    def _run_failure(self, error: BaseException) -> BaseException:
        """What the requests of a run raise for ``error`` (:meth:`_storage_failure`, once for
        the run: one failed write is one storage error)."""
        failure = self._storage_failure(error)
        if failure is not error:
            failure.__cause__ = error
        return failure

    async def append_marker(
        self,
        producer_id: int,
        producer_epoch: int,
        commit: bool,
        coordinator_epoch: int,
        *,
        leader_epoch: int = 0,
        durable: bool = False,
    ) -> AppendResult:
        """Append a COMMIT or ABORT marker (:meth:`PartitionLog.append_marker`), in order
        behind any append still queued; advances the high watermark like :meth:`append`."""
        self.log_dir.check()
        marker = (producer_id, producer_epoch, commit, coordinator_epoch)
        pending = _PendingAppend(b"", leader_epoch, False, durable, True, marker=marker)
        return await self._append_pending(pending)

    async def _append_pending(self, pending: _PendingAppend) -> AppendResult:
        try:
            result = None
            if pending.small and not self._pending:
                result = pending.try_on(self.log)
            if result is None:
                result = await self._queued(pending)
        except (KafkaStorageError, OSError) as e:
            raise self._storage_failure(e) from e
        return await self._after_append(result)

    async def _after_append(self, result: AppendResult) -> AppendResult:
        if result.sync_required:
            await self.sync(result.last_offset + 1)
        if self.log.high_watermark <= result.last_offset:  # else an append beside it did
            self._advance_high_watermark()
        return result

    async def _queued(self, pending: _PendingAppend) -> AppendResult:
        """A large append, one that rolls a segment or found the lock busy, or one behind
        those: queued for the drain task."""
        self._pending.append(pending)
        if self._drainer is None or self._drainer.done():
            self._drainer = asyncio.create_task(
                self._drain(), name=f"append {self.topic}-{self.partition}"
            )
        return await pending.future

    async def _drain(self) -> None:
        """Run the queued appends in order: a small one inline when it can (the one that had
        to wait for a worker, a roll or an fsync, does not send the appends queued behind it
        through a thread one by one), the others in the appends pool. It ends when the queue
        is empty, so new appends run inline again at once: before, each queued append took
        the lock in turn and, under steady load, later ones kept queueing behind them (half
        of all small produces at 64 connections paid a suspension, or a thread hop)."""
        pending = self._pending
        try:
            while pending:
                item = pending[0]
                if item.future.done():  # its caller went away first: never appended
                    pending.popleft()
                    continue
                try:
                    result = None
                    if item.small:
                        result = item.try_on(self.log)
                    if result is None:
                        result = await executors.run(self.pools.appends, item.run_on, self.log)
                except Exception as e:  # this append's failure, its caller's to raise
                    pending.popleft()
                    if not item.future.done():
                        item.future.set_exception(e)
                    continue
                pending.popleft()
                if not item.future.done():
                    item.future.set_result(result)
        finally:  # cancelled (the broker closing): nobody waits forever
            while pending:
                item = pending.popleft()
                item.future.cancel()

    def _advance_high_watermark(self) -> None:
        """Standalone mode: the high watermark follows what the log may commit."""
        if self.auto_high_watermark:
            self.set_high_watermark(self.log.committable_offset)

    async def sync(self, offset: int) -> None:
        """Return once everything below ``offset`` is fsynced (group commit).

        Raises KAFKA_STORAGE_ERROR, for every waiter, if the fsync fails or the log directory
        goes offline meanwhile (another partition's fsync failed): an fsync that succeeds after
        a failed one proves nothing, so no pending acknowledgement is given.
        """
        if self.log.recovery_point < offset:
            self.log_dir.check()
            synced: asyncio.Future[None] = asyncio.get_running_loop().create_future()

            def settle(error: BaseException | None) -> None:
                if synced.done():
                    return
                if error is None:
                    synced.set_result(None)
                elif isinstance(error, asyncio.CancelledError):
                    synced.cancel()
                else:
                    synced.set_exception(error)

            self._when_synced(offset, settle)
            await synced
        self.log_dir.check()

    def _when_synced(self, offset: int, then: Callable[[BaseException | None], None]) -> None:
        """Call ``then(None)`` once an fsync covers everything below ``offset`` and the high
        watermark moved after it; ``then(error)`` if an fsync fails first or the log directory
        is offline when it ends (the error :meth:`sync` raises). Group commit: an fsync starts
        now if none is in flight — at once, in the fsync pool, not on a later turn of the event
        loop — and whatever waits when it ends, not covered by it, shares the next one."""
        self._after_fsync.append((offset, then))
        if self._fsync is None:
            self._start_fsync()

    def _start_fsync(self) -> None:
        self.last_flush_ms = self.log.clock.monotonic_ms()
        try:
            fsync = executors.submit(self.pools.fsync, self.log.flush)
        except KafkaStorageError as e:  # the broker is closing: no fsync will come
            self._fsync_ended(None, self._storage_failure(e))
            return
        self._fsync = fsync
        fsync.add_done_callback(self._fsync_done)

    def _fsync_done(self, fsync: asyncio.Future[int]) -> None:
        if fsync.cancelled():
            self._fsync_ended(fsync, asyncio.CancelledError())
        elif (error := fsync.exception()) is not None:
            self._fsync_ended(fsync, self._run_failure(error))
        else:
            self._advance_high_watermark()  # appends waiting for this fsync become visible
            self._fsync_ended(fsync, None)

    def _fsync_ended(self, fsync: asyncio.Future[int] | None, error: BaseException | None) -> None:
        """Answer what the ended fsync covered (all of it, with ``error``, if it failed or the
        directory is offline); start the next one for the rest."""
        if self._fsync is fsync:
            self._fsync = None
        if error is None and self.log_dir.offline:
            error = self.log_dir.offline_error()
        waiting, self._after_fsync = self._after_fsync, []
        covered = self.log.recovery_point
        for offset, then in waiting:
            if error is not None or offset <= covered:
                then(error)
            else:
                self._after_fsync.append((offset, then))
        if self._after_fsync and self._fsync is None:
            self._start_fsync()

    def _storage_failure(self, error: BaseException) -> BaseException:
        """What to raise for ``error`` from the log: a closed (deleted) log's errors pass
        through; a storage error takes the log directory offline."""
        if self.log.closed:
            return error
        return self.log_dir.failed(error)

    async def read(
        self,
        offset: int,
        max_bytes: int,
        *,
        max_offset: int | None = None,
        max_records: int | None = None,
        inline_max_bytes: int = OFF_LOOP_IO_BYTES - 1,
    ) -> ReadResult:
        """:meth:`PartitionLog.read`: reads of at most ``inline_max_bytes`` run inline unless
        the lock is busy; larger ones in the reads pool. A caller raises the bound for reads it
        knows to be in the page cache (a follower fetching what was appended since its
        previous fetch)."""
        return await self._read_with(
            self.log.try_read, self.log.read, offset, max_bytes, max_offset, max_records,
            inline_max_bytes,
        )  # fmt: skip

    async def read_committed(
        self,
        offset: int,
        max_bytes: int,
        *,
        max_offset: int | None = None,
        max_records: int | None = None,
        inline_max_bytes: int = OFF_LOOP_IO_BYTES - 1,
    ) -> CommittedReadResult:
        """:meth:`read` at ``read_committed`` (:meth:`PartitionLog.read_committed`): never at
        or past the last stable offset, with the aborted transactions of the data."""
        return await self._read_with(
            self.log.try_read_committed, self.log.read_committed, offset, max_bytes,
            max_offset, max_records, inline_max_bytes,
        )  # fmt: skip

    async def _read_with(
        self,
        try_read: Callable[..., _Read | None],
        read: Callable[..., _Read],
        offset: int,
        max_bytes: int,
        max_offset: int | None,
        max_records: int | None,
        inline_max_bytes: int,
    ) -> _Read:
        """A read by ``try_read`` inline when it is small and the lock is free, else by
        ``read`` in the reads pool (the log's plain or ``read_committed`` pair)."""
        self.log_dir.check()
        try:
            if max_bytes <= inline_max_bytes:
                result = try_read(offset, max_bytes, max_offset=max_offset, max_records=max_records)
                if result is not None:
                    return result
            return await executors.run(
                self.pools.reads,
                read,
                offset,
                max_bytes,
                max_offset=max_offset,
                max_records=max_records,
            )
        except (KafkaStorageError, OSError) as e:
            raise self._storage_failure(e) from e

    async def offset_for_timestamp(self, timestamp: int) -> int | None:
        """The first offset whose timestamp is >= ``timestamp`` (None if none): it reads and
        decodes batches, so it runs in the reads pool."""
        self.log_dir.check()
        try:
            return await executors.run(self.pools.reads, self.log.offset_for_timestamp, timestamp)
        except (KafkaStorageError, OSError) as e:
            raise self._storage_failure(e) from e

    def set_high_watermark(self, offset: int) -> None:
        before = self.log.high_watermark
        if self.log.set_high_watermark(offset) > before:
            self._wake()

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, set()
        for w in waiters:
            if not w.done():
                w.set_result(None)

    async def wait_for(
        self, offset: int, timeout_s: float, *, isolation: IsolationLevel = "read_uncommitted"
    ) -> bool:
        """Wait until the high watermark (the last stable offset at ``read_committed``)
        passes ``offset``; False on timeout.

        Returns at once (True if data is there) when the waiter bound is reached, and False
        once the partition is released (deleted, or the broker is shutting down). Raises
        KAFKA_STORAGE_ERROR if the log directory is (or goes) offline.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        committed = isolation == "read_committed"

        def bound() -> int:
            return self.log.last_stable_offset if committed else self.log.high_watermark

        while bound() <= offset:
            self.log_dir.check()
            if self.released:
                return False
            remaining = deadline - loop.time()
            if remaining <= 0 or len(self._waiters) >= MAX_WAITERS_PER_PARTITION:
                return False
            waiter: asyncio.Future[None] = loop.create_future()
            self._waiters.add(waiter)
            try:
                async with asyncio.timeout(remaining):
                    await waiter
            except TimeoutError:
                return bound() > offset
            finally:
                self._waiters.discard(waiter)
        return True

    @property
    def waiter_count(self) -> int:
        return len(self._waiters)

    def release_waiters(self) -> None:
        """Answer every waiter now and every later one at once (deleted, or shutting down)."""
        self.released = True
        self._wake()

    def wake_waiters(self) -> None:
        """Make every waiter look again (its log directory went offline)."""
        self._wake()


class LogManager:
    def __init__(
        self,
        data_dir: Path | str,
        *,
        clock: Clock | None = None,
        config_for: Callable[[str], LogConfig] | None = None,
        max_open_handles: int = DEFAULT_MAX_OPEN_SEGMENT_HANDLES,
        auto_high_watermark: bool = True,
        flush_check_interval_ms: int = 50,
        retention_check_interval_ms: int = 300_000,
        checkpoint_interval_ms: int = 60_000,
        producer_id_expiration_ms: int = DEFAULT_PRODUCER_ID_EXPIRATION_MS,
        cleaner_max_keys: int = DEFAULT_MAX_KEYS,
        cleaner_io_bytes_per_s: float | None = None,
        dir_lock: DataDirLock | None = None,
        cleaner_backoff_ms: int = DEFAULT_CLEANER_BACKOFF_MS,
    ) -> None:
        """``dir_lock``: the data directory's lock when the caller took it already (the
        server takes it before the metadata store opens); otherwise :meth:`start` takes one and
        :meth:`close` releases it."""
        self.data_dir = Path(data_dir)
        self.dir_lock = dir_lock or DataDirLock(self.data_dir)
        self._owns_lock = dir_lock is None
        self.log_dir = LogDirectory(self.data_dir)
        self.log_dir.on_offline.append(self._wake_all)
        self.clock = clock or SystemClock()
        self._config_for = config_for or (lambda _topic: LogConfig())
        self.handles = HandleCache(max_open_handles)
        self.auto_high_watermark = auto_high_watermark
        self.flush_check_interval_ms = flush_check_interval_ms
        self.retention_check_interval_ms = retention_check_interval_ms
        self.checkpoint_interval_ms = checkpoint_interval_ms
        self.producer_id_expiration_ms = producer_id_expiration_ms
        self.cleaner_max_keys = cleaner_max_keys
        self.cleaner_io_bytes_per_s = cleaner_io_bytes_per_s
        self.cleaner_backoff_ms = cleaner_backoff_ms
        self.pools = StorageExecutors()
        self._partitions: dict[tuple[str, int], Partition] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self.started = False
        self.was_clean_shutdown = False

    # -- lifecycle -------------------------------------------------------------------------------

    def lock_data_dir(self) -> None:
        """Take the data directory's exclusive lock (:mod:`core_log.datadir`) unless held;
        raises :class:`~core_log.datadir.DataDirInUseError` at once if another process has it."""
        self.dir_lock.acquire()

    def unlock_data_dir(self) -> None:
        """Release the lock if this manager took it (a lock handed in stays with its owner)."""
        if self._owns_lock:
            self.dir_lock.release()

    async def start(self, *, background: bool = True) -> None:
        """Lock the data directory, open (and, after a crash, recover) every partition, then
        start background tasks."""
        self.lock_data_dir()
        marker = self.data_dir / CLEAN_SHUTDOWN_FILE
        self.was_clean_shutdown = marker.exists()
        if self.pools.closed:  # started again after close()
            self.pools = StorageExecutors()
        with _collector_paused():  # a broker of 10,000 partitions opens ~1M objects
            await executors.run(self.pools.fsync, self._open_all, self.was_clean_shutdown)
        if self.was_clean_shutdown:
            marker.unlink()
            fsync_dir(self.data_dir)
        self.started = True
        if background:
            self._tasks = [
                asyncio.create_task(self._flusher(), name="logbus-flusher"),
                asyncio.create_task(self._janitor(), name="logbus-janitor"),
                asyncio.create_task(self._cleaner(), name="logbus-cleaner"),
            ]

    def _open_all(self, clean: bool) -> None:
        for entry in sorted(self.data_dir.iterdir()):
            if not entry.is_dir():
                continue
            if entry.name.endswith(DELETE_SUFFIX):
                shutil.rmtree(entry, ignore_errors=True)
                continue
            m = _PARTITION_DIR.match(entry.name)
            if m is None:
                continue
            topic, partition = m["topic"], int(m["partition"])
            log = PartitionLog(
                entry, self._config_for(topic), self.clock, self.handles, clean_shutdown=clean
            )
            self._partitions[(topic, partition)] = Partition(
                topic, partition, log, self.auto_high_watermark, self.pools, self.log_dir
            )
            if self.auto_high_watermark:
                log.set_high_watermark(log.log_end_offset)

    async def close(self) -> None:
        """Stop background work, flush and close every log, and mark the shutdown clean."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        self.release_waiters()
        try:
            await executors.run(self.pools.fsync, self._close_all)
        finally:
            self.pools.shutdown()
            self.started = False
            self.unlock_data_dir()

    def _close_all(self) -> None:
        if self.log_dir.offline:
            # Nothing more reaches a failed directory: no flush (a "successful" fsync after a
            # failed one proves nothing), no checkpoint, no clean-shutdown marker, so the next
            # start recovers every log from its last checkpoint.
            for p in self._partitions.values():
                p.log.abandon()
            return
        for p in self._partitions.values():
            p.log.close()
        (self.data_dir / CLEAN_SHUTDOWN_FILE).write_bytes(b"")
        fsync_dir(self.data_dir)

    @property
    def offline(self) -> bool:
        """Whether the data directory is offline after a storage error (see core_log.logdir)."""
        return self.log_dir.offline

    def _wake_all(self) -> None:
        for p in self._partitions.values():
            p.wake_waiters()

    # -- partitions ------------------------------------------------------------------------------

    def get(self, topic: str, partition: int) -> Partition:
        try:
            return self._partitions[(topic, partition)]
        except KeyError:
            raise UnknownTopicOrPartitionError(
                f"unknown partition {topic}-{partition}", topic=topic, partition=partition
            ) from None

    def partitions(self) -> list[Partition]:
        return list(self._partitions.values())

    def topics(self) -> dict[str, list[int]]:
        out: dict[str, list[int]] = {}
        for topic, partition in sorted(self._partitions):
            out.setdefault(topic, []).append(partition)
        return out

    async def create(
        self, topic: str, partition: int, config: LogConfig | None = None
    ) -> Partition:
        validate_topic_name(topic)
        self.log_dir.check()
        if partition < 0:
            raise UnknownTopicOrPartitionError(f"invalid partition {partition}")
        key = (topic, partition)
        if key in self._partitions:
            raise TopicAlreadyExistsError(f"partition {topic}-{partition} exists")
        directory = self.data_dir / f"{topic}-{partition}"
        log = await executors.run(
            self.pools.fsync,
            PartitionLog,
            directory,
            config or self._config_for(topic),
            self.clock,
            self.handles,
        )
        await executors.run(self.pools.fsync, log.write_checkpoint)
        p = self._partitions[key] = Partition(
            topic, partition, log, self.auto_high_watermark, self.pools, self.log_dir
        )
        return p

    async def create_many(
        self, topic: str, partitions: list[int], config: LogConfig | None = None
    ) -> None:
        """Create new empty logs for ``partitions`` of ``topic``: all of them or none.

        The logs are made in worker threads, ``CREATE_CHUNK_PARTITIONS`` per hop, without an
        fsync each (:meth:`PartitionLog._start_empty`); one fsync of the data directory at the
        end. 10,000 partitions take 2-5 s on a loaded 2-vCPU machine (``benchmarks/admin.py``).
        On any error the logs made so far are deleted again and the error is raised.
        """
        validate_topic_name(topic)
        for p in partitions:
            if p < 0:
                raise UnknownTopicOrPartitionError(f"invalid partition {p}")
            if (topic, p) in self._partitions:
                raise TopicAlreadyExistsError(f"partition {topic}-{p} exists")
        config = config or self._config_for(topic)
        made: list[Partition] = []
        try:
            with _collector_paused():
                made += await self._create_chunks(topic, partitions, config)
            await executors.run(self.pools.fsync, fsync_dir, self.data_dir)
        except BaseException:
            await executors.run(self.pools.fsync, self._delete_all, [p.log for p in made])
            raise
        for facade in made:
            self._partitions[(topic, facade.partition)] = facade

    async def _create_chunks(
        self, topic: str, partitions: list[int], config: LogConfig
    ) -> list[Partition]:
        made: list[Partition] = []
        try:
            for i in range(0, len(partitions), CREATE_CHUNK_PARTITIONS):
                chunk = partitions[i : i + CREATE_CHUNK_PARTITIONS]
                made += await executors.run(
                    self.pools.fsync, self._create_logs, topic, chunk, config
                )
        except BaseException:
            await executors.run(self.pools.fsync, self._delete_all, [p.log for p in made])
            raise
        return made

    def _create_logs(self, topic: str, partitions: list[int], config: LogConfig) -> list[Partition]:
        """New empty logs and their facades (built here, off the event loop: 10,000 facades
        held it for ~0.5 s)."""
        made: list[Partition] = []
        try:
            for p in partitions:
                directory = self.data_dir / f"{topic}-{p}"
                log = PartitionLog(directory, config, self.clock, self.handles, fresh=True)
                made.append(
                    Partition(topic, p, log, self.auto_high_watermark, self.pools, self.log_dir)
                )
        except OSError as e:
            self._delete_all([p.log for p in made])
            raise KafkaStorageError(f"creating the logs of {topic} failed: {e}") from e
        except BaseException:
            self._delete_all([p.log for p in made])
            raise
        return made

    async def delete_many(self, topic: str, partitions: list[int]) -> None:
        """:meth:`delete` for many partitions of a topic, with one fsync of the data directory
        per ``CREATE_CHUNK_PARTITIONS`` (a 10,000-partition topic took minutes to delete with
        one fsync each)."""
        gone = [self.get(topic, p) for p in partitions]
        for p in gone:
            del self._partitions[(topic, p.partition)]
            p.release_waiters()
        for i in range(0, len(gone), CREATE_CHUNK_PARTITIONS):
            chunk = [p.log for p in gone[i : i + CREATE_CHUNK_PARTITIONS]]
            await executors.run(self.pools.fsync, self._delete_all, chunk)

    def _delete_all(self, logs: list[PartitionLog]) -> None:
        """:meth:`_delete_files` for many logs, with one fsync of the data directory; the
        renamed directories are erased by a background thread (an rmdir costs ~3 ms here, 30 s
        for 10,000 partitions). A crash first leaves ``*-delete`` directories, which the next
        start erases."""
        targets = []
        for log in logs:
            log.close()
            targets.append(log.directory.with_name(f"{uuid.uuid4().hex}{DELETE_SUFFIX}"))
            os.replace(log.directory, targets[-1])
        fsync_dir(self.data_dir)
        threading.Thread(target=_erase, args=(targets,), name="logbus-erase", daemon=True).start()

    async def delete(self, topic: str, partition: int) -> None:
        """Remove a partition: renamed at once (so a crash cannot resurrect it), then erased."""
        p = self.get(topic, partition)
        del self._partitions[(topic, partition)]
        p.release_waiters()
        await executors.run(self.pools.fsync, self._delete_files, p.log)

    def _delete_files(self, log: PartitionLog) -> None:
        if self.log_dir.offline:
            log.abandon()
        else:
            log.close()
        # Not named after the topic: a 249-character topic name plus a suffix would pass the
        # 255-byte limit of a file name.
        target = log.directory.with_name(f"{uuid.uuid4().hex}{DELETE_SUFFIX}")
        os.replace(log.directory, target)
        fsync_dir(self.data_dir)
        shutil.rmtree(target, ignore_errors=True)

    def release_waiters(self) -> None:
        """Answer every long-poll now (the broker is about to stop)."""
        for p in self._partitions.values():
            p.release_waiters()

    async def update_config(self, topic: str, config: LogConfig) -> None:
        """Apply ``config`` to every open log of ``topic``, in the fsync pool: each log takes
        its partition lock, which a worker may hold across an fsync."""
        logs = [p.log for (t, _), p in self._partitions.items() if t == topic]
        await executors.run(self.pools.fsync, _update_configs, logs, config)

    # -- background work -------------------------------------------------------------------------

    async def _flusher(self) -> None:
        """Flush every partition whose ``flush.ms`` has passed since its last flush."""
        while True:
            await asyncio.sleep(self.flush_check_interval_ms / 1000)
            await self.flush_due()

    async def flush_due(self) -> int:
        """Flush the partitions whose ``flush.ms`` passed; a failure takes the directory
        offline (logged there, once) and ends the pass."""
        if self.log_dir.offline:
            return 0
        now = self.clock.monotonic_ms()
        due = [
            p
            for p in self._partitions.values()
            if p.log.unflushed_records > 0 and now - p.last_flush_ms >= p.log.config.flush_ms
        ]
        for p in due:
            try:
                await p.sync(p.log_end_offset)
            except KafkaStorageError:
                if self.log_dir.offline:
                    break  # logged once by the directory; the rest would fail alike
        return len(due)

    async def _janitor(self) -> None:
        last_checkpoint = self.clock.monotonic_ms()
        while True:
            await asyncio.sleep(self.retention_check_interval_ms / 1000)
            if self.log_dir.offline:
                continue  # nothing more may be written to a failed directory
            try:
                await self.run_retention()
                if self.clock.monotonic_ms() - last_checkpoint >= self.checkpoint_interval_ms:
                    await self.write_checkpoints()
                    last_checkpoint = self.clock.monotonic_ms()
            except Exception:  # one bad pass must not stop retention for good
                log.exception("retention/checkpoint pass failed; retrying next interval")

    async def _cleaner(self) -> None:
        """Compaction on its own cadence (Kafka's cleaner thread): a pass over the compacted
        logs that are due, then ``log.cleaner.backoff.ms`` before looking again."""
        while True:
            try:
                await self.run_cleaner()
            except Exception:  # one bad pass must not stop compaction for good
                log.exception("compaction pass failed; retrying after the backoff")
            await asyncio.sleep(self.cleaner_backoff_ms / 1000)

    async def run_retention(self) -> list[RetentionResult]:
        """One retention, ``segment.ms`` and producer-expiry pass over every partition."""
        results: list[RetentionResult] = []
        if self.log_dir.offline:
            return results
        for p in list(self._partitions.values()):
            await executors.run(self.pools.fsync, p.log.roll_if_expired)
            results.append(await executors.run(self.pools.fsync, p.log.apply_retention))
            # It takes the partition lock, which a roll or a compaction swap may hold: not on
            # the loop.
            await executors.run(
                self.pools.fsync, p.log.expire_producers, self.producer_id_expiration_ms
            )
        return results

    async def run_cleaner(self) -> list[CleanResult]:
        """One compaction pass over every compacted partition that is due, dirtiest first."""
        if self.log_dir.offline:
            return []
        now = self.clock.now_ms()
        due: list[tuple[float, Partition]] = []
        for p in list(self._partitions.values()):
            ratio = await executors.run(self.pools.compaction, cleaning_priority, p.log, now)
            if ratio is not None:
                due.append((ratio, p))
        due.sort(key=lambda item: -item[0])
        results = []
        for _, p in due:
            if p.released:
                continue
            result = await executors.run(
                self.pools.compaction,
                p.log.clean,
                now,
                max_keys=self.cleaner_max_keys,
                throttle_bytes_per_s=self.cleaner_io_bytes_per_s,
            )
            if result is not None:
                results.append(result)
        return results

    async def write_checkpoints(self) -> int:
        """Write the checkpoint of every partition whose offsets changed; return how many."""
        written = 0
        if self.log_dir.offline:
            return written
        for p in list(self._partitions.values()):
            state = (p.log.recovery_point, p.high_watermark, p.log_start_offset)
            if state != p.checkpointed:
                await executors.run(self.pools.fsync, p.log.write_checkpoint)
                p.checkpointed = state
                written += 1
        return written


def _update_configs(logs: list[PartitionLog], config: LogConfig) -> None:
    for log in logs:
        log.update_config(config)
