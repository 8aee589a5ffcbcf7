"""Byte budgets shared by every connection: request bodies, answers and pushes in flight.

Theory of operation
-------------------
Per-request caps alone do not bound a broker: 64 MiB per body times 10,000 connections is 640 GB,
and 20 clients that never read a 64 MiB fetch pinned 1.4 GB. So the bytes a broker holds on
behalf of clients are counted against three global budgets (settings, all in bytes):

* ``max_inflight_body_bytes`` (256 MiB): request bodies being read. A request counts each
  chunk of its body as it arrives and gives them all back when its answer is sent. No room:
  ``503`` with ``Retry-After`` (:class:`BodyGuard`). Bytes are counted as they arrive, not as
  declared: a slow upload that declares 64 MiB and sends 1 KiB holds 1 KiB (and is cut off
  after ``body_timeout_ms``), so slow clients cannot lock others out by declaring much.
* ``max_inflight_response_bytes`` (256 MiB): produce/fetch answers built and not yet handed to
  the socket. No room: ``503`` with ``Retry-After`` instead of the answer — before the read
  when the fetch's ``max_bytes`` would not fit, else once the answer is built (it is dropped).
* ``max_queued_stream_bytes`` (128 MiB): reads a WebSocket or SSE stream has made and not yet
  sent. A stream waits for room (it holds nothing while it waits); a client that never reads
  its socket holds one read until it is closed (``send_timeout_ms`` for SSE, the WebSocket
  ping timeout for WebSockets).

A budget admits one reservation larger than the budget when nothing else is reserved, so the
largest request a client may send never waits forever; the settings keep each budget at least
as large as the per-request cap anyway.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from core_log.errors import ErrorCode, LogbusError

from .connections import ConnectionGate
from .problems import PROBLEM_JSON, payload_too_large, problem_bytes
from .settings import Settings

RETRY_AFTER_S = 1  # what a 503 for an exhausted budget asks a client to wait


class ByteBudget:
    """Bytes reserved against a cap; sans-I/O apart from :meth:`wait_reserve`."""

    def __init__(self, name: str, cap_bytes: int) -> None:
        self.name = name
        self.cap_bytes = cap_bytes
        self.used_bytes = 0
        self._waiters: list[asyncio.Future[None]] = []

    def try_reserve(self, n: int) -> bool:
        """Reserve ``n`` bytes if they fit (or if nothing is reserved); False otherwise."""
        if n <= 0:
            return True
        if self.used_bytes and self.used_bytes + n > self.cap_bytes:
            return False
        self.used_bytes += n
        return True

    def fits(self, n: int) -> bool:
        """Whether ``n`` bytes would be admitted now (nothing is reserved)."""
        return not self.used_bytes or self.used_bytes + n <= self.cap_bytes

    def release(self, n: int) -> None:
        """Give back ``n`` reserved bytes; whoever waits for room tries again."""
        if n <= 0:
            return
        assert n <= self.used_bytes, (n, self.used_bytes)
        self.used_bytes -= n
        waiters, self._waiters = self._waiters, []
        for w in waiters:
            if not w.done():
                w.set_result(None)

    async def wait_reserve(self, n: int) -> None:
        """Reserve ``n`` bytes, waiting (without holding anything) until they fit."""
        while not self.try_reserve(n):
            waiter = asyncio.get_running_loop().create_future()
            self._waiters.append(waiter)
            await waiter

    @asynccontextmanager
    async def held(self, n: int) -> AsyncIterator[None]:
        """Hold ``n`` bytes for the body of the ``async with``."""
        await self.wait_reserve(n)
        try:
            yield
        finally:
            self.release(n)


@dataclass
class Budgets:
    """The broker's three byte budgets and its connection gate (shown in /metrics)."""

    body: ByteBudget
    response: ByteBudget
    stream: ByteBudget
    gate: ConnectionGate

    @classmethod
    def from_settings(cls, settings: Settings, max_connections: int | None = None) -> Budgets:
        """``max_connections``: the cap in force (the setting clamped to the open-file limit)."""
        return cls(
            body=ByteBudget("request bodies", settings.max_inflight_body_bytes),
            response=ByteBudget("answers", settings.max_inflight_response_bytes),
            stream=ByteBudget("stream reads", settings.max_queued_stream_bytes),
            gate=ConnectionGate(max_connections or settings.max_connections),
        )


