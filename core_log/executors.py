"""Named worker pools for storage work, so that one kind of work cannot starve another.

Theory of operation
-------------------
asyncio's default executor is one pool for everything (``min(32, cpus + 4)`` = 6 threads on
this 2-core machine): six slow fsyncs (a loaded disk: 20-200 ms each), or one compaction pass
copying a 1 GiB segment, and every large read, off-loop append and timestamp lookup queues
behind them. Each kind of storage work gets its own small pool instead:

* ``fsync``: log flushes (the group commit runs one per partition at a time), checkpoints,
  segment rolls with their producer snapshot, retention (file deletion and the checkpoint it
  writes), opening and closing logs. Fsyncs of one disk serialise in the kernel anyway; a few
  workers let one partition's flush start while another's waits.
* ``compaction``: the cleaner — one pass at a time, as Kafka's default ``log.cleaner.threads``
  = 1; it may hold a worker for seconds.
* ``reads``: reads of ``OFF_LOOP_IO_BYTES`` or more, small reads while the partition lock is
  busy, and timestamp lookups (which decode batches).
* ``appends``: appends that cannot run inline (large, rolling a segment, or the lock busy).

:meth:`StorageExecutors.shutdown` stops them when the log manager closes; work submitted after
that fails with a retriable :class:`~core_log.errors.KafkaStorageError`.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import ParamSpec, TypeVar

from .errors import KafkaStorageError

FSYNC_WORKERS = 4  # the flusher, group commits of a few hot partitions, a checkpoint pass
COMPACTION_WORKERS = 1  # Kafka's log.cleaner.threads default
READ_WORKERS = 4  # page-cache copies of up to 64 MiB; more would only contend for 2 cores
APPEND_WORKERS = 2  # appends of one partition are serialised; two partitions in parallel

P = ParamSpec("P")
T = TypeVar("T")


class StorageExecutors:
    """The four pools; create one per :class:`~core_log.manager.LogManager`."""

    def __init__(self) -> None:
        self.fsync = ThreadPoolExecutor(FSYNC_WORKERS, thread_name_prefix="logbus-fsync")
        self.compaction = ThreadPoolExecutor(
            COMPACTION_WORKERS, thread_name_prefix="logbus-compaction"
        )
        self.reads = ThreadPoolExecutor(READ_WORKERS, thread_name_prefix="logbus-reads")
        self.appends = ThreadPoolExecutor(APPEND_WORKERS, thread_name_prefix="logbus-appends")
        self.closed = False

    def shutdown(self) -> None:
        """Stop accepting work; running work finishes, idle threads exit (does not block)."""
        self.closed = True
        for pool in (self.fsync, self.compaction, self.reads, self.appends):
            pool.shutdown(wait=False)


async def run(pool: ThreadPoolExecutor, fn: Callable[P, T], /, *args: P.args, **kw: P.kwargs) -> T:
    """``fn(*args, **kw)`` in ``pool``; raises KafkaStorageError once the pool is shut down."""
    return await submit(pool, fn, *args, **kw)


def submit(
    pool: ThreadPoolExecutor, fn: Callable[P, T], /, *args: P.args, **kw: P.kwargs
) -> asyncio.Future[T]:
    """``fn(*args, **kw)`` handed to ``pool`` now (a worker may start it before the caller
    returns to the event loop); its outcome as an asyncio future. Raises KafkaStorageError
    once the pool is shut down."""
    loop = asyncio.get_running_loop()
    try:
        return loop.run_in_executor(pool, functools.partial(fn, *args, **kw))
    except RuntimeError as e:  # "cannot schedule new futures after shutdown"
        raise KafkaStorageError("the broker's storage is shutting down") from e
