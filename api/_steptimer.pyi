"""Type stub of the C extension api/_steptimer.c (twin: api.quota_gate._TimedPy)."""

from collections.abc import Coroutine, Generator
from typing import Any

class StepTimer:
    ns: int
    def __init__(self, coro: Coroutine[Any, Any, Any]) -> None: ...
    def so_far(self) -> int: ...
    def __await__(self) -> Generator[Any, Any, Any]: ...
