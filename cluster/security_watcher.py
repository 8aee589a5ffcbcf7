"""Learn security changes (users, keys, ACLs, quotas, cluster secrets) within a second.

Theory of operation
-------------------
Every change to the security tables bumps one counter, ``security_version``
(``cluster/security_store.py``). A :class:`SecurityWatcher` reads that counter every
``poll_interval_ms`` (250 ms by default: one indexed single-row read, 4 a second per broker,
nothing for PostgreSQL) and, when it moved, reads a whole :class:`SecuritySnapshot` and hands it
to ``on_change`` on the event loop. A revocation is thus in force on every broker within a poll
interval plus one snapshot read: about 0.3 s, inside the issue's one second.

Store calls are synchronous, so each runs in a worker thread (``asyncio.to_thread``), one at a
time: a slow database delays the next poll instead of piling up threads. A failing read (the
database restarting: ``KAFKA_STORAGE_ERROR``) or a failing callback is logged and retried on
the next tick; the last good snapshot stays in force meanwhile, and :attr:`stale_for_s` says
for how long, so the caller can choose to fail closed after an outage of its choosing. Errors
are logged when they start, then at most every :data:`ERROR_LOG_EVERY_S` seconds, and on
recovery, so an outage does not write four lines a second.

The snapshot's own version is the one remembered (not the counter read before it), so a change
committed between the two reads is never missed: at worst it is loaded twice.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Final, Protocol

from .security_store import SecuritySnapshot

log = logging.getLogger(__name__)

POLL_INTERVAL_MS_DEFAULT: Final = 250  # changes reach every broker well within a second
ERROR_LOG_EVERY_S: Final = 30.0  # a store outage logs once, then this often, then recovery


class SecuritySource(Protocol):
    """What the watcher reads (a :class:`~cluster.security_store.SecurityStore`)."""

    def version(self) -> int: ...

    def snapshot(self) -> SecuritySnapshot: ...


class SecurityWatcher:
    """Calls ``on_change(snapshot)`` (on the event loop) whenever the security state changed.

    ``await watcher.refresh()`` once at start-up (it raises if the store cannot be read, so a
    broker does not serve without its ACLs), then ``watcher.start()``; ``await
    watcher.stop()`` at shutdown. ``on_change`` should be quick: build heavy indexes with
    ``asyncio.to_thread`` inside it if needed (then make it a coroutine function)."""

    def __init__(
        self,
        source: SecuritySource,
        on_change: Callable[[SecuritySnapshot], object],
        *,
        poll_interval_ms: int = POLL_INTERVAL_MS_DEFAULT,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if poll_interval_ms <= 0:
            raise ValueError("poll_interval_ms must be > 0")
        self._source = source
        self._on_change = on_change
        self._interval_s = poll_interval_ms / 1000
        self._clock = clock
        self.snapshot: SecuritySnapshot | None = None  # the one last handed to on_change
        self.failures = 0  # consecutive failed polls
        self.polls = 0  # version reads made (tests bound propagation in polls, not seconds)
        self._last_success: float | None = None
        self._last_error_log: float | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def stale_for_s(self) -> float | None:
        """Seconds since the store was last read successfully (None: never)."""
        if self._last_success is None:
            return None
        return self._clock() - self._last_success

    async def refresh(self) -> SecuritySnapshot:
        """Load a snapshot now and hand it to ``on_change``; errors propagate."""
        snapshot = await asyncio.to_thread(self._source.snapshot)
        await self._deliver(snapshot)
        return snapshot

    async def poll_once(self) -> bool:
        """One tick: reload if the version moved. True if ``on_change`` was called; errors
        propagate (:meth:`run` logs them)."""
        version = await asyncio.to_thread(self._source.version)
        self.polls += 1
        if self.snapshot is not None and version == self.snapshot.version:
            self._last_success = self._clock()
            return False
        await self.refresh()
        return True

    async def run(self) -> None:
        """Poll until cancelled, surviving store and callback errors."""
        while True:
            try:
                await self.poll_once()
            except Exception as e:
                self._failed(e)
            else:
                self._recovered()
            await asyncio.sleep(self._interval_s)

    def start(self) -> asyncio.Task[None]:
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self.run(), name="security-watcher")
        return self._task

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _deliver(self, snapshot: SecuritySnapshot) -> None:
        # A refresh after a local change and a poll may read the store concurrently and
        # finish in either order: an older snapshot delivered last would undo the change (a
        # revocation) until the next poll. Versions only grow, so an older one is dropped.
        if self.snapshot is not None and snapshot.version < self.snapshot.version:
            return
        result = self._on_change(snapshot)
        if asyncio.iscoroutine(result):
            await result
        self.snapshot = snapshot  # only once delivered: a failed callback is retried
        self._last_success = self._clock()

    def _failed(self, error: Exception) -> None:
        self.failures += 1
        now = self._clock()
        last = self._last_error_log
        if last is None or now - last >= ERROR_LOG_EVERY_S:
            self._last_error_log = now
            log.warning(
                "security state not refreshed (%d failed polls; keeping version %s): %s",
                self.failures,
                None if self.snapshot is None else self.snapshot.version,
                error,
                exc_info=self.failures == 1,
            )

    def _recovered(self) -> None:
        if self.failures:
            log.info("security state refreshed again after %d failed polls", self.failures)
        self.failures = 0
        self._last_error_log = None
