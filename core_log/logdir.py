"""The health of one log directory: online, or offline after a storage failure (Kafka's rule).

After a failed fsync Linux may report the next fsync of the same file as successful although
the dirty pages it could not write are gone, so nothing written before the failure can be
trusted to be on disk. Kafka therefore takes the whole log directory offline on an I/O error:
every partition in it answers KAFKA_STORAGE_ERROR (retriable: a client may find the data on
another replica, or here after a restart) until the broker restarts and recovers the logs from
their last checkpoints. Logbus does the same, with one exception a single broker needs: an
append that finds the disk full and is undone cleanly (:class:`~core_log.errors.StorageFullError`)
fails only itself, so a full disk stalls producers instead of taking the broker down, and they
resume once space is freed.

The first failure is logged once, at ERROR, with its cause; every storage error is counted.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

from .errors import KafkaStorageError, StorageFullError
from .handles import RetiredHandleError

log = logging.getLogger("logbus.storage")


class LogDirectory:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.offline_cause: str | None = None
        self.storage_errors = 0  # every storage error, offline or not (a metric)
        self.on_offline: list[Callable[[], None]] = []  # told once, when the directory fails

    @property
    def offline(self) -> bool:
        return self.offline_cause is not None

    def check(self) -> None:
        """Raise KAFKA_STORAGE_ERROR if the directory is offline."""
        if self.offline_cause is not None:
            raise self.offline_error()

    def offline_error(self) -> KafkaStorageError:
        """What a partition of this offline directory raises."""
        return KafkaStorageError(
            f"log directory {self.path} is offline after a storage error "
            f"({self.offline_cause}); restart the broker to recover it",
            log_dir=str(self.path),
        )

    def failed(self, error: BaseException) -> BaseException:
        """Account for ``error`` raised by a log operation and return what to raise instead.

        A storage error (``KafkaStorageError`` or ``OSError``) takes the directory offline,
        except a cleanly undone full-disk append; anything else passes through untouched.
        """
        if isinstance(error, StorageFullError):
            self.storage_errors += 1
            return error
        if isinstance(error, RetiredHandleError) or not isinstance(
            error, KafkaStorageError | OSError
        ):
            return error
        self.storage_errors += 1
        if self.offline_cause is None:
            self.offline_cause = str(error)
            log.error(
                "log directory %s is offline: %s; its partitions answer KAFKA_STORAGE_ERROR "
                "until the broker is restarted",
                self.path,
                error,
            )
            for listener in self.on_offline:
                listener()
        return self.offline_error()