def budget_exhausted(budget: ByteBudget) -> LogbusError:
    return LogbusError(
        f"the broker holds {budget.used_bytes} bytes of {budget.name} in flight "
        f"(cap {budget.cap_bytes}); retry after {RETRY_AFTER_S} s",
        code=ErrorCode.BROKER_BUSY,
    )


class BodyGuard:
    """ASGI middleware: every HTTP request body is at most ``max_body_bytes`` (413) and counts
    against the body budget (503 + ``Retry-After``). (A body that stops arriving is answered
    408 by the protocol, :mod:`api.connections`.)

    On any of these the guard answers itself (problem+json with ``Connection: close``, as the
    rest of the body is never read), tells the app the client went away, and drops whatever
    the app then tries to send.
    """

    def __init__(self, app: ASGIApp, budget: ByteBudget, max_body_bytes: int) -> None:
        self.app = app
        self.budget = budget
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request = _GuardedRequest(self, scope, receive, send)
        try:
            await self.app(scope, request.receive, request.send)
        except Exception:
            if not (request.answered or request.vanished):
                raise  # an app's error once its client left mid-body is no error
        finally:
            self.budget.release(request.reserved)


class _GuardedRequest:
    __slots__ = (
        "_receive",
        "_send",
        "answered",
        "body_done",
        "declared",
        "guard",
        "reserved",
        "started",
        "vanished",
    )

    def __init__(self, guard: BodyGuard, scope: Scope, receive: Receive, send: Send) -> None:
        self.guard = guard
        self._receive = receive
        self._send = send
        self.reserved = 0
        self.declared: int | None = _content_length(scope)
        self.body_done = False
        self.answered = False  # the guard sent its own answer; the app's is dropped
        self.vanished = False  # the client went away before its body was read
        self.started = False  # the app started its answer

    async def receive(self) -> Message:
        if self.answered:
            return {"type": "http.disconnect"}
        if self.body_done:
            return await self._receive()
        limit = self.guard.max_body_bytes
        if self.declared is not None and self.declared > limit:
            return await self._refuse(413, payload_too_large(limit))
        message = await self._receive()
        if message["type"] != "http.request":
            self.vanished = True  # mid-body (or a body timeout, api/connections.py)
            return message
        if not message.get("more_body", False):
            self.body_done = True
        size = len(message.get("body", b""))
        if size:
            if self.reserved + size > limit:
                return await self._refuse(413, payload_too_large(limit))
            if not self.guard.budget.try_reserve(size):
                return await self._refuse(503, budget_exhausted(self.guard.budget))
            self.reserved += size
        return message

    def send(self, message: Message) -> Awaitable[None]:
        """The app's ``send``: not a coroutine of its own (a frame each message of every
        answer passes through), it hands back the server's."""
        if self.answered:
            return _dropped()
        self.started = True
        return self._send(message)

    async def _refuse(self, status: int, error: LogbusError) -> Message:
        if not self.started:
            self.answered = True
            await _answer(self._send, status, error)
        return {"type": "http.disconnect"}


async def _dropped() -> None:
    """What the app awaits for a message sent after the guard answered: nothing."""


async def _answer(send: Send, status: int, error: LogbusError) -> None:
    body = problem_bytes(error)
    headers = [
        (b"content-type", PROBLEM_JSON.encode()),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),
    ]
    if status == 503:
        headers.append((b"retry-after", str(RETRY_AFTER_S).encode()))
    start: dict[str, Any] = {"type": "http.response.start", "status": status, "headers": headers}
    await send(start)
    await send({"type": "http.response.body", "body": body})


def _content_length(scope: Scope) -> int | None:
    for k, v in scope["headers"]:
        if k == b"content-length":
            return int(v) if v.isdigit() else None
    return None
