"""Deterministic disk faults through core_log's file seam (:mod:`core_log.fileio`)."""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from core_log import fileio

GATE_TIMEOUT_S = 30.0  # a blocked fsync that is never released fails the test, not hangs it


def fd_path(fd: int) -> str:
    return os.readlink(f"/proc/self/fd/{fd}")


class FaultyFiles(fileio.FileOps):
    """Fails chosen calls the way a failing or full disk does.

    * ``write_errors``: errnos for the next segment data writes (``pwritev``/``pwrite``), in
      order; ``None`` lets a write through.
    * ``index_write_errors``: the same for plain ``write`` (index files, checkpoints).
    * ``datasync_errors``: errnos for the next segment fsyncs (``fdatasync``) whose file path
      contains ``datasync_match``.
    * ``truncate_error``: an errno for every ``ftruncate``.
    * ``gate``: when set, the same segment fsyncs wait for it (and count in
      ``datasyncs_waiting``).
    """

    def __init__(self) -> None:
        self.write_errors: list[int | None] = []
        self.index_write_errors: list[int | None] = []
        self.datasync_errors: list[int | None] = []
        self.datasync_match = ""
        self.truncate_error: int | None = None
        self.gate: threading.Event | None = None
        self.datasyncs_waiting = threading.Semaphore(0)
        self.datasyncs = 0

    def wait_for_datasync(self) -> None:
        """Block until one gated fsync has started (call it through ``asyncio.to_thread``)."""
        assert self.datasyncs_waiting.acquire(timeout=GATE_TIMEOUT_S), "no fsync started"

    def pwritev(self, fd: int, buffers: Any, offset: int) -> int:
        self._maybe_fail(self.write_errors)
        return super().pwritev(fd, buffers, offset)

    def pwrite(self, fd: int, data: Any, offset: int) -> int:
        self._maybe_fail(self.write_errors)
        return super().pwrite(fd, data, offset)

    def write(self, fd: int, data: Any) -> int:
        self._maybe_fail(self.index_write_errors)
        return super().write(fd, data)

    def fdatasync(self, fd: int) -> None:
        if self.datasync_match in fd_path(fd):
            if self.gate is not None:
                self.datasyncs_waiting.release()
                assert self.gate.wait(GATE_TIMEOUT_S), "fsync gate never opened"
            self._maybe_fail(self.datasync_errors)
        self.datasyncs += 1
        super().fdatasync(fd)

    def ftruncate(self, fd: int, length: int) -> None:
        if self.truncate_error is not None:
            raise OSError(self.truncate_error, os.strerror(self.truncate_error))
        super().ftruncate(fd, length)

    @staticmethod
    def _maybe_fail(plan: list[int | None]) -> None:
        if plan:
            code = plan.pop(0)
            if code is not None:
                raise OSError(code, os.strerror(code))


@contextmanager
def faulty_files() -> Iterator[FaultyFiles]:
    with fileio.injected(FaultyFiles()) as files:
        assert isinstance(files, FaultyFiles)
        yield files


ENOSPC = errno.ENOSPC
EIO = errno.EIO
EDQUOT = errno.EDQUOT
