"""A broker-wide bound on open segment files.

Every segment opens its ``.log`` through :meth:`HandleCache.use`, which keeps at most
``max_open`` descriptors besides the pinned ones (one per partition: its active segment),
closing the least recently used idle one when a new one is needed.
A descriptor in use (a read or write in progress, counted under the cache's lock) or pinned
(the active segment of a partition) is never closed, so a thread never reads through a
descriptor that was closed and reused under it. Closing a handle in use (a segment deleted by
retention while a flush syncs it outside the log's lock) retires it: the last user closes the
descriptor, and a retired handle is never opened again (its file may be gone).
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from .limits import DEFAULT_MAX_OPEN_SEGMENT_HANDLES


class Handle:
    """The descriptor slot of one file; owned by a segment, managed by a cache."""

    __slots__ = ("_fd", "_users", "path", "pinned", "retired")

    def __init__(self, path: Path) -> None:
        self.path = path
        self.pinned = False
        self.retired = False
        self._fd: int | None = None
        self._users = 0


class RetiredHandleError(OSError):
    """The handle's segment was closed or deleted; its file is not to be opened again."""


class HandleCache:
    def __init__(self, max_open: int = DEFAULT_MAX_OPEN_SEGMENT_HANDLES) -> None:
        assert max_open >= 1
        self.max_open = max_open
        self._lock = threading.Lock()
        self._open: OrderedDict[Handle, None] = OrderedDict()  # evictable, LRU first
        self._pinned: set[Handle] = set()

    @property
    def open_count(self) -> int:
        """Open descriptors, pinned ones included."""
        with self._lock:
            return len(self._open) + sum(1 for h in self._pinned if h._fd is not None)

    @contextmanager
    def use(self, h: Handle) -> Iterator[int]:
        """The open descriptor of ``h`` for the duration of the block."""
        with self._lock:
            if h.retired:
                raise RetiredHandleError(f"{h.path.name} is closed")
            if h._fd is None:
                h._fd = os.open(h.path, os.O_RDWR | os.O_CREAT, 0o644)
            h._users += 1
            if not h.pinned:
                self._open[h] = None
                self._open.move_to_end(h)
                self._evict()
            fd = h._fd
        try:
            yield fd
        finally:
            with self._lock:
                h._users -= 1
                if h.retired and h._users == 0:
                    self._close_fd(h)

    def pin(self, h: Handle, pinned: bool) -> None:
        """Keep ``h`` open (the active segment) or let it be evicted again. Pinned handles stay
        out of the LRU, so eviction never walks past them: with 10,000 partitions, every
        ``use`` walked 10,000 pinned handles before this (creating them was quadratic)."""
        with self._lock:
            if h.retired:
                return
            h.pinned = pinned
            if pinned:
                self._pinned.add(h)
                self._open.pop(h, None)
                return
            self._pinned.discard(h)
            if h._fd is not None:
                self._open[h] = None
                self._evict()

    def close(self, h: Handle) -> None:
        """Retire ``h``: closed now, or by its last user if it is in use."""
        with self._lock:
            h.retired = True
            h.pinned = False
            self._pinned.discard(h)
            self._open.pop(h, None)
            if h._users == 0:
                self._close_fd(h)

    @staticmethod
    def _close_fd(h: Handle) -> None:
        if h._fd is not None:
            os.close(h._fd)
            h._fd = None

    def _evict(self) -> None:
        while len(self._open) > self.max_open:
            victim = next((v for v in self._open if v._users == 0 and not v.pinned), None)
            if victim is None:
                return  # everything is busy or pinned: go over the bound rather than block
            del self._open[victim]
            assert victim._fd is not None
            os.close(victim._fd)
            victim._fd = None
