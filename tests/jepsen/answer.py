"""One HTTP call's answer as the Jepsen clients judge it (tests/jepsen/harness.py and the
consume-transform-produce loop, tests/jepsen/ctp_loop.py, which runs as its own small process
and so imports nothing heavier than this)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

# Error codes a client retries: the coordinator or a leader is moving or loading, a write was
# refused before it took effect, or a broker just restarted has not read the metadata yet.
RETRIABLE_CODES: Final = frozenset(
    {
        "CONCURRENT_TRANSACTIONS",
        "NOT_COORDINATOR",
        "COORDINATOR_LOAD_IN_PROGRESS",
        "COORDINATOR_NOT_AVAILABLE",
        "NOT_LEADER_OR_FOLLOWER",
        "LEADER_NOT_AVAILABLE",
        "NOT_ENOUGH_REPLICAS",
        "NOT_ENOUGH_REPLICAS_AFTER_APPEND",
        "NETWORK_EXCEPTION",
        "REQUEST_TIMED_OUT",
        "UNKNOWN_TOPIC_OR_PARTITION",
    }
)


@dataclass(frozen=True, slots=True)
class Answer:
    """One HTTP call's answer: ``status`` None when there was none (timeout, connection)."""

    status: int | None
    body: Any = None

    @property
    def code(self) -> str | None:
        code = self.body.get("code") if isinstance(self.body, dict) else None
        return code if isinstance(code, str) else None

    @property
    def ok(self) -> bool:
        return self.status is not None and 200 <= self.status < 300

    @property
    def lost(self) -> bool:
        """No answer, or one that does not say whether the call took effect."""
        return self.status is None or self.status >= 500

    @property
    def retriable(self) -> bool:
        if self.lost or self.status == 421:
            return True
        return (
            isinstance(self.body, dict) and self.body.get("retriable") is True
        ) or self.code in RETRIABLE_CODES

    @property
    def internal_error(self) -> bool:
        """A 500, or a 5xx without an error code: a bug, not an answer."""
        return self.status is not None and (
            self.status == 500 or (self.status >= 500 and self.code is None)
        )
