"""The access log: one line per request (or per sampled request), off by default.

A line is ``METHOD PATH STATUS DURATION_ms`` on the ``logbus.access`` logger, e.g.
``GET /v1/topics/clicks/partitions/0/records 200 0.8ms``. The path is logged without its query
string, which may carry credentials (a token in ``?access_token=``, as browsers must send for
WebSocket and EventSource). Duration runs from the request's arrival to the end of its answer
(for a long-poll, SSE or WebSocket: until it closes). WebSocket sessions log ``WS`` with 101
once accepted, or the status they were refused with.

``access_log`` (``LOGBUS_ACCESS_LOG``) is ``off``, ``on``, or a sample rate in (0, 1]: at
50,000 requests/s, one line each costs about a core in ``logging``; ``0.01`` keeps a
representative 1 %.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("logbus.access")


def parse_rate(raw: str) -> float:
    """``off`` → 0, ``on`` → 1, else a number in [0, 1]; ValueError otherwise."""
    value = raw.strip().lower()
    if value in ("off", "false", "0"):
        return 0.0
    if value in ("on", "true", "1"):
        return 1.0
    rate = float(value)
    if not 0.0 <= rate <= 1.0:
        raise ValueError(f"access_log must be off, on or a sample rate in [0, 1], got {raw!r}")
    return rate


class AccessLog:
    """ASGI middleware writing one access-log line per sampled HTTP request or WebSocket."""

    def __init__(
        self,
        app: ASGIApp,
        rate: float,
        *,
        clock: Callable[[], float] = time.perf_counter,
        sample: Callable[[], float] = random.random,
        logger: logging.Logger = log,
    ) -> None:
        self.app = app
        self.rate = rate
        self._clock = clock
        self._sample = sample
        self._log = logger

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind not in ("http", "websocket") or not (
            self.rate >= 1.0 or self._sample() < self.rate
        ):
            await self.app(scope, receive, send)
            return
        started = self._clock()
        status = 0

        async def watched(message: Message) -> None:
            nonlocal status
            t = message["type"]
            if t == "http.response.start":
                status = message["status"]
            elif t == "websocket.accept":
                status = 101
            elif t == "websocket.close" and status == 0:
                status = 403
            elif t == "websocket.http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, watched)
        finally:
            method = "WS" if kind == "websocket" else scope.get("method", "?")
            elapsed_ms = (self._clock() - started) * 1000
            # status 0: the app raised before answering (the server then answers 500)
            self._log.info(
                "%s %s %d %.1fms", method, scope.get("path", ""), status or 500, elapsed_ms
            )
