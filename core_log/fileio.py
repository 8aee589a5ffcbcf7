"""The calls core_log makes to write, sync and cut files: one seam for injecting disk faults.

Segments, indexes and checkpoints write through :data:`ops` instead of calling ``os`` directly,
so a test can swap in a :class:`FileOps` subclass (:func:`injected`) that makes the N-th write
fail with ``ENOSPC`` or the next fsync with ``EIO``, or blocks an fsync until told to go on —
the faults a real disk produces and a test machine does not. Production uses :class:`FileOps`
itself: one attribute lookup and one method call more per write or sync (well under 1 µs, next
to the ≥ 5 µs of the system call).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from _typeshed import ReadableBuffer as Buffer


class FileOps:
    """Thin wrappers of the ``os`` calls, same signatures and errors."""

    def pwritev(self, fd: int, buffers: Sequence[Buffer], offset: int) -> int:
        return os.pwritev(fd, buffers, offset)

    def pwrite(self, fd: int, data: Buffer, offset: int) -> int:
        return os.pwrite(fd, data, offset)

    def write(self, fd: int, data: Buffer) -> int:
        return os.write(fd, data)

    def fsync(self, fd: int) -> None:
        os.fsync(fd)

    def fdatasync(self, fd: int) -> None:
        os.fdatasync(fd)

    def ftruncate(self, fd: int, length: int) -> None:
        os.ftruncate(fd, length)


ops = FileOps()


@contextmanager
def injected(replacement: FileOps) -> Iterator[FileOps]:
    """Use ``replacement`` for every file call of core_log inside the block (tests only)."""
    global ops
    previous, ops = ops, replacement
    try:
        yield replacement
    finally:
        ops = previous
