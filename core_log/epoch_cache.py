"""Leader-epoch cache of one partition: which leader epoch started at which offset (KIP-101).

Entries ``(epoch, start_offset)`` with both strictly increasing. A follower asks the leader for
``end_offset_for_epoch(e)`` — the first offset *not* written in epoch ``e`` or any earlier
epoch — and truncates its log there, so divergent suffixes are found by epoch, never by the
high watermark. Persisted as ``leader-epoch-checkpoint`` (Kafka's text format: version, count,
then one ``epoch start_offset`` line per entry), written atomically.

Pure in-memory logic plus load/store; threading: under the owning log's lock.
"""

from __future__ import annotations

import bisect
from pathlib import Path

from .checkpoint import write_atomic
from .errors import KafkaStorageError

UNDEFINED_EPOCH = -1
UNDEFINED_OFFSET = -1
_VERSION = 0


class LeaderEpochCache:
    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self._epochs: list[int] = []
        self._offsets: list[int] = []

    @property
    def entries(self) -> list[tuple[int, int]]:
        return list(zip(self._epochs, self._offsets, strict=True))

    @property
    def latest_epoch(self) -> int:
        return self._epochs[-1] if self._epochs else UNDEFINED_EPOCH

    def assign(self, epoch: int, start_offset: int) -> bool:
        """Record that ``epoch`` began at ``start_offset``. Returns True if the cache changed.

        An epoch that is not newer than the latest is ignored. A new entry whose start offset is
        not beyond earlier ones replaces them (a new leader overwrote those offsets).
        """
        if epoch < 0 or (self._epochs and epoch <= self._epochs[-1]):
            return False
        while self._offsets and self._offsets[-1] >= start_offset:
            self._epochs.pop()
            self._offsets.pop()
        self._epochs.append(epoch)
        self._offsets.append(start_offset)
        return True

    def end_offset_for_epoch(self, epoch: int, log_end_offset: int) -> tuple[int, int]:
        """(largest known epoch <= ``epoch``, end offset of that epoch), as Kafka answers.

        The latest epoch ends at the log end offset; an older epoch ends where the next one
        starts; an epoch older than every entry answers (UNDEFINED_EPOCH, UNDEFINED_OFFSET).
        """
        if not self._epochs:
            return UNDEFINED_EPOCH, UNDEFINED_OFFSET
        if epoch == self._epochs[-1]:
            return epoch, log_end_offset
        i = bisect.bisect_right(self._epochs, epoch)
        if i == 0:
            return UNDEFINED_EPOCH, UNDEFINED_OFFSET
        if i == len(self._epochs):
            return self._epochs[-1], log_end_offset
        return self._epochs[i - 1], self._offsets[i]

    def epoch_for_offset(self, offset: int) -> int:
        i = bisect.bisect_right(self._offsets, offset) - 1
        return self._epochs[i] if i >= 0 else UNDEFINED_EPOCH

    def truncate_from_end(self, end_offset: int) -> bool:
        """Drop entries whose start offset is at or past ``end_offset`` (log truncated)."""
        changed = False
        while self._offsets and self._offsets[-1] >= end_offset:
            self._epochs.pop()
            self._offsets.pop()
            changed = True
        return changed

    def truncate_from_start(self, start_offset: int) -> bool:
        """Drop entries wholly below ``start_offset``; the epoch covering it starts there."""
        i = bisect.bisect_right(self._offsets, start_offset) - 1
        if i < 0 or (i == 0 and self._offsets[0] == start_offset):
            return False
        del self._epochs[:i]
        del self._offsets[:i]
        self._offsets[0] = start_offset
        return True

    def clear(self) -> None:
        self._epochs.clear()
        self._offsets.clear()

    # -- persistence ---------------------------------------------------------------------------

    def load(self) -> None:
        assert self.path is not None
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return
        try:
            lines = raw.decode().split("\n")
            version, count = int(lines[0]), int(lines[1])
            if version != _VERSION:
                raise ValueError(f"version {version}")
            pairs = [tuple(map(int, line.split())) for line in lines[2 : 2 + count]]
            if len(pairs) != count or any(len(p) != 2 for p in pairs):
                raise ValueError("entry count mismatch")
        except (ValueError, IndexError) as e:  # UnicodeDecodeError is a ValueError
            raise KafkaStorageError(f"corrupt leader epoch checkpoint {self.path}: {e}") from e
        self.clear()
        for epoch, offset in pairs:
            self.assign(epoch, offset)

    def store(self) -> None:
        assert self.path is not None
        body = "".join(f"{e} {o}\n" for e, o in self.entries)
        write_atomic(self.path, f"{_VERSION}\n{len(self._epochs)}\n{body}".encode())
