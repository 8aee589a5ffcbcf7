"""Injected time. Core code asks a :class:`Clock`; it never calls ``time.time()`` itself."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now_ms(self) -> int:
        """Wall-clock milliseconds since the epoch (record timestamps, retention)."""
        ...

    def monotonic_ms(self) -> float:
        """Monotonic milliseconds (intervals, timeouts)."""
        ...


class SystemClock:
    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def monotonic_ms(self) -> float:
        return time.monotonic_ns() / 1_000_000


class ManualClock:
    """A clock that moves only when a test says so."""

    def __init__(self, now_ms: int = 1_700_000_000_000) -> None:
        self._now_ms = now_ms
        self._mono_ms = 0.0

    def now_ms(self) -> int:
        return self._now_ms

    def monotonic_ms(self) -> float:
        return self._mono_ms

    def advance(self, ms: int) -> None:
        assert ms >= 0, "time never goes back"
        self._now_ms += ms
        self._mono_ms += ms
