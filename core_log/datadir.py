"""One broker per data directory: an exclusive ``flock`` on ``{data_dir}/.lock``.

Two brokers on one directory both hand out the same offsets and overwrite records the other
acknowledged, so the lock is taken before anything in the directory is read or written (the
clean-shutdown marker, the metadata database, partition directories) and held until the
process closes the directory or exits; the kernel drops it when the process dies, so a
SIGKILLed broker leaves no stale lock. The holder writes its pid into the file so the loser can
name it. ``flock`` is advisory and per open file: it protects against another process (or
another :class:`DataDirLock` in this one), not against a user editing files by hand; on NFS it
is emulated with byte-range locks, which is enough for one host.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

from .errors import ErrorCode, LogbusError

LOCK_FILE = ".lock"
MAX_PID_BYTES = 32  # what is read back from a lock file to name its holder


class DataDirInUseError(LogbusError):
    """Another process holds the data directory's lock."""

    code = ErrorCode.KAFKA_STORAGE_ERROR


class DataDirLock:
    """The exclusive lock of one data directory; :meth:`acquire` never blocks."""

    def __init__(self, data_dir: Path | str) -> None:
        self.data_dir = Path(data_dir)
        self.path = self.data_dir / LOCK_FILE
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        """Create the directory if needed and lock it; raise :class:`DataDirInUseError` at once
        if another holder has it. Idempotent for the holder."""
        if self._fd is not None:
            return
        self.data_dir.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_pid(fd)
            os.close(fd)
            by = f" by pid {holder}" if holder else ""
            raise DataDirInUseError(
                f"data directory {self.data_dir.resolve()} is in use{by}: "
                "one broker per data directory",
                data_dir=str(self.data_dir.resolve()),
                pid=holder,
            ) from None
        except BaseException:
            os.close(fd)
            raise
        with contextlib.suppress(OSError):  # the pid is a courtesy; a full disk must not stop us
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        """Unlock (the file stays: removing it would race with a new holder)."""
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        os.close(fd)  # closing the only descriptor drops the flock

    def __enter__(self) -> DataDirLock:
        self.acquire()
        return self

    def __exit__(self, *_: object) -> None:
        self.release()


def _read_pid(fd: int) -> int | None:
    try:
        text = os.pread(fd, MAX_PID_BYTES, 0).decode("ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return int(text) if text.isdigit() else None
